"""The trajectory viewer's live pages in real headless Chromium: the pages of `rlm-mcp serve
--transport http` updating while a run grows, and a run page that polls when its event stream is
refused (tests/e2e/test_viewer_browser.py has the static pages).

Set RLM_MCP_SCREENSHOTS=<dir> to also save a PNG of each page (the README's pictures)."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import httpx

from rlm_mcp.access import owner_of_token
from rlm_mcp.events import (
    ChatMessage,
    LimitsRecord,
    LLMCall,
    RunEnd,
    RunEvent,
    RunStart,
    Turn,
    TurnStart,
)
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.store import RunLog, RunStore
from rlm_mcp.testing.servers import free_port
from rlm_mcp.usage import TokenCount, Usage
from tests.chromium import Browser
from tests.fixtures_http import TOKEN, server_env
from tests.fixtures_store import run_record
from tests.fixtures_viewer import (
    HOSTILE,
    inert,
    shot,
    start_http_server,
    texts,
    viewer_settings,
)


async def _reopen(store: RunStore, run_id: str) -> RunLog:
    """The run's log opened for appending, as the server that runs it holds it."""
    run_dir = store._run_dir(run_id)
    created = (await store.read_summary(run_id, owner=EVERY_OWNER)).created_at
    fh = await anyio.to_thread.run_sync(open, run_dir / "events.jsonl", "ab")
    return RunLog(run_dir, fh, created_at=created, max_event_bytes=1 << 18, max_log_bytes=1 << 26)


def _append(store: RunStore, run_id: str, *events: RunEvent) -> None:
    async def work() -> None:
        log = await _reopen(store, run_id)
        try:
            for event in events:
                await log.append(event)
        finally:
            await log.aclose()

    anyio.run(work)


def _turn(run_id: str, n: int, reply: str) -> list[RunEvent]:
    return [
        TurnStart(run_id=run_id, iteration=n, max_iterations=20, depth=0),
        LLMCall(
            run_id=run_id,
            role="root",
            iteration=n,
            model="m",
            prompt_tokens=100 * n,
            completion_tokens=10,
            latency_s=0.01,
            status="ok",
            finish_reason="stop",
            error=None,
            depth=0,
        ),
        Turn(run_id=run_id, iteration=n, depth=0, new_messages=[ChatMessage(role="assistant", content=reply)]),
    ]


def test_live_pages_update_while_the_run_runs(tmp_path: Path, browser: Browser) -> None:
    port = free_port()
    env = server_env(tmp_path, RLM_MCP_AUTH_TOKEN=TOKEN)
    store = RunStore(viewer_settings(tmp_path).store)
    run_id = "run_live_1"

    async def create() -> None:
        # A run this token started, as the server records it: the token's session may see it.
        summary = {"query": "live question", "status": "running", "model": "m", "owner": owner_of_token(TOKEN)}
        log = await store.create(run_record(run_id, summary))
        await log.append(
            RunStart(
                run_id=run_id,
                depth=0,
                query="live question",
                contexts=[],
                limits=LimitsRecord(max_iterations=20, max_depth=1, timeout_s=900, token_budget=None, max_errors=3),
                model="m",
                sub_model="m",
                prompt_profile="rlm-mcp",
            )
        )
        await log.aclose()

    anyio.run(create)
    _append(store, run_id, *_turn(run_id, 1, "first reply " + HOSTILE))
    with start_http_server(env, port) as base:
        # a browser gets in only through a one-time link, fetched with the bearer token
        link = httpx.post(f"{base}/runs/api/login-link", headers={"Authorization": f"Bearer {TOKEN}"}).json()["path"]
        assert TOKEN not in link
        browser.open(f"{base}{link}&run={run_id}", ready="document.querySelectorAll('section.turn').length === 1")
        inert(browser)
        home = str(browser.eval("location.pathname")).removesuffix(run_id)
        assert re.fullmatch(r"/runs/s/\w+/", home)  # the cookie's path (issue 20 item 6)
        assert texts(browser, "main > p.meta .badge") == ["running"]
        shot(browser, "viewer-live.png")
        browser.wait_for("document.body.dataset.live === 'stream'")  # it follows the run's event stream
        # the run takes another turn: the open page shows it without a reload
        _append(store, run_id, *_turn(run_id, 2, "second reply"))
        browser.wait_for("document.querySelectorAll('section.turn').length === 2")
        assert "second reply" in texts(browser, "section.turn[data-turn='2'] .reply")[0]
        # Every request for the model was caused by a stream event (it names it): none was a poll.
        asked = _model_requests(browser, run_id)
        assert asked and all(re.search(r"[?&]event=\d+-\d+(&|$)", url) for url in asked), asked
        # A hidden tab gives its stream back; shown again, it follows a new one (which brings
        # the turn taken meanwhile).
        _set_hidden(browser, True)
        browser.wait_for("document.body.dataset.live === 'hidden'")
        _append(store, run_id, *_turn(run_id, 3, "third reply"))
        _set_hidden(browser, False)
        browser.wait_for("document.querySelectorAll('section.turn').length === 3")
        assert browser.eval("document.body.dataset.live") == "stream"
        # and it ends: the answer appears at the top
        usage = Usage(total=TokenCount(prompt_tokens=300, completion_tokens=20, calls=2), by_model={})
        _append(
            store,
            run_id,
            RunEnd(run_id=run_id, status="completed", reason=None, iterations=3, usage=usage, duration_s=1.0, depth=0),
        )
        anyio.run(_finish, store, run_id)
        browser.wait_for("document.querySelector('.final pre.answer') !== null")
        assert texts(browser, ".final pre.answer") == ["forty-two"]
        browser.wait_for("document.body.dataset.live === 'ended'")  # the stream's end closed it
        assert all("event=" in url for url in _model_requests(browser, run_id))
        # the index, with the same cookie; it lists the run and refreshes too
        browser.open(f"{base}{home}", ready="document.querySelectorAll('tr.row').length === 1")
        shot(browser, "viewer-index.png")
        inert(browser)
        # a spent link does not log anyone in again
        again = httpx.get(f"{base}{link}", follow_redirects=False)
        assert again.status_code == 401


