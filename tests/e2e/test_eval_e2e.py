"""`rlm-mcp eval` end to end: the real console script, real sandboxes, the scripted LM answering
some tasks right, some wrong and some not at all; exact per-task scores and mean; resume; the
direct baseline. One eval of six tasks with --parallel 2, then a resumed one with a seventh."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.testing.script import RootScript, Script, first_user_text
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import SERVER_SCRIPT, coverage_env, new_instance_id, sandbox_container_ids


def answer_block(expr: str) -> str:
    return f'```repl\nanswer["content"] = {expr}\nanswer["ready"] = True\n```'


TASKS: list[dict[str, Any]] = [
    # right, computed from the context inside the sandbox
    {"id": "code", "query": "Q-code: what is the code?", "context": "code=XK-42", "answer": "XK-42", "scorer": "exact"},
    # right, context from a file relative to the task file
    {
        "id": "colour",
        "query": "Q-colour: which colour?",
        "context_path": "ctx/colour.txt",
        "answer": "BLUE",
        "scorer": "contains",
    },
    # partly right: 0.75 ** |12 - 10|
    {"id": "count", "query": "Q-count: how many?", "context": "a\nb", "answer": 12, "scorer": "oolong"},
    # partly right: P = 2/4, R = 2/3, F1 = 4/7
    {
        "id": "pairs",
        "query": "Q-pairs: which pairs?",
        "context": "p",
        "answer": [[1, 2], [3, 4], [5, 6]],
        "scorer": "pairs_f1",
    },
    # wrong
    {"id": "mcq", "query": "Q-mcq: pick one", "context": "m", "answer": "B", "scorer": "choice"},
    # no answer at all: prose every turn until max_iterations
    {"id": "silent", "query": "Q-silent: say nothing", "context": "s", "answer": "x", "scorer": "exact"},
]
EXTRA = {"id": "late", "query": "Q-late: added later", "context": "l", "answer": "late", "scorer": "exact"}
EXPECTED = {"code": 1.0, "colour": 1.0, "count": 0.75**2, "pairs": 4 / 7, "mcq": 0.0, "silent": 0.0}

SCRIPT = Script(
    root_by_query=[
        # the direct baseline's single call: its user message starts with the context
        RootScript(match=r"\AContext:\n", replies=["XK-42"]),
        RootScript(match="Q-code", replies=[answer_block('context.split("=")[1]')]),
        RootScript(match="Q-colour", replies=[answer_block('"The colour is " + context.strip()')]),
        RootScript(match="Q-count", replies=[answer_block('"Answer: 10"')]),
        RootScript(match="Q-pairs", replies=[answer_block('"(1, 2)\\n(3, 4)\\n(1, 3)\\n(7, 8)"')]),
        RootScript(match="Q-mcq", replies=[answer_block('"The correct answer is (A)"')]),
        RootScript(match="Q-silent", replies=["I am thinking about it, no code yet."]),
        RootScript(match="Q-late", replies=[answer_block('"late"')]),
    ],
)


def run_eval(
    tmp_path: Path, base_url: str, owner: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", ""),
        "RLM_MCP_BASE_URL": base_url,
        "RLM_MCP_DATA_DIR": str(tmp_path / "data"),
        "RLM_MCP_ALLOWED_ROOTS": str(tmp_path / "nowhere"),  # eval reads task files as the user, roots aside
        "RLM_MCP_POOL_SIZE": "0",
        "RLM_MCP_LOG_LEVEL": "WARNING",
        "RLM_MCP_MAX_ITERATIONS": "2",
        "RLM_MCP_INSTANCE_ID": owner,
        **coverage_env(),
    }
    if "DOCKER_HOST" in os.environ:
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return subprocess.run(
        [str(SERVER_SCRIPT), "eval", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def write_tasks(path: Path, tasks: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")


def results(path: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def first_calls(lm: ScriptedLM, marker: str, *, direct: bool = False) -> int:
    """First turns of RLM root runs (or direct baseline calls) whose first user message names `marker`."""
    found = 0
    for r in lm.requests:
        text = first_user_text(r["body"]["messages"])
        if r["role"] == "root" and r["turn"] == 1 and marker in text and text.startswith("Context:\n") == direct:
            found += 1
    return found


def test_eval_scores_resumes_and_compares_with_the_direct_baseline(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "colour.txt").write_text("blue\n")
    task_file = tmp_path / "tasks.jsonl"
    write_tasks(task_file, TASKS)
    out = tmp_path / "out"
    owner = new_instance_id()

    with ScriptedLM(SCRIPT) as lm:
        # As the README writes it: the task file and the output named relative to the current
        # directory (the context path inside is relative to the task file).
        relative = f"{tmp_path.name}/tasks.jsonl"
        args = (relative, "--output", f"{tmp_path.name}/out", "--parallel", "2")
        first = run_eval(tmp_path, lm.base_url, owner, *args, cwd=tmp_path.parent)
        assert first.returncode == 0, first.stderr[-3000:]
        got = results(out / "results.jsonl")
        assert {k: v["score"] for k, v in got.items()} == pytest.approx(EXPECTED)
        assert got["code"]["status"] == "completed" and got["code"]["answer"] == "XK-42"
        assert got["silent"]["status"] == "max_iterations" and got["silent"]["answer"] is None
        assert got["count"]["lenient_score"] == pytest.approx(0.75**2)
        for r in got.values():
            assert r["run_id"].startswith("run_") and r["expected"] is not None and r["iterations"] >= 1
        mean = sum(EXPECTED.values()) / 6
        summary = (out / "summary.md").read_text()
        assert f"| rlm | 6 | {100 * mean:.1f} |" in summary
        assert "completed 5, max_iterations 1" in summary
        assert lm.max_in_flight <= 2

        # Resume: one task added; the six scored ones do not run again.
        write_tasks(task_file, [*TASKS, EXTRA])
        second = run_eval(tmp_path, lm.base_url, owner, str(task_file), "--output", str(out), "--baseline", "direct")
        assert second.returncode == 0, second.stderr[-3000:]
        for task in [*TASKS, EXTRA]:
            assert first_calls(lm, task["query"]) == 1, task["id"]
            assert first_calls(lm, task["query"], direct=True) == 1, task["id"]
    got = results(out / "results.jsonl")
    assert len((out / "results.jsonl").read_text().splitlines()) == 7
    assert got["late"]["score"] == 1.0
    assert {k: v["score"] for k, v in got.items() if k != "late"} == pytest.approx(EXPECTED)
    direct = results(out / "baseline-direct.jsonl")
    assert {k: v["score"] for k, v in direct.items()} == {t["id"]: float(t["id"] == "code") for t in [*TASKS, EXTRA]}
    summary = (out / "summary.md").read_text()
    assert f"| rlm | 7 | {100 * (sum(EXPECTED.values()) + 1) / 7:.1f} |" in summary
    assert f"| direct | 7 | {100 / 7:.1f} |" in summary
    assert sandbox_container_ids(owner) == set()
