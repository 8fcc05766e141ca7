"""The CI guard of issue 8: rlm-mcp's `canonical` conversation IS the training conversation.

Each scripted trajectory runs twice against the project's scripted OpenAI-compatible server:
through the reference library itself (rlms 0.1.3 in its own venv, run as the adapter card shows)
and through rlm-mcp (a real stdio server, real Docker sandbox) set up as the README says: the
default model and profile, the reference wheel in the data dir (where `rlm-mcp profile fetch`
puts it). Every root request must carry the same messages, byte for byte, except that a raised
exception is shown as training showed it (the reference's inference REPL prints only
`\\nType: message`; the training worker appends the traceback, here its cell frames).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import minimal_env, stdio_client
from tests.fixtures_reference import (
    MAX_ITERATIONS,
    first_difference,
    load_args,
    reference_python,
    reference_wheel,
    repl,
    root_conversations,
    run_reference,
    seed_data_dir,
)

__all__ = ["reference_python", "reference_wheel"]

pytestmark = pytest.mark.anyio


@dataclass
class Case:
    name: str
    query: str
    context: Any  # str, or a list/dict loaded as JSON
    replies: list[str]
    raised: list[str] = field(default_factory=list)  # self-contained cells that raise


DIVIDE = "x = 5\nresult = x / 0"
MISSING_KEY = 'def pick(d):\n    return d["missing"]\n\npick({"a": 1})'
SYNTAX = "y = (1,"

CASES = [
    Case(
        name="str",
        query="What does the memo say about the launch?",
        context="Memo: the launch moves to Tuesday. " * 40,
        replies=[
            repl("print(type(context).__name__, len(context))\nprint(context[:60])", prose="Let me look first."),
            repl('summary = llm_query("Summarize: " + context[:300])\nprint(summary)'),
            repl(DIVIDE),
            "I will check the warnings next, without code in this reply.",
            repl(
                'import sys\nprint("careful", file=sys.stderr)\nprint("fine")',
                MISSING_KEY,
                prose="Two blocks and a plain python fence:\n```python\nprint('not run')\n```",
            ),
            repl('print("x" * 30000)'),
            repl(
                'parts = llm_query_batched(["a?", "b?"])\nanswer["content"] = "Tuesday; " + ", ".join(parts)\n'
                'answer["ready"] = True'
            ),
        ],
        raised=[DIVIDE, MISSING_KEY],
    ),
    Case(
        name="list",
        query="How many entries mention red?",
        context=["a red apple", "a green pear", "red wine", "blue sky"],
        replies=[
            repl("print(len(context), context[0])", ""),
            repl('n = sum("red" in s for s in context)\nanswer["content"] = str(n)\nanswer["ready"] = True'),
        ],
    ),
    Case(
        name="records",
        query="Who wrote the second note?",
        context=[{"content": "note one", "author": "ann"}, {"content": "note two", "author": "bo"}],
        replies=[
            repl("print(answer)\nprint(SHOW_VARS())", "", prose="First the state, then an empty block."),
            repl("import re\nhits = [r for r in context if re.search('two', r['content'])]\nprint(SHOW_VARS())"),
            repl('answer["content"] = hits[0]["author"]\nanswer["ready"] = True'),
        ],
    ),
    Case(
        name="dict",
        query="Which team has the most points?",
        context={"teams": ["ants", "bees"], "points": {"ants": 3, "bees": 7}, "note": "season 1"},
        replies=[
            repl("print(sorted(context))"),
            repl(SYNTAX),
            repl(
                'best = max(context["points"], key=context["points"].get)\nanswer["content"] = best\n'
                'answer["ready"] = True'
            ),
        ],
        raised=[SYNTAX],
    ),
]


def _script(case: Case) -> dict[str, Any]:
    return {
        "root_by_query": [{"match": "Answer the following", "replies": case.replies}],
        "sub": [{"match": "^Summarize", "reply": "A memo about a launch on Tuesday."}],
        "sub_default": "yes",
    }


def _training_error(code: str) -> tuple[str, str]:
    """What the reference's REPL shows for this raising cell, and what training showed: the same
    line followed by the traceback (training's worker: `format_exc()`; only its cell frames)."""
    try:
        exec(code, {})
    except Exception as exc:
        shown = f"\n{type(exc).__name__}: {exc}"
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<string>"]
        tb = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
        tb += "".join(traceback.format_exception_only(type(exc), exc))
        return shown, f"{shown}\n{tb}"
    raise AssertionError(f"the cell does not raise: {code!r}")


# The inference REPL loads a list/dict context by running `import json` and `with open(...) as
# f` in the namespace, so its SHOW_VARS() lists `json` and `f`; the training worker set the
# context directly (rlm_train/worker.py, load_context). Training wins.
_LOADER_LEFTOVERS = "'json': 'module', 'f': 'TextIOWrapper', "


def _as_training(messages: list[dict[str, Any]], case: Case) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        content = message["content"]
        if message["role"] == "user" and content.startswith("REPL output"):
            content = content.replace("Available variables: {" + _LOADER_LEFTOVERS, "Available variables: {")
            for code in case.raised:
                shown, trained = _training_error(code)
                content = content.replace(shown, trained, 1)
        out.append({"role": message["role"], "content": content})
    return out


def _run_reference(python: Path, lm: ScriptedLM, case: Case) -> None:
    job = {
        "model": "rlm-v0.1",
        "base_url": lm.base_url,
        "context": case.context,
        "query": case.query,
        "max_iterations": MAX_ITERATIONS,
    }
    run_reference(python, job)


async def _run_rlm_mcp(lm: ScriptedLM, case: Case, tmp_path: Path, wheel: Path) -> dict[str, Any]:
    data = tmp_path / "data"
    seed_data_dir(data, wheel)  # what `rlm-mcp profile fetch` does
    env = minimal_env(lm.base_url, data, [tmp_path])
    async with stdio_client(env) as client:
        loaded = await client.call_tool("rlm_load_context", load_args(case.context))
        assert not loaded.is_error, loaded.content
        result = await client.call_tool(
            "rlm_complete", {"query": case.query, "context_id": loaded.structured_content["context_id"]}
        )
        assert not result.is_error, result.content
        return dict(result.structured_content)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_canonical_is_the_training_conversation(
    case: Case, tmp_path: Path, reference_python: Path, reference_wheel: Path
) -> None:
    with ScriptedLM(_script(case)) as lm:
        await anyio.to_thread.run_sync(_run_reference, reference_python, lm, case)
        expected = [_as_training(c, case) for c in root_conversations(lm)]
        lm.reset_log()
        outcome = await _run_rlm_mcp(lm, case, tmp_path, reference_wheel)
        got = root_conversations(lm)
    assert outcome["status"] == "completed", outcome
    assert len(expected) == len(case.replies)
    difference = first_difference(expected, got)
    assert difference is None, difference
    final = got[-1]
    print(f"[fidelity] {case.name}: {len(final)}/{len(expected[-1])} root messages identical, {len(got)} root requests")