def _set_hidden(browser: Browser, hidden: bool) -> None:
    """The page's tab hidden or shown, as the page sees it (`document.hidden`, its event)."""
    value = "true" if hidden else "false"
    browser.eval(
        f"Object.defineProperty(document, 'hidden', {{configurable: true, get: () => {value}}});"
        "document.dispatchEvent(new Event('visibilitychange')); true"
    )


def _model_requests(browser: Browser, run_id: str) -> list[str]:
    """The URLs of the requests the page made for the run's model, from the browser's own record
    of its network requests (Resource Timing)."""
    names = browser.eval("performance.getEntriesByType('resource').map((e) => e.name)")
    return [url for url in names if f"/api/runs/{run_id}?" in url]


def test_a_live_run_page_polls_when_its_stream_is_refused(tmp_path: Path, browser: Browser) -> None:
    """One event stream per owner, held by a program: the page's is answered 429, and the page
    still follows the run, by polling."""
    port = free_port()
    env = server_env(tmp_path, RLM_MCP_AUTH_TOKEN=TOKEN, RLM_MCP_EVENT_STREAMS_PER_OWNER="1")
    store = RunStore(viewer_settings(tmp_path).store)
    run_id = "run_live_1"
    anyio.run(_create_live, store, run_id)
    _append(store, run_id, *_turn(run_id, 1, "first reply"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with (
        start_http_server(env, port) as base,
        httpx.Client(base_url=base, headers=auth, timeout=30) as http,
        http.stream("GET", f"/runs/api/runs/{run_id}/events") as held,
    ):
        assert held.status_code == 200  # the owner's one stream
        link = http.post("/runs/api/login-link").json()["path"]
        browser.open(f"{base}{link}&run={run_id}", ready="document.querySelectorAll('section.turn').length === 1")
        browser.wait_for("document.body.dataset.live === 'poll'")
        _append(store, run_id, *_turn(run_id, 2, "second reply"))
        browser.wait_for("document.querySelectorAll('section.turn').length === 2")
        assert any("event=" not in url for url in _model_requests(browser, run_id))  # polled


async def _create_live(store: RunStore, run_id: str) -> None:
    """A running run this token started, as the server records it."""
    summary = {"query": "live question", "status": "running", "model": "m", "owner": owner_of_token(TOKEN)}
    log = await store.create(run_record(run_id, summary))
    await log.aclose()


async def _finish(store: RunStore, run_id: str) -> None:
    log = await _reopen(store, run_id)
    try:
        await log.write_summary(
            run_record(
                log.run_id,
                {
                    "query": "live question",
                    "status": "completed",
                    "model": "m",
                    "owner": owner_of_token(TOKEN),
                    "result": {
                        "status": "completed",
                        "answer": "forty-two",
                        "reason": None,
                        "run_id": run_id,
                        "iterations": 2,
                        "usage": {},
                        "duration_s": 1.0,
                        "sub_calls": 0,
                    },
                },
            )
        )
    finally:
        await log.aclose()
