"""Prompt profiles: every text the engine writes into a root conversation, in one object.

- `canonical`: the conversation the `rlm-v0.1` adapter was trained on, byte for byte: the system,
  metadata and `Turn k/N:` texts are built by the reference's own builders (rlm_mcp.reference),
  REPL output is laid out as training laid it out (a raised exception as `\\nType: message` and
  its traceback, and the variables that existed before the failed cell).
- `rlm-mcp` and `file:PATH`: the project's own words (real sub-call capacity, tracebacks).

Text rlm-mcp adds for events training never had (several contexts, a sandbox restart, a cut-off
reply, the submit-now turn, window elision, FINAL_VAR notes) appears only when the event happens.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from rlm_mcp.engine import messages as msg
from rlm_mcp.engine.formatting import format_cell
from rlm_mcp.ports import CellResult, ContextSpec
from rlm_mcp.reference import ReferenceTexts

log = logging.getLogger("rlm_mcp.engine")

# JSON contexts bigger than this are not parsed on the host just to count their characters the
# reference's way; their document length is reported instead.
_MAX_JSON_MEASURE_BYTES = 256 << 20


class PromptProfile:
    """The rlm-mcp profile (also `file:PATH`, which only swaps the system prompt)."""

    name = "rlm-mcp"
    training_cell = False  # names bound by a cell that raised stay (robust)

    def __init__(self, system: str, name: str = "rlm-mcp") -> None:
        self.system = system
        self.name = name

    async def metadata(
        self, query: str | None, contexts: Sequence[ContextSpec], sub_capacity_tokens: int, *, first_index: int = 0
    ) -> str:
        """The first user message; `first_index` > 0: a kept session's follow-up, whose contexts
        are bound from context_{first_index} on (earlier ones are in the REPL already)."""
        text = msg.metadata_message(query, contexts, sub_capacity_tokens)
        if first_index and contexts:
            text += "\n\n" + msg.added_contexts_note(contexts, first_index)
        return text

    def turn(self, iteration: int, max_iterations: int, context_count: int, history_count: int = 0) -> str:
        return msg.turn_message(iteration, max_iterations, context_count, history_count)

    def format_cell(self, result: CellResult) -> str:
        return format_cell(result)


class CanonicalProfile(PromptProfile):
    """The training conversation; texts from the reference's builders."""

    training_cell = True  # cells run as training ran them (see Sandbox.execute)

    def __init__(self, texts: ReferenceTexts) -> None:
        super().__init__(texts.system, "canonical")
        self.texts = texts

    async def metadata(
        self, query: str | None, contexts: Sequence[ContextSpec], sub_capacity_tokens: int, *, first_index: int = 0
    ) -> str:
        """The reference's metadata of this run's context. A kept session's follow-up with one new
        context gets exactly what the reference's persistent mode sends (it describes the call's
        own context); with several, rlm-mcp's listing follows (docs/sessions.md)."""
        if not contexts:
            return self.texts.metadata(query, "str", 0)
        # A worker-thread hop only for what must be read (a JSON list or dict): the others' length
        # is their character count, and the hop (~0.7 ms on the loaded 2-core VM) held back the
        # run's first request.
        lengths = [
            await anyio.to_thread.run_sync(reference_length, spec) if _read_to_measure(spec) else spec.chars
            for spec in contexts
        ]
        text = self.texts.metadata(query, contexts[0].kind, sum(lengths))
        if len(contexts) > 1:
            # rlm-mcp's addition: the reference describes one context.
            pairs = enumerate(zip(contexts, lengths, strict=True), first_index)
            listing = "; ".join(f"context_{i} is a {c.kind} of {n} characters" for i, (c, n) in pairs)
            if first_index:
                text += f"\n\nThis question adds {len(contexts)} contexts: {listing}."
            else:
                text += f"\n\nThere are {len(contexts)} contexts (`context` is context_0): {listing}."
        return text

    def turn(self, iteration: int, max_iterations: int, context_count: int, history_count: int = 0) -> str:
        return self.texts.turn_message(iteration, max_iterations, context_count, history_count)

    def format_cell(self, result: CellResult) -> str:
        return format_trained_cell(result)


def format_trained_cell(result: CellResult) -> str:
    """One block's output as training showed it: stdout, stderr (with the exception appended raw),
    then the variable names; parts newline-prefixed and joined by blank lines; else "No output"."""
    parts: list[str] = []
    if result.stdout:
        parts.append("\n" + result.stdout)
    stderr = result.stderr
    if result.error is not None:
        stderr += result.trained_error if result.trained_error is not None else "\n" + result.error
    if stderr:
        parts.append("\n" + stderr)
    if result.notice:
        parts.append("\n" + result.notice)  # rlm-mcp's: only when the host had to step in
    variables = result.variables
    if result.error is not None and result.variables_at_start is not None:
        variables = result.variables_at_start  # training kept no name from a cell that raised
    if variables:
        parts.append(f"REPL variables: {list(variables)!r}\n")
    return "\n\n".join(parts) if parts else "No output"


def reference_length(spec: ContextSpec) -> int:
    """The total length the reference reports for this context (its QueryMetadata rule): the
    characters of a string; for a list or dict, the sum over its items of the item's length
    (strings), `content` length (dicts with `content`) or JSON length (other items)."""
    if not _read_to_measure(spec):
        return spec.chars
    try:
        value = json.loads(spec.path.read_text(encoding="utf-8"))
        return _measure(value)
    except (OSError, ValueError, TypeError) as exc:
        log.warning("context %s: could not measure it as the reference does (%s); using its length", spec.name, exc)
        return spec.chars


def _read_to_measure(spec: ContextSpec) -> bool:
    """Whether `reference_length` reads the context (a JSON list or dict small enough to parse)."""
    return spec.format == "json" and spec.kind != "str" and spec.bytes <= _MAX_JSON_MEASURE_BYTES


def _json_len(item: Any) -> int:
    return len(json.dumps(item, default=str))


def _measure(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(v) if isinstance(v, str) else _json_len(v) for v in value.values())
    if isinstance(value, list):
        if not value:
            return 0
        if isinstance(value[0], dict):
            if "content" in value[0]:
                return sum(len(str(item.get("content", ""))) for item in value)
            return sum(_json_len(item) for item in value)
        return sum(len(item) for item in value)
    raise TypeError(f"a {type(value).__name__} context has no reference length")


@dataclass(frozen=True)
class FormatSample:
    """A REPL result both layouts format, to prove at load time that ours is the reference's."""

    blocks: list[CellResult]
    limit: int = 20_000

    def to_reference(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "blocks": [{"stdout": b.stdout, "stderr": b.stderr, "variables": b.variables} for b in self.blocks],
        }


FORMAT_SAMPLES = [
    FormatSample([CellResult()]),
    FormatSample([CellResult(stdout="a\n", variables=["answer", "x"])]),
    FormatSample([CellResult(stdout="out\n", stderr="err\n", variables=["y"]), CellResult(stderr="only err\n")]),
    FormatSample([CellResult(stdout="z" * 50, variables=["v"])], limit=20),
]
