"""The texts the reference's builders make, read once in a child interpreter.

The child loads only `rlm/utils/prompts.py` (and the two small modules it imports) from the
wheel or an installed copy: the package `__init__` files, which import every SDK and load a
`.env` file, are replaced by empty package stubs. The builders are called with marker values
(objects that format as `\\x00NAME\\x00`), so each text comes back as a template whose only
variable parts are the markers; filling a marker is the only thing done to the reference's text.

The child also formats a few sample REPL results with the reference's own formatter, so the
caller can check that its REPL-output layout is the reference's (see engine/profiles.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm_mcp.errors import RlmMcpError

_MARK = re.compile("\x00([A-Z0-9+-]+)\x00")

_CHILD = r"""
import json, os, sys, types
root, samples = sys.argv[1], json.loads(sys.stdin.read())
for name in ("rlm", "rlm.core", "rlm.utils", "rlm.environments"):
    stub = types.ModuleType(name)
    stub.__path__ = [os.path.join(root, *name.split("."))]
    sys.modules[name] = stub
import rlm.utils.prompts as p
import rlm.utils.parsing as parsing

class Mark:
    def __init__(self, name):
        self.name = name
    def __format__(self, spec):
        return "\x00" + self.name + "\x00"
    __str__ = lambda self: format(self)
    def __add__(self, other):
        return Mark(self.name + "+" + str(other))
    def __sub__(self, other):
        return Mark(self.name + "-" + str(other))
    def __gt__(self, other):
        return True

meta = types.SimpleNamespace(context_type=Mark("TYPE"), context_total_length=Mark("CHARS"))
first = p.build_rlm_system_prompt(p.RLM_SYSTEM_PROMPT, meta, custom_tools=None, root_prompt=None, orchestrator=True)
with_query = p.build_rlm_system_prompt(p.RLM_SYSTEM_PROMPT, meta, custom_tools=None, root_prompt="\x00QUERY\x00", orchestrator=True)
turn = lambda i, c, h=0: p.build_user_prompt(None, i, c, h, max_iterations=Mark("N"))["content"]

def iteration(blocks):
    made = []
    for b in blocks:
        result = types.SimpleNamespace(stdout=b["stdout"], stderr=b["stderr"], locals={k: "" for k in b["variables"]})
        made.append(types.SimpleNamespace(code="", result=result))
    return types.SimpleNamespace(response="", code_blocks=made)

formatted = [parsing.format_iteration(iteration(s["blocks"]), s["limit"])[1]["content"] for s in samples]
json.dump({
    "system": first[0]["content"],
    "metadata_plain": first[1]["content"],
    "metadata_query": with_query[1]["content"],
    "turn_first": turn(0, 1),
    "turn": turn(Mark("K"), 1),
    "turn_contexts": turn(Mark("K"), Mark("C")),
    "turn_history": turn(Mark("K"), 1, 1),
    "turn_histories": turn(Mark("K"), 1, Mark("H")),
    "formatted": formatted,
}, sys.stdout)
"""


class ReferenceUnavailable(RlmMcpError):
    """The reference's texts cannot be read (no copy, or a broken one)."""


@dataclass(frozen=True)
class ReferenceTexts:
    """Templates built by the reference's builders; `\\x00NAME\\x00` marks a value to fill."""

    source: str
    system: str
    metadata_plain: str
    metadata_query: str
    turn_first: str
    turn: str
    turn_contexts: str
    # Persistent mode (kept sessions): the notes on one and on several earlier conversations.
    turn_history: str = ""
    turn_histories: str = ""
    formatted: list[str] = field(default_factory=list)  # the reference's layout of the samples sent

    def metadata(self, query: str | None, kind: str, chars: int) -> str:
        """The metadata message for one context of `kind` and `chars` total characters."""
        values = {"TYPE": kind, "CHARS": str(chars), "QUERY": query or ""}
        return _fill(self.metadata_query if query else self.metadata_plain, values)

    def turn_message(self, iteration: int, max_iterations: int, context_count: int, history_count: int = 0) -> str:
        """`Turn k/N:` (k 1-based), the first turn with its safeguard, the note for several contexts,
        and the persistent mode's note on earlier conversations (`history_count` > 0)."""
        if iteration == 1:
            text = _fill(self.turn_first, {"N": str(max_iterations)})
        else:
            text = _fill(self.turn, {"K+1": str(iteration), "N": str(max_iterations)})
        if context_count > 1:
            note = self.turn_contexts[len(self.turn) :]
            text += _fill(note, {"C": str(context_count), "C-1": str(context_count - 1)})
        if history_count == 1:
            text += self.turn_history[len(self.turn) :]
        elif history_count > 1:
            note = self.turn_histories[len(self.turn) :]
            text += _fill(note, {"H": str(history_count), "H-1": str(history_count - 1)})
        return text


