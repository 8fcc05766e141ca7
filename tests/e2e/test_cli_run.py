"""`rlm-mcp run` and `runs list|html` as a person meets them: relative paths, an answer and a
summary (or --json), progress lines without HTTP request logs, where the page was written."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env

ANSWER = '```repl\nanswer["content"] = "cli:" + context.strip()\nanswer["ready"] = True\n```'


def cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = cli_env(cwd, **env)
    return subprocess.run(
        [str(SERVER_SCRIPT), *args],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_run_reads_a_relative_path_and_prints_the_answer(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("relative works\n")
    with ScriptedLM(Script(root=[ANSWER])) as lm:
        # INFO would show httpx's "HTTP Request: ..." line per request if it were not silenced.
        proc = cli(
            tmp_path,
            "run",
            "What does it say?",
            "--path",
            "notes.txt",
            RLM_MCP_BASE_URL=lm.base_url,
            RLM_MCP_LOG_LEVEL="INFO",
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "cli:relative works\n"
    assert "turn 1/20" in proc.stderr  # plain progress lines: stderr is not a terminal
    assert "HTTP Request" not in proc.stderr and "\x1b[" not in proc.stderr
    assert re.search(r"completed · 1 turn · 0 sub-calls · [\d,]+ tokens · [\d.]+ s · run run_", proc.stderr)


def test_runs_list_and_html(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("listed\n")
    with ScriptedLM(Script(root=[ANSWER])) as lm:
        run = cli(
            tmp_path,
            "run",
            "A question   spread\nover lines",
            "--path",
            "notes.txt",
            "--json",
            RLM_MCP_BASE_URL=lm.base_url,
        )
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout)["run_id"]
    listed = cli(tmp_path, "runs", "list").stdout.splitlines()
    assert re.fullmatch(r"RUN ID +STARTED +DURATION +COST  STATUS +QUERY", listed[0]), listed  # a header row first
    assert re.fullmatch(
        rf"{run_id}  \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d +[\d.]+ s +-  completed +A question spread over lines",
        listed[1],
    ), listed  # no price table: no cost, a dash
    assert listed[0].index("STATUS") == listed[1].index("completed"), listed  # the columns line up
    page = cli(tmp_path, "runs", "html", run_id)
    written = tmp_path / f"rlm-run-{run_id}.html"
    assert page.returncode == 0 and page.stdout == f"wrote {written}\n", page.stdout + page.stderr
    assert "A question" in written.read_text()
