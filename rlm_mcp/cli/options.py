"""Command-line options shared by `rlm-mcp run` and `rlm-mcp eval`.

The run overrides are the fields of `service.limits.RunOverrides`, the same model whose annotated
types declare the MCP tools' parameters: one flag per field (`max_depth` -> `--max-depth`), typed
and described by the field, so a new override reaches the tools, `run` and `eval` alike.
"""

from __future__ import annotations

import argparse
import types
from typing import Any, Union, get_args, get_origin

from rlm_mcp.service.limits import RunOverrides


def _scalar(annotation: Any) -> type:
    """`int | None` -> int: what argparse converts the flag's text to."""
    if get_origin(annotation) in (Union, types.UnionType):
        (only,) = [a for a in get_args(annotation) if a is not type(None)]
        return _scalar(only)
    if not isinstance(annotation, type):
        raise AssertionError(f"a run override must be a plain scalar, not {annotation!r}")
    return annotation


def add_override_options(parser: argparse.ArgumentParser) -> None:
    """`--max-iterations`, `--max-depth`, `--timeout-s`, `--token-budget` (from `RunOverrides`)."""
    group = parser.add_argument_group("run limits (default: the RLM_MCP_* setting)")
    for name, field in RunOverrides.model_fields.items():
        kind = _scalar(field.annotation)
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            metavar="N" if kind is int else "S",
            help=field.description,
        )


def overrides_of(args: argparse.Namespace) -> RunOverrides:
    """The validated overrides the parsed flags ask for (`BadArgumentError` names a bad one)."""
    return RunOverrides.checked(**{name: getattr(args, name) for name in RunOverrides.model_fields})
