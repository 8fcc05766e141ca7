"""Settings hygiene: typos and bad values are reported, not silently ignored or dumped raw.

Generic over the settings model's fields, so a setting added to `Settings` is covered at once:
an unknown `RLM_MCP_*` variable or config-file key is reported with the nearest valid name, a
named config file that does not exist is an error, and a bad value becomes one line naming the
setting, the value and the expected form.
"""

from __future__ import annotations

import difflib
import json
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo

from rlm_mcp.errors import RlmMcpError

ENV_PREFIX = "RLM_MCP_"
CONFIG_VAR = "RLM_MCP_CONFIG"  # names the TOML file; not a field itself


class SettingsError(RlmMcpError):
    """The configuration cannot be used as given (bad value, missing file, unknown key)."""


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _did_you_mean(name: str, valid: Iterable[str]) -> str:
    # Compared without the shared prefix, which would make every name look alike.
    by_bare = {v.upper().removeprefix(ENV_PREFIX): v for v in valid}
    close = difflib.get_close_matches(name.upper().removeprefix(ENV_PREFIX), list(by_bare), n=1, cutoff=0.6)
    return f"; did you mean {by_bare[close[0]]}?" if close else ""


def unknown_env_vars(fields: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """One message per `RLM_MCP_*` variable that names no setting."""
    valid = {env_name(f) for f in fields} | {CONFIG_VAR}
    return [
        f"unknown setting {name} (ignored){_did_you_mean(name, valid)}"
        for name in sorted(environ)
        if name.upper().startswith(ENV_PREFIX) and name.upper() not in valid
    ]


def check_config_file(path: Path, fields: Iterable[str]) -> None:
    """The file named by RLM_MCP_CONFIG must exist, parse, and hold only known keys."""
    valid = set(fields)
    if not path.is_file():
        raise SettingsError(f"{CONFIG_VAR} names {path}, which does not exist.", f"Create it, or unset {CONFIG_VAR}.")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"Config file {path} cannot be read as TOML: {exc}.", "Fix its syntax.") from exc
    unknown = [key for key in data if key not in valid]
    if unknown:
        hints = ", ".join(f"`{key}`{_did_you_mean(key, valid)}" for key in unknown)
        raise SettingsError(
            f"Unknown key(s) in config file {path}: {hints}",
            "Keys are the settings' names without the RLM_MCP_ prefix, in lower case.",
        )


def check_endpoint_url(value: str) -> str:
    """An endpoint URL must say http:// or https:// and name a host; without them every request
    fails later with a message that blames the server (\"vLLM unreachable\")."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"not an http:// or https:// URL; write it in full, e.g. http://{value.strip() or 'localhost:8000/v1'}"
            if parts.scheme not in ("http", "https") and "//" not in value
            else "not an http:// or https:// URL with a host, e.g. http://localhost:8000/v1"
        )
    return value.strip()


def expected_form(field: FieldInfo) -> str:
    """What a value of this field looks like, in words."""
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
        origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + " | ".join(str(v) for v in typing.get_args(annotation))
    forms: dict[Any, str] = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "text",
        Path: "a path",
        dict: "a JSON object",
        list: "a list",
        SecretStr: "text",
    }
    form = forms.get(origin or annotation, str(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        form = "one of " + " | ".join(str(m.value) for m in annotation)
    return f"{form} ({field.description})" if field.description else form


def describe_validation_error(exc: ValidationError, fields: Mapping[str, FieldInfo]) -> str:
    """One line per bad value: setting, value, what is wrong, expected form."""
    lines = []
    for error in exc.errors():
        loc = error["loc"]
        if len(loc) > 1 and str(loc[0]) not in fields and str(loc[1]) in fields:
            loc = loc[1:]  # a setting inside its section (`sandbox.max_sandboxes`): its flat name
        name = str(loc[0]) if loc else "?"
        field = fields.get(name)
        value = error.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 80 else "(a value)"
        if field is not None and "SecretStr" in str(field.annotation):
            shown = "(hidden: it may hold a password)"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        expected = f"; expected {expected_form(field)}" if field is not None else ""
        # A value inside a JSON setting (a model's price) is named by its keys, not blamed on
        # the whole setting: RLM_MCP_MODEL_PRICES["m"]["input"]=-1.
        keys = "".join(f"[{json.dumps(str(k))}]" for k in loc[1:])
        lines.append(f"{env_name(name)}{keys}={shown}: {message}{expected}")
    return "\n".join(lines)
