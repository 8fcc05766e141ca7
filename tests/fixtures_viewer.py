"""Run records for viewer tests: the real engine (scripted model, in-process sandbox) writing
through the real run store (SQLite and files, or PostgreSQL), so the log has every event a served
run has, with hostile text in code, output, sub-call prompts and answers, and the final answer."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine, RunProgress
from rlm_mcp.events import LoggedEvent
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.chat import LMServerError
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store import RunStore
from rlm_mcp.store.ports import RunStorePort
from rlm_mcp.testing.servers import server_process
from tests.chromium import Browser
from tests.fixtures_e2e import SERVER_SCRIPT
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_context, make_limits, make_settings, repl
from tests.fixtures_store import run_record

HOSTILE = '</script><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def sub_answer(prompt: str) -> str | BaseException:
    if prompt.startswith("fail"):
        return LMServerError("HTTP 503 after retries", endpoint="http://fake/v1")
    return f"sub-answer to: {prompt}"


def hostile_root(messages: list[dict[str, str]], index: int) -> str:
    """Turn 1 sub-calls and hostile output; 2 an exception; 3 a sandbox restart; 4 a child RLM;
    5 the answer. A child answers at once."""
    if not messages[1]["content"].startswith("Answer the following"):
        return repl('answer["content"] = "child says: " + context\nanswer["ready"] = True')
    turn = sum(1 for m in messages if m["role"] == "assistant") + 1
    return {
        1: repl(
            f"# {HOSTILE}\nrs = llm_query_batched(['summarise part one', {HOSTILE!r}, 'fail this one'])\n"
            f"print({HOSTILE!r})\nprint(len(rs))",
            prose=f"I will fan out. {HOSTILE}",
        ),
        2: repl("x = 1 / 0"),
        3: repl("crash_kernel()"),
        4: repl("child = rlm_query('the child task')\nprint(child)"),
    }.get(turn, repl(f'answer["content"] = "final: " + {HOSTILE!r}\nanswer["ready"] = True'))


async def record_run(
    data_dir: Path, run_id: str = "run_viewer_1", database_url: str | None = None, **settings_overrides: Any
) -> Path:
    """Run the hostile scenario and write its record under data_dir/runs/<run_id> (the path is
    returned), or with `database_url` into that PostgreSQL database (team mode's run store)."""
    settings = make_settings(data_dir=data_dir, database_url=database_url, **settings_overrides)
    await anyio.Path(data_dir).mkdir(
        parents=True, exist_ok=True
    )  # the context file lives there (PostgreSQL makes none)
    async with make_stores(settings) as stores:
        await _record_hostile(stores.runs, settings, data_dir, run_id)
    return data_dir / "runs" / run_id


async def _record_hostile(store: RunStorePort, settings: Settings, data_dir: Path, run_id: str) -> None:
    query = f"Which part mentions {HOSTILE}?"
    log = await store.create(run_record(run_id, {"query": query, "status": "running", "model": settings.lm.model}))
    limits = make_limits(settings, max_depth=2, max_errors=5)
    progress = RunProgress(run_id=run_id, max_iterations=limits.max_iterations)
    lm = FakeChatModel(root=hostile_root, sub=sub_answer)
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory(), system_prompt="SYSTEM")
    try:
        result = await engine.run(
            run_id=run_id,
            query=query,
            contexts=[make_context(data_dir)],
            limits=limits,
            progress=progress,
            emit=log.append,
        )
        await log.write_summary(
            run_record(
                log.run_id,
                {"query": query, "status": result.status, "model": settings.lm.model, "result": result.model_dump()},
            )
        )
    finally:
        await log.aclose()


async def record_big_run(data_dir: Path, *, turns: int = 20, per_turn: int = 100, run_id: str = "run_big") -> Path:
    """A run of `turns` turns, each fanning out `per_turn` sub-calls (20 x 100 = 2,000)."""

    def root(messages: list[dict[str, str]], index: int) -> str:
        turn = sum(1 for m in messages if m["role"] == "assistant") + 1
        code = (
            f"rs = llm_query_batched(['chunk {turn}-' + str(i) + ' ' + 'text ' * 200 for i in range({per_turn})])\n"
            "print(rs[0][:80])"
        )
        if turn >= turns:
            code += '\nanswer["content"] = "done"\nanswer["ready"] = True'
        return repl(code)

    settings = make_settings(data_dir=data_dir, max_sub_calls_per_run=turns * per_turn)
    store = RunStore(settings.store)
    log = await store.create(
        run_record(run_id, {"query": "a big run", "status": "running", "model": settings.lm.model})
    )
    limits = make_limits(settings, max_iterations=turns + 1)
    progress = RunProgress(run_id=run_id, max_iterations=limits.max_iterations)
    lm = FakeChatModel(root=root, sub=lambda p: "an answer about " + p[:60] + " ..." * 50)
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory(), system_prompt="SYSTEM")
    try:
        result = await engine.run(
            run_id=run_id,
            query="a big run",
            contexts=[make_context(data_dir)],
            limits=limits,
            progress=progress,
            emit=log.append,
        )
        await log.write_summary(
            run_record(
                log.run_id,
                {
                    "query": "a big run",
                    "status": result.status,
                    "model": settings.lm.model,
                    "result": result.model_dump(),
                },
            )
        )
    finally:
        await log.aclose()
    return data_dir / "runs" / run_id


@contextlib.contextmanager
def start_http_server(env: dict[str, str], port: int) -> Iterator[str]:
    """`rlm-mcp serve --transport http` in a subprocess; yields its base URL once it accepts."""
    with server_process([str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)], port=port, env=env):
        yield f"http://127.0.0.1:{port}"


def team_env(database_url: str | None) -> dict[str, str]:
    """The environment that puts a server on PostgreSQL (none: the embedded store)."""
    return {"RLM_MCP_DATABASE_URL": database_url} if database_url else {}


def recorded_run(tmp_path: Path, database_url: str | None = None) -> tuple[RunRecord, list[LoggedEvent]]:
    """The hostile run `record_run` writes, read back: its record and events."""

    async def work() -> tuple[RunRecord, list[LoggedEvent]]:
        await record_run(tmp_path / "data", database_url=database_url)
        async with make_stores(viewer_settings(tmp_path, database_url)) as stores:
            return await stores.runs.read_summary("run_viewer_1", owner=EVERY_OWNER), await stores.runs.read_events(
                "run_viewer_1", owner=EVERY_OWNER
            )

    return anyio.run(work)


def viewer_settings(tmp_path: Path, database_url: str | None = None) -> Settings:
    return make_settings(data_dir=tmp_path / "data", database_url=database_url)


SHOTS = os.environ.get("RLM_MCP_SCREENSHOTS")  # a folder: each page's PNG saved there too (the README's pictures)


def shot(browser: Browser, name: str) -> None:
    if SHOTS:
        browser.screenshot(Path(SHOTS) / name)


def texts(browser: Browser, selector: str) -> list[str]:
    """The text of every element the CSS selector matches, in document order."""
    return browser.eval(f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)")


def inert(browser: Browser) -> None:
    """The page's hostile text ran nothing: no injected script ran, no image, only the viewer's two scripts."""
    assert browser.eval("window.__pwned === undefined")
    assert browser.eval("document.querySelectorAll('img').length") == 0
    assert browser.eval("document.scripts.length") == 2  # the data block and the viewer itself