def _fill(template: str, values: Mapping[str, str]) -> str:
    # One pass over the template: a filled value (a query, say) is never scanned for markers.
    return _MARK.sub(lambda m: values[m.group(1)], template)


def _check(texts: ReferenceTexts) -> None:
    expected = {
        "system": set(),
        "metadata_plain": {"TYPE", "CHARS"},
        "metadata_query": {"TYPE", "CHARS", "QUERY"},
        "turn_first": {"N"},
        "turn": {"K+1", "N"},
    }
    for name, marks in expected.items():
        text = getattr(texts, name)
        if set(_MARK.findall(text)) != marks or text.count("\x00") != 2 * len(_MARK.findall(text)):
            raise ReferenceUnavailable(f"The reference's {name} text does not have the expected shape.", None)
    note = texts.turn_contexts[len(texts.turn) :]
    if not texts.turn_contexts.startswith(texts.turn) or set(_MARK.findall(note)) != {"C", "C-1"}:
        raise ReferenceUnavailable("The reference's several-contexts note does not have the expected shape.", None)
    one, several = texts.turn_history[len(texts.turn) :], texts.turn_histories[len(texts.turn) :]
    if not (texts.turn_history.startswith(texts.turn) and one and not _MARK.findall(one)):
        raise ReferenceUnavailable("The reference's conversation-history note does not have the expected shape.", None)
    if not texts.turn_histories.startswith(texts.turn) or set(_MARK.findall(several)) != {"H", "H-1"}:
        raise ReferenceUnavailable(
            "The reference's conversation-histories note does not have the expected shape.", None
        )


# What the child needs: nothing of the server's environment (API keys, tokens, proxies).
_CHILD_ENV = {"PATH": os.defpath, "LC_ALL": "C.UTF-8"}


def _private_copy(wheel: Path, folder: Path) -> Path:
    """The wheel's bytes, read once and checked against the pinned hash, in a 0700 folder."""
    from rlm_mcp.reference.wheel import WHEEL_SHA256  # texts.py is imported by wheel's package

    data = wheel.read_bytes()
    if hashlib.sha256(data).hexdigest() != WHEEL_SHA256:
        raise ReferenceUnavailable(f"The reference wheel {wheel} does not have the pinned SHA-256.", None)
    copy = folder / wheel.name
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return copy


def load_reference_texts(
    source: Path, samples: list[dict[str, Any]] | None = None, *, timeout_s: float = 60.0
) -> ReferenceTexts:
    """Run the reference's builders in a child interpreter (isolated: no .env, no site paths,
    a minimal environment: no API key or tokens). A wheel is read once, checked, and the child
    reads that private copy, so a file swapped after the check is never run."""
    with tempfile.TemporaryDirectory(prefix="rlm-mcp-reference-") as cwd:
        readable = _private_copy(source, Path(cwd)) if source.is_file() else source
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _CHILD, str(readable)],
                env=_CHILD_ENV,
                input=json.dumps(samples or []),
                capture_output=True,
                text=True,
                cwd=cwd,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ReferenceUnavailable(f"Reading the reference texts from {source} failed: {exc}.", None) from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
        raise ReferenceUnavailable(f"Reading the reference texts from {source} failed: {tail}", None)
    try:
        raw = json.loads(proc.stdout)
        texts = ReferenceTexts(source=str(source), **raw)
    except (ValueError, TypeError) as exc:
        raise ReferenceUnavailable(f"The reference at {source} returned unreadable texts: {exc}.", None) from None
    _check(texts)
    return texts
