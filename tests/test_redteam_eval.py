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
        "from tests.test_redteam_eval import CASES; from rlm_mcp.eval.scorers import score; "
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
