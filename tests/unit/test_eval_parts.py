"""Task file loading, the summary statistics and the judge scorer (against the scripted LM)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError
from rlm_mcp.eval.judge import Judge, verdict
from rlm_mcp.eval.report import bootstrap_interval, render_markdown, summarize
from rlm_mcp.eval.results import TaskResult, append_result, read_results
from rlm_mcp.eval.tasks import load_tasks
from rlm_mcp.testing.script import Script, SubRule
from rlm_mcp.testing.scripted_lm import ScriptedLM


def test_task_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = {"id": "a", "query": "q", "context": "c", "answer": "x", "scorer": "exact"}
    cases = {
        "not json": "not a valid task",
        json.dumps({**good, "context_path": "f.txt"}): "exactly one of",
        json.dumps({**good, "scorer": "fuzzy"}): "scorer",
    }
    for line, message in cases.items():
        path.write_text(json.dumps(good) + "\n\n" + line + "\n")
        with pytest.raises(BadArgumentError, match=message) as err:
            load_tasks(path)
        assert "t.jsonl:3" in str(err.value)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(BadArgumentError, match="duplicate"):
        load_tasks(path)
    path.write_text(json.dumps({**good, "context": None, "context_path": "sub/f.txt"}) + "\n")
    (task,) = load_tasks(path)
    assert task.resolved_context_path(path) == tmp_path / "sub" / "f.txt"


def result(task_id: str, score: float, status: str = "completed", tokens: int = 10) -> TaskResult:
    return TaskResult(
        id=task_id,
        status=status,
        answer=None,
        expected="x",
        scorer="exact",
        score=score,
        usage={"total": {"prompt_tokens": tokens, "completion_tokens": 1, "calls": 1}},
        duration_s=1.5,
    )


def test_bootstrap_interval_is_seeded_and_brackets_the_mean() -> None:
    scores = [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.25]
    low, high = bootstrap_interval(scores)
    assert (low, high) == bootstrap_interval(scores)
    assert low < sum(scores) / len(scores) < high and low >= 0.0 and high <= 1.0
    assert bootstrap_interval([1.0, 1.0]) == (1.0, 1.0)
    assert bootstrap_interval([]) == (0.0, 0.0)


def test_summary_counts_errors_as_zero() -> None:
    s = summarize("rlm", [result("a", 1.0), result("b", 0.5), result("c", 0.0, "error", tokens=0)])
    assert s.mean == pytest.approx(0.5) and s.n == 3
    assert dict(s.statuses) == {"completed": 2, "error": 1}
    assert (s.prompt_tokens, s.completion_tokens, s.task_seconds) == (20, 3, 4.5)
    md = render_markdown([s], wall_s=2.0, title="t")
    assert "| rlm | 3 | 50.0 |" in md and "completed 2, error 1" in md


def test_results_file_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    append_result(path, result("a", 1.0))
    with path.open("a") as f:
        f.write('{"id": "b", "sta')  # killed mid-write
    assert list(read_results(path)) == ["a"]


def test_verdict_parsing() -> None:
    assert verdict("Same person.\ncorrect: yes") is True
    assert verdict("correct: yes ... on reflection\n**Correct:** no") is False
    assert verdict("I think so") is None


def test_judge_grades_through_the_configured_model() -> None:
    script = Script(
        sub=[SubRule(match="RESPONSE:\\s*Ada Lovelace", reply="Same person.\ncorrect: yes")],
        sub_default="Different.\ncorrect: no",
    )

    async def main() -> None:
        with ScriptedLM(script) as lm:
            judge = Judge(Settings(base_url=lm.base_url, lm_retries=0))
            try:
                assert await judge.grade("Who?", "Ada Lovelace", "Ada Lovelace") == (1.0, None)
                assert await judge.grade("Who?", "Ada Lovelace", "Charles Babbage") == (0.0, None)
                assert await judge.grade("Who?", "Ada Lovelace", None) == (0.0, None)
            finally:
                await judge.aclose()
        broken = Judge(Settings(base_url="http://127.0.0.1:9/v1", lm_retries=0))
        try:
            value, error = await broken.grade("Who?", "Ada", "Ada")
        finally:
            await broken.aclose()
        assert value == 0.0 and error is not None and error.startswith("judge failed")

    anyio.run(main)


def test_live_display_shows_the_headline_and_running_tasks() -> None:
    import io

    from rich.console import Console

    from rlm_mcp.eval.display import LiveDisplay, Tally

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=120)
    display = LiveDisplay(Tally(3, [result("old", 1.0)]), console=console)
    try:
        display.started("t1")
        display.update("t1", "turn 2/20 · 3 sub-calls")
        console.print(display._render())
        display.finished(result("t1", 0.0))
    finally:
        display.close()
    text = stream.getvalue()
    assert "turn 2/20 · 3 sub-calls" in text
    assert "[rlm] t1: completed, score 0.00" in text
    assert "2/3 done · 0 running · score so far 50.0 · 22 tokens" in text
