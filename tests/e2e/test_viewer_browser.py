"""The trajectory viewer in real headless Chromium: a static run page with sub-calls, an error
cell, a sandbox restart and a child RLM, hostile text everywhere; the live pages of
`rlm-mcp serve --transport http` updating while a run grows.

Set RLM_MCP_SCREENSHOTS=<dir> to also save a PNG of each page (the README's pictures)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from rlm_mcp.access import owner_of_token
from rlm_mcp.events import (
    ChatMessage,
    LimitsRecord,
    LLMCall,
    LoggedEvent,
    RunEnd,
    RunEvent,
    RunStart,
    Turn,
    TurnStart,
)
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store import RunLog, RunStore
from rlm_mcp.testing.servers import free_port
from rlm_mcp.usage import TokenCount, Usage
from rlm_mcp.viewer import render_index_html, render_run_html
from tests.chromium import Browser
from tests.fixtures_e2e import SERVER_SCRIPT
from tests.fixtures_http import TOKEN, server_env
from tests.fixtures_store import run_record
from tests.fixtures_viewer import HOSTILE, record_big_run, recorded_run, start_http_server, viewer_settings

SHOTS = os.environ.get("RLM_MCP_SCREENSHOTS")


async def _reopen(store: RunStore, run_id: str) -> RunLog:
    """The run's log opened for appending, as the server that runs it holds it."""
    run_dir = store._run_dir(run_id)
    created = (await store.read_summary(run_id, owner=EVERY_OWNER)).created_at
    fh = await anyio.to_thread.run_sync(open, run_dir / "events.jsonl", "ab")
    return RunLog(run_dir, fh, created_at=created, max_event_bytes=1 << 18, max_log_bytes=1 << 26)


@pytest.fixture
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.close()


def _shot(browser: Browser, name: str) -> None:
    if SHOTS:
        browser.screenshot(Path(SHOTS) / name)


def _texts(browser: Browser, selector: str) -> list[str]:
    return browser.eval(f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)")


def _inert(browser: Browser) -> None:
    assert browser.eval("window.__pwned === undefined")
    assert browser.eval("document.querySelectorAll('img').length") == 0
    assert browser.eval("document.scripts.length") == 2  # the data block and the viewer itself


def test_static_run_page_shows_everything_and_keeps_hostile_text_inert(tmp_path: Path, browser: Browser) -> None:
    summary, events = recorded_run(tmp_path)
    page = tmp_path / "run.html"
    page.write_text(render_run_html(summary, events), encoding="utf-8")
    browser.open(page.as_uri(), ready="document.querySelectorAll('.turn').length > 0")
    _inert(browser)
    # the final answer at the top, the query, the status
    assert _texts(browser, ".final pre") == ["final: " + HOSTILE]
    assert HOSTILE in browser.eval("document.querySelector('h1.query').textContent")
    assert _texts(browser, "main > p.meta .badge") == ["completed"]
    # five root turns, each with its reply; code highlighted (the hostile comment is a comment token)
    turns = browser.eval("[...document.querySelectorAll('main > .runbody > section.turn')].map(t => t.dataset.turn)")
    assert turns == ["1", "2", "3", "4", "5"]
    first = "main > .runbody > section.turn[data-turn='1']"
    assert HOSTILE in browser.eval(f'document.querySelector("{first} .reply").textContent')
    assert _texts(browser, f"{first} pre.code .tc") == ["# " + HOSTILE]
    # the cell's output appears once, and holds the hostile print as text
    outputs = _texts(browser, f"{first} pre.output")
    assert len(outputs) == 1 and HOSTILE in outputs[0]
    # sub-call answers are drawn only once their batch is opened (fast with thousands)
    assert "sub-answer to: summarise" not in browser.eval("document.getElementById('app').textContent")
    # sub-calls: one batch, expandable; each call expandable with its prompt and answer
    browser.eval(f'document.querySelector("{first} details.batch").open = true')
    browser.wait_for(f'document.querySelectorAll("{first} details.call").length === 3')
    assert "3 calls, 1 failed" in browser.eval(f'document.querySelector("{first} details.batch > summary").textContent')
    browser.eval(f'document.querySelectorAll("{first} details.call").forEach(d => d.open = true)')
    browser.wait_for(f'document.querySelectorAll("{first} .callbody").length === 3')
    assert _texts(browser, f"{first} pre.prompt") == ["summarise part one", HOSTILE, "fail this one"]
    answers = _texts(browser, f"{first} pre.answer")
    assert answers[:2] == ["sub-answer to: summarise part one", "sub-answer to: " + HOSTILE]
    assert (
        answers[2].startswith("Error: sub-LLM call failed")
        and browser.eval(f'document.querySelectorAll("{first} details.call.bad").length') == 1
    )
    _inert(browser)
    # errors and limits highlighted with their reason
    assert "raised an exception" in _texts(browser, "section.turn[data-turn='2'] .cell.bad .reason")[0]
    assert "sandbox restarted" in _texts(browser, "section.turn[data-turn='3'] .cell.bad .reason")[0]
    # root-window tokens per turn, in the heading and the chart
    assert all("in window" in t for t in _texts(browser, "main > .runbody > section.turn > h3 .meta"))
    assert browser.eval("document.querySelectorAll('main > .runbody > svg.chart rect.bar').length") == 5
    # one time axis: turns, root calls, cells (two bad), the batch, the child
    tl = "main > .runbody > .tlbox svg.timeline"
    assert browser.eval(f"document.querySelectorAll('{tl} rect.tl.turn').length") == 5
    assert browser.eval(f"document.querySelectorAll('{tl} rect.tl.lm').length") == 5
    assert browser.eval(f"document.querySelectorAll('{tl} rect.tl.bad').length") == 2
    assert browser.eval(f"document.querySelectorAll('{tl} rect.tl.warn').length") == 1
    assert browser.eval(f"document.querySelectorAll('{tl} rect.tl.child').length") == 1
    # the child RLM, nested under the cell that started it, with its own turns
    fourth = "main > .runbody > section.turn[data-turn='4']"
    browser.eval(f'document.querySelector("{fourth} details.childbox").open = true')
    browser.wait_for(f'document.querySelectorAll("{fourth} .child section.turn").length === 1')
    assert _texts(browser, f"{fourth} .child > pre.prompt") == ["the child task"]
    assert _texts(browser, f"{fourth} .child > pre.answer") == ["child says: the child task"]
    browser.eval(f'document.querySelector("{first} details.batch").open = false')
    _shot(browser, "viewer-run.png")


