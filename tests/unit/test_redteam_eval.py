"""Issue 20 items 17-18: eval resume validates each result line (a malformed one counts as
absent and its task runs again, with a warning), and the scorers finish on long adversarial
answers (small models emit long whitespace runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlm_mcp.eval.scorers import score

WS = 1_000_000  # one MiB of whitespace: hours for the old patterns

# Each scores as its short form would: the whitespace runs change nothing.
CASES = [
    ("choice", "The answer is" + "\n" * WS + "x", "B", 0.0),
    ("choice", "answer:" + " " * WS + "x (C)", "C", 1.0),
    ("choice", "A" + " " * WS + "x", "A", 0.0),
    ("pairs_f1", "(" + " " * WS + "x", [["a", "b"]], 0.0),
    ("pairs_f1", "(" + " " * WS + "a, b)" + " (c," + "\t" * WS + "d)", [["a", "b"], ["c", "d"]], 1.0),
    ("pairs_f1", "(a" + " " * WS + "b" + " " * WS, [["a", "b"]], 0.0),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_scorers_finish_on_long_whitespace_runs(case: int) -> None:
    # In a child with a deadline against a hang (hours before the fix), not a timing assertion.
    code = (
        "from tests.unit.test_redteam_eval import CASES; from rlm_mcp.eval.scorers import score; "
        f"name, answer, gold, want = CASES[{case}]; print(score(name, answer, gold))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == CASES[case][3]


def test_short_answers_score_as_before() -> None:
    assert score("choice", "The answer is (B).", "B") == 1.0
    assert score("choice", "answer:  C", "C") == 1.0
    assert score("choice", "  b ", "B") == 1.0
    assert score("choice", "(A) or (B)", "A") == 0.0
    assert score("pairs_f1", "(a, b)\n(c,\nd) (e\nf, g)", [["a", "b"], ["c", "d"], ["f", "g"]]) == pytest.approx(0.8)
    assert score("pairs_f1", "( 'a' ,  b )", [["b", "a"]]) == 1.0


def test_resume_counts_malformed_result_lines_as_absent(tmp_path, caplog) -> None:
    import json as _json

    from rlm_mcp.eval.report import summarize
    from rlm_mcp.eval.results import read_results

    good = {"id": "ok", "status": "completed", "answer": "a", "expected": "a", "scorer": "exact", "score": 1.0}
    lines = [
        _json.dumps(good),
        'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom',
        _json.dumps({**good, "id": "nan"}).replace("1.0", "NaN"),
        _json.dumps({**good, "id": "inf", "duration_s": 1.0}).replace('"duration_s": 1.0', '"duration_s": Infinity'),
        _json.dumps({**good, "id": "big", "score": 7.5}),
        _json.dumps({**good, "id": "neg", "lenient_score": -1.0}),
        _json.dumps({**good, "id": "tokens", "usage": {"total": {"prompt_tokens": "lots"}}}),
        _json.dumps({**good, "id": "negative-tokens", "usage": {"total": {"prompt_tokens": -5}}}),
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING", logger="rlm_mcp.eval"):
        found = read_results(path)
    assert list(found) == ["ok"]
    assert sum("will run again" in r.getMessage() for r in caplog.records) >= 7
    summary = summarize("rlm", list(found.values()))
    assert summary.mean == 1.0 and summary.task_seconds == 0.0
