"""The reference-diff guard, grown to kept sessions: with the canonical profile, the root
conversation of every run in a session that adds one context per run is, byte for byte, what
rlms 0.1.3 sends in persistent mode with its local environment (`RLM(persistent=True)`) for the
same trajectory: its own metadata, `context_1`, ... in the REPL listing, the contexts and
conversation-history notes of the turn messages, and `history_i` holding the earlier runs.

Run 1 builds a variable, later runs read it, the new context and the stored conversations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


@dataclass
class Step:
    query: str
    context: Any  # str, or a list/dict (loaded as JSON)
    replies: list[str]


def _submit(expr: str) -> str:
    return repl(f'answer["content"] = {expr}\nanswer["ready"] = True')


STEP_ONE = Step(
    query="Session step one: how many distinct words?",
    context="apple pear apple fig pear apple " * 10,
    replies=[
        repl(
            "words = context.split()\ncounts = {}\nfor w in words:\n    counts[w] = counts.get(w, 0) + 1\nprint(counts)"
        ),
        _submit("str(len(counts))"),
    ],
)
STEP_TWO = Step(
    query="Session step two: which word of the first context appears in the second?",
    context="a fig tree and a plum tree",
    replies=[
        repl("print(type(context_1).__name__, len(context_1), context is context_0)"),
        repl(
            "shared = sorted(w for w in counts if w in context_1.split())\nprint(shared, len(history), history[1]['role'])"
        ),
        _submit("', '.join(shared)"),
    ],
)
STEP_THREE = Step(
    query="Session step three: which records name a fruit seen before?",
    context=[{"content": "fig jam"}, {"content": "rye bread"}, {"content": "pear tart"}],
    replies=[
        repl("print(len(context_2), len(history_0), len(history_1), history_1[0]['role'])"),
        repl("hits = [r['content'] for r in context_2 if any(w in r['content'] for w in counts)]\nprint(hits)"),
        _submit("'; '.join(hits)"),
    ],
)

SESSIONS = {"two_runs": [STEP_ONE, STEP_TWO], "three_runs": [STEP_ONE, STEP_TWO, STEP_THREE]}


def _script(steps: list[Step]) -> dict[str, Any]:
    return {"root_by_query": [{"match": re.escape(s.query), "replies": s.replies} for s in steps], "sub_default": "ok"}


def _run_reference(python: Path, lm: ScriptedLM, steps: list[Step]) -> list[str]:
    session = [{"context": s.context, "query": s.query} for s in steps]
    job = {"model": "rlm-v0.1", "base_url": lm.base_url, "max_iterations": MAX_ITERATIONS, "session": session}
    return list(run_reference(python, job)["answers"])


async def _run_rlm_mcp(lm: ScriptedLM, steps: list[Step], tmp_path: Path, wheel: Path) -> list[str]:
    data = tmp_path / "data"
    seed_data_dir(data, wheel)  # what `rlm-mcp profile fetch` does
    env = minimal_env(lm.base_url, data, [tmp_path])
    answers: list[str] = []
    session_id: str | None = None
    async with stdio_client(env) as client:
        for step in steps:
            loaded = await client.call_tool("rlm_load_context", load_args(step.context))
            assert not loaded.is_error, loaded.content
            args: dict[str, Any] = {"query": step.query, "context_id": loaded.structured_content["context_id"]}
            args |= {"session_id": session_id} if session_id else {"keep_session": True}
            result = await client.call_tool("rlm_complete", args)
            assert not result.is_error, result.content
            outcome = dict(result.structured_content)
            assert outcome["status"] == "completed", outcome
            session_id = outcome["session_id"]
            answers.append(outcome["answer"])
    return answers


@pytest.mark.parametrize("name", sorted(SESSIONS))
async def test_a_kept_session_is_the_reference_persistent_conversation(
    name: str, tmp_path: Path, reference_python: Path, reference_wheel: Path
) -> None:
    steps = SESSIONS[name]
    with ScriptedLM(_script(steps)) as lm:
        expected_answers = await anyio.to_thread.run_sync(_run_reference, reference_python, lm, steps)
        expected = root_conversations(lm)
        lm.reset_log()
        answers = await _run_rlm_mcp(lm, steps, tmp_path, reference_wheel)
        got = root_conversations(lm)
    assert len(expected) == sum(len(s.replies) for s in steps)
    assert answers == expected_answers
    difference = first_difference(expected, got)
    assert difference is None, difference
    # The later runs did see the notes (so the comparison covered them).
    assert any("prior conversation histor" in m["content"] for c in got for m in c)