def test_static_index_filters_and_searches(tmp_path: Path, browser: Browser) -> None:
    summary, _ = recorded_run(tmp_path)
    other = run_record(
        "run_other",
        {
            "query": "a quiet question",
            "status": "error",
            "result": {"status": "error", "reason": "boom", "duration_s": 2.0},
        },
        created_at=1.0,
    )
    page = tmp_path / "index.html"
    page.write_text(render_index_html([summary, other], run_href="run-"), encoding="utf-8")
    browser.open(page.as_uri(), ready="document.querySelectorAll('tr.row').length === 2")
    _inert(browser)
    visible = "[...document.querySelectorAll('tr.row')].filter(r => !r.hidden).length"
    browser.eval("{ const q = document.getElementById('q'); q.value = 'QUIET'; q.dispatchEvent(new Event('input')) }")
    assert browser.eval(visible) == 1
    browser.eval("{ const q = document.getElementById('q'); q.value = ''; q.dispatchEvent(new Event('input')) }")
    browser.eval(
        "{ const s = document.getElementById('status'); s.value = 'completed'; s.dispatchEvent(new Event('change')) }"
    )
    assert browser.eval(visible) == 1
    assert browser.eval("document.querySelector('tr.row:not([hidden]) a').getAttribute('href')") == "run-run_viewer_1"
    assert browser.eval("document.querySelectorAll('svg.spark rect').length") == 4


# -- live, over the HTTP server -------------------------------------------------------------------
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
        _inert(browser)
        home = str(browser.eval("location.pathname")).removesuffix(run_id)
        assert re.fullmatch(r"/runs/s/\w+/", home)  # the cookie's path (issue 20 item 6)
        assert _texts(browser, "main > p.meta .badge") == ["running"]
        _shot(browser, "viewer-live.png")
        browser.wait_for("document.body.dataset.live === 'stream'")  # it follows the run's event stream
        # the run takes another turn: the open page shows it without a reload
        _append(store, run_id, *_turn(run_id, 2, "second reply"))
        browser.wait_for("document.querySelectorAll('section.turn').length === 2")
        assert "second reply" in _texts(browser, "section.turn[data-turn='2'] .reply")[0]
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
        assert _texts(browser, ".final pre.answer") == ["forty-two"]
        browser.wait_for("document.body.dataset.live === 'ended'")  # the stream's end closed it
        assert all("event=" in url for url in _model_requests(browser, run_id))
        # the index, with the same cookie; it lists the run and refreshes too
        browser.open(f"{base}{home}", ready="document.querySelectorAll('tr.row').length === 1")
        _shot(browser, "viewer-index.png")
        _inert(browser)
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


