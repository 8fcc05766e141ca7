"""The trajectory viewer in real headless Chromium: a static run page with sub-calls, an error
cell, a sandbox restart and a child RLM, hostile text everywhere; the live pages of
`rlm-mcp serve --transport http` updating while a run grows.

Set RLM_MCP_SCREENSHOTS=<dir> to also save a PNG of each page (the README's pictures)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio

from rlm_mcp.events import (
    LLMCall,
    LoggedEvent,
)
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store import RunStore
from rlm_mcp.viewer import render_index_html, render_run_html
from tests.chromium import Browser
from tests.fixtures_e2e import SERVER_SCRIPT
from tests.fixtures_http import server_env
from tests.fixtures_store import run_record
from tests.fixtures_viewer import (
    HOSTILE,
    inert,
    record_big_run,
    recorded_run,
    shot,
    texts,
    viewer_settings,
)


def test_static_run_page_shows_everything_and_keeps_hostile_text_inert(tmp_path: Path, browser: Browser) -> None:
    summary, events = recorded_run(tmp_path)
    page = tmp_path / "run.html"
    page.write_text(render_run_html(summary, events), encoding="utf-8")
    browser.open(page.as_uri(), ready="document.querySelectorAll('.turn').length > 0")
    inert(browser)
    # the final answer at the top, the query, the status
    assert texts(browser, ".final pre") == ["final: " + HOSTILE]
    assert HOSTILE in browser.eval("document.querySelector('h1.query').textContent")
    assert texts(browser, "main > p.meta .badge") == ["completed"]
    # five root turns, each with its reply; code highlighted (the hostile comment is a comment token)
    turns = browser.eval("[...document.querySelectorAll('main > .runbody > section.turn')].map(t => t.dataset.turn)")
    assert turns == ["1", "2", "3", "4", "5"]
    first = "main > .runbody > section.turn[data-turn='1']"
    assert HOSTILE in browser.eval(f'document.querySelector("{first} .reply").textContent')
    assert texts(browser, f"{first} pre.code .tc") == ["# " + HOSTILE]
    # the cell's output appears once, and holds the hostile print as text
    outputs = texts(browser, f"{first} pre.output")
    assert len(outputs) == 1 and HOSTILE in outputs[0]
    # sub-call answers are drawn only once their batch is opened (fast with thousands)
    assert "sub-answer to: summarise" not in browser.eval("document.getElementById('app').textContent")
    # sub-calls: one batch, expandable; each call expandable with its prompt and answer
    browser.eval(f'document.querySelector("{first} details.batch").open = true')
    browser.wait_for(f'document.querySelectorAll("{first} details.call").length === 3')
    assert "3 calls, 1 failed" in browser.eval(f'document.querySelector("{first} details.batch > summary").textContent')
    browser.eval(f'document.querySelectorAll("{first} details.call").forEach(d => d.open = true)')
    browser.wait_for(f'document.querySelectorAll("{first} .callbody").length === 3')
    assert texts(browser, f"{first} pre.prompt") == ["summarise part one", HOSTILE, "fail this one"]
    answers = texts(browser, f"{first} pre.answer")
    assert answers[:2] == ["sub-answer to: summarise part one", "sub-answer to: " + HOSTILE]
    assert (
        answers[2].startswith("Error: sub-LLM call failed")
        and browser.eval(f'document.querySelectorAll("{first} details.call.bad").length') == 1
    )
    inert(browser)
    # errors and limits highlighted with their reason
    assert "raised an exception" in texts(browser, "section.turn[data-turn='2'] .cell.bad .reason")[0]
    assert "sandbox restarted" in texts(browser, "section.turn[data-turn='3'] .cell.bad .reason")[0]
    # root-window tokens per turn, in the heading and the chart
    assert all("in window" in t for t in texts(browser, "main > .runbody > section.turn > h3 .meta"))
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
    assert texts(browser, f"{fourth} .child > pre.prompt") == ["the child task"]
    assert texts(browser, f"{fourth} .child > pre.answer") == ["child says: the child task"]
    browser.eval(f'document.querySelector("{first} details.batch").open = false')
    shot(browser, "viewer-run.png")


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
    inert(browser)
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
    inert(browser)
    first = "main > .runbody > section.turn[data-turn='1']"
    browser.eval(f'document.querySelector("{first} details.batch").open = true')
    browser.eval(f'document.querySelectorAll("{first} details.call").forEach(d => d.open = true)')
    browser.wait_for(f'document.querySelectorAll("{first} .callbody").length === 2')
    assert texts(browser, f"{first} pre.prompt") == ["first question", HOSTILE]
    assert texts(browser, f"{first} pre.answer") == ["sub says: first question", "sub says: " + HOSTILE]
    assert "raised an exception" in texts(browser, "section.turn[data-turn='2'] .cell .reason")[0]
    assert "sandbox restarted" in texts(browser, "section.turn[data-turn='3'] .cell .reason")[0]
    fourth = "main > .runbody > section.turn[data-turn='4']"
    browser.eval(f'document.querySelector("{fourth} details.childbox").open = true')
    browser.wait_for(f'document.querySelectorAll("{fourth} .child section.turn").length === 1')
    assert texts(browser, f"{fourth} .child > pre.answer") == ["child read 12 chars"]
    assert texts(browser, ".final pre.answer") == ["done"]
