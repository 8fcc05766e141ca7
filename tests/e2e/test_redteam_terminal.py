"""Issue 20 items 4 and 5: text a model, a context or another owner wrote reaches a person's
terminal with its controls shown, never obeyed: `rlm-mcp run`'s answer, `runs list`,
`contexts list` and `eval`'s progress, summary and final error line. `--json` stays exact. The commands run under
a real pty, as the red team ran them."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.eval.display import PlainDisplay, Tally
from rlm_mcp.eval.results import TaskResult
from rlm_mcp.owners import Owner
from rlm_mcp.store import ContextStore, RunStore
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.visible import visible, visible_line
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.fixtures_pty import run_in_pty
from tests.fixtures_store import run_record

# What the red team sent: clipboard write, title, clear screen, a hidden link, a carriage-return
# overwrite, a C1 CSI, a bidi override.
HOSTILE = (
    "\x1b]52;c;cm0gLXJmIH4=\x07"
    "\x1b]0;pwned\x07"
    "\x1b[2J"
    "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
    "safe\rFAKE"
    "\x9b31m"
    "\u202eabc"
)
RAW = [b"\x1b]52", b"\x1b]0;", b"\x1b[2J", b"\x1b]8;", b"\rFAKE", "\x9b".encode(), "\u202e".encode()]


def assert_contained(out: bytes) -> None:
    for raw in RAW:
        assert raw not in out, (raw, out)
    assert b"\\x1b]52;c;cm0gLXJmIH4=\\x07" in out  # seen, as its escapes


def test_visible_shows_controls_and_keeps_newline_and_tab() -> None:
    assert visible("a\tb\nc") == "a\tb\nc"
    assert visible("\x1b[2J\x00\x7f\x85\u2066") == "\\x1b[2J\\x00\\x7f\\x85\\u2066"
    assert visible("grüße — 日本 🎉") == "grüße — 日本 🎉"
    assert visible_line("a\tb\nc\rd") == "a\\x09b\\x0ac\\x0dd"


def _settings(tmp_path: Path) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path / "data", allowed_roots=[tmp_path])


def _cli(tmp_path: Path, *args: str, **env: str) -> bytes:
    status, out = run_in_pty([str(SERVER_SCRIPT), *args], env=cli_env(tmp_path, **env), cwd=tmp_path)
    assert status == 0, out
    return out


def test_contexts_list_shows_a_hostile_name(tmp_path: Path) -> None:
    store = ContextStore(_settings(tmp_path).store)
    anyio.run(
        lambda: store.put_bytes(b"x", name=HOSTILE + "\nforged-row", format="text", source={}, owner=Owner("token-x"))
    )
    out = _cli(tmp_path, "contexts", "list")
    assert_contained(out)
    assert len(out.strip().splitlines()) == 2  # the header and one row: a newline in the name forges none


def test_runs_list_shows_a_hostile_query(tmp_path: Path) -> None:
    async def record() -> None:
        log = await RunStore(_settings(tmp_path).store).create(
            run_record("run_0123456789ab", {"query": HOSTILE, "status": "completed"})
        )
        await log.aclose()

    anyio.run(record)
    out = _cli(tmp_path, "runs", "list")
    assert_contained(out)


def test_eval_progress_and_summary_show_hostile_task_ids() -> None:
    stream = io.StringIO()
    display = PlainDisplay(Tally(1, []), stream)
    display.started(HOSTILE)
    display.finished(TaskResult(id=HOSTILE, status="completed", answer="a", expected="a", scorer="exact", score=1.0))
    assert_contained(stream.getvalue().encode())


ANSWER = "```repl\nanswer['content'] = " + json.dumps(HOSTILE) + " + context\nanswer['ready'] = True\n```"


def test_run_shows_a_hostile_answer_and_json_stays_exact(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text(" tail")
    with ScriptedLM(Script(root=[ANSWER, ANSWER])) as lm:
        out = _cli(tmp_path, "run", "q", "--path", "notes.txt", RLM_MCP_BASE_URL=lm.base_url)
        assert_contained(out)
        assert b" tail" in out
        # The status line counts what the run spent (it used to say "1 turns" and "0 tokens").
        assert re.search(r"completed · 1 turn · 0 sub-calls · [1-9][\d,]* tokens · ", out.decode()), out
        status, exact = run_in_pty(
            [str(SERVER_SCRIPT), "run", "q", "--path", "notes.txt", "--json"],
            env=cli_env(tmp_path, RLM_MCP_BASE_URL=lm.base_url),
            cwd=tmp_path,
        )
    assert status == 0, exact
    start = exact.index(b"{")
    # The pty turns "\n" into "\r\n"; JSON escapes every control itself, so the bytes are plain.
    result = json.loads(exact[start:].replace(b"\r\n", b"\n"))
    assert result["answer"] == HOSTILE + " tail"


def test_eval_shows_a_hostile_first_error_when_every_task_failed(tmp_path: Path) -> None:
    # The one cause `eval` prints on stderr when every task ended in error quotes the task's
    # context path: a downloaded task file chooses it (a newline in it must forge no line either).
    (tmp_path / "suite").mkdir()
    task = {"id": "t", "query": "q", "context_path": f"ctx/{HOSTILE}\nFORGED.txt", "answer": "x", "scorer": "exact"}
    (tmp_path / "suite" / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    env = cli_env(tmp_path, RLM_MCP_BASE_URL="http://127.0.0.1:9/v1", DOCKER_HOST="unix:///nonexistent/docker.sock")
    done = subprocess.run(  # bytes: text mode would turn a raw "\r" into "\n"
        [str(SERVER_SCRIPT), "eval", "suite/tasks.jsonl", "--output", "out", "--plain"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert b"every task (1) ended in error" in done.stderr
    assert_contained(done.stderr)
    assert b"\nFORGED" not in done.stderr and b"\\x0aFORGED" in done.stderr