def test_a_run_with_2000_sub_calls_draws_every_turn_and_opens_a_batch(tmp_path: Path, browser: Browser) -> None:
    async def work() -> tuple[RunRecord, list[LoggedEvent]]:
        await record_big_run(tmp_path / "data")
        store = RunStore(viewer_settings(tmp_path).store)
        return await store.read_summary("run_big", owner=EVERY_OWNER), await store.read_events(
            "run_big", owner=EVERY_OWNER
        )

    summary, events = anyio.run(work)
    assert sum(1 for e in events if isinstance(e, LLMCall) and e.role == "sub") == 2000
    page = tmp_path / "big.html"
    page.write_text(render_run_html(summary, events), encoding="utf-8")
    browser.open(page.as_uri(), ready="document.querySelectorAll('main > .runbody > section.turn').length === 20")
    assert browser.eval("document.querySelectorAll('details.call').length") == 0  # nothing drawn until opened
    browser.eval("document.querySelector('section.turn[data-turn=\"7\"] details.batch').open = true")
    browser.wait_for("document.querySelectorAll('section.turn[data-turn=\"7\"] details.call').length === 100")
    assert browser.eval("document.querySelectorAll('.timeline rect.tl.batch').length") == 20


# -- a real run: Docker sandbox, the scripted OpenAI-compatible server, the CLI ---------------------
def _served_root(messages: list[dict], index: int) -> str:
    if not str(messages[1]["content"]).startswith("Answer the following"):
        return '```repl\nanswer["content"] = "child read " + str(len(context)) + " chars"\nanswer["ready"] = True\n```'
    turn = sum(1 for m in messages if m["role"] == "assistant") + 1
    return {
        1: f"```repl\nrs = llm_query_batched(['first question', {HOSTILE!r}])\nprint({HOSTILE!r}, len(rs))\n```",
        2: "```repl\nraise ValueError('bad cell')\n```",
        3: "```repl\nimport os\nos._exit(1)\n```",
        4: "```repl\nc = rlm_query('a child task')\nprint(c)\n```",
    }.get(turn, '```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```')


def test_a_served_run_with_restart_and_child_is_visible(tmp_path: Path, browser: Browser) -> None:
    from rlm_mcp.testing.script import Script
    from rlm_mcp.testing.scripted_lm import ScriptedLM
    from tests.fixtures_e2e import new_instance_id

    notes = tmp_path / "notes.txt"
    notes.write_text("some text to read")
    env = {**server_env(tmp_path), "RLM_MCP_POOL_SIZE": "0", "RLM_MCP_INSTANCE_ID": new_instance_id()}
    script = Script(root_fn=_served_root, sub_fn=lambda p: "sub says: " + p)
    with ScriptedLM(script) as lm:
        proc = subprocess.run(
            [str(SERVER_SCRIPT), "run", "what is here?", "--path", str(notes), "--max-depth", "2", "--json"],
            env={**env, "RLM_MCP_BASE_URL": lm.base_url},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["run_id"]
    page = tmp_path / "served.html"
    out = subprocess.run(
        [str(SERVER_SCRIPT), "runs", "view", run_id, "-o", str(page), "--no-open"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    browser.open(page.as_uri(), ready="document.querySelectorAll('main > .runbody > section.turn').length === 5")
    _inert(browser)
    first = "main > .runbody > section.turn[data-turn='1']"
    browser.eval(f'document.querySelector("{first} details.batch").open = true')
    browser.eval(f'document.querySelectorAll("{first} details.call").forEach(d => d.open = true)')
    browser.wait_for(f'document.querySelectorAll("{first} .callbody").length === 2')
    assert _texts(browser, f"{first} pre.prompt") == ["first question", HOSTILE]
    assert _texts(browser, f"{first} pre.answer") == ["sub says: first question", "sub says: " + HOSTILE]
    assert "raised an exception" in _texts(browser, "section.turn[data-turn='2'] .cell .reason")[0]
    assert "sandbox restarted" in _texts(browser, "section.turn[data-turn='3'] .cell .reason")[0]
    fourth = "main > .runbody > section.turn[data-turn='4']"
    browser.eval(f'document.querySelector("{fourth} details.childbox").open = true')
    browser.wait_for(f'document.querySelectorAll("{fourth} .child section.turn").length === 1')
    assert _texts(browser, f"{fourth} .child > pre.answer") == ["child read 12 chars"]
    assert _texts(browser, ".final pre.answer") == ["done"]
