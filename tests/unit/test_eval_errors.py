"""`rlm-mcp eval` when tasks end in error, as a user types it (a task file named relative to the
current directory): context paths are taken from the task file's folder, the summary names each
cause, the command exits 1 when every task errored, and a resume runs errored tasks again unless
`--keep-errors`. No sandbox is reached: every context is missing, so no Docker is needed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rlm_mcp.eval.tasks import Task
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env

TASKS = [
    {"id": "a", "query": "q", "context_path": "ctx/missing-a.txt", "answer": "x", "scorer": "exact"},
    {"id": "b", "query": "q", "context_path": "ctx/missing-b.txt", "answer": "x", "scorer": "exact"},
]


def test_a_relative_context_path_is_absolute_from_the_task_files_folder(tmp_path: Path) -> None:
    task = Task.model_validate({"id": "t", "query": "q", "context_path": "ctx/f.txt", "answer": 1, "scorer": "exact"})
    resolved = task.resolved_context_path(Path("suite/tasks.jsonl"))
    assert resolved is not None and resolved.is_absolute()
    assert resolved == Path.cwd() / "suite" / "ctx" / "f.txt"
    absolute = task.model_copy(update={"context_path": str(tmp_path / "g.txt")})
    assert absolute.resolved_context_path(Path("suite/tasks.jsonl")) == tmp_path / "g.txt"


def _eval(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = cli_env(cwd, RLM_MCP_BASE_URL="http://127.0.0.1:9/v1", DOCKER_HOST="unix:///nonexistent/docker.sock")
    return subprocess.run(
        [str(SERVER_SCRIPT), "eval", "suite/tasks.jsonl", "--output", "out", "--plain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_task_in_error_exits_1_names_the_causes_and_runs_again_on_resume(tmp_path: Path) -> None:
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))

    first = _eval(tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]
    missing_a = str(tmp_path / "suite" / "ctx" / "missing-a.txt")
    assert "every task (2) ended in error" in first.stderr and missing_a in first.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "error 2" in summary
    assert f"| rlm | 1 | '{missing_a}' does not exist." in summary and "(a) |" in summary
    assert len(_lines(tmp_path / "out" / "results.jsonl")) == 2

    # Resume: the errored tasks run again (one more line each; the last line wins).
    second = _eval(tmp_path)
    assert second.returncode == 1
    assert sorted(str(r["id"]) for r in _lines(tmp_path / "out" / "results.jsonl")) == ["a", "a", "b", "b"]

    # --keep-errors: they count as done; nothing runs, the summary still names the causes.
    kept = _eval(tmp_path, "--keep-errors")
    assert kept.returncode == 1
    assert len(_lines(tmp_path / "out" / "results.jsonl")) == 4
    assert "[rlm] a:" not in kept.stderr and "error 2" in kept.stdout
