"""A kept session in the viewer and its usage: a real uvicorn server on loopback with two tokens,
the real MCP client over streamable HTTP, real Docker sandboxes, the scripted LM, headless
Chromium (RLM_MCP_SCREENSHOTS=<dir> saves a PNG of the page). Alice's two-run session is a chain on its page (each run's question, answer, the
`context_i` it bound, its usage), reached from the run page and the index; the session's summed
usage (with the cost of the price table) is the same in `rlm_list_sessions`, the session resource
and the page; Bob gets "unknown" everywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import httpx
import pytest

from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port
from tests.chromium import Browser
from tests.fixtures_e2e import cli
from tests.fixtures_http import as_token, resource_error, serving
from tests.fixtures_surface import SCRIPT, call, call_error, make_settings, resource_text
from tests.fixtures_viewer import texts

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

MODEL = "rlm-v0.1"  # the settings' default root model, which the scripted LM answers as
SHOTS = os.environ.get("RLM_MCP_SCREENSHOTS")  # a folder: also save a PNG of the session page
PRICES = json.dumps({MODEL: {"input": 2.0, "output": 8.0}})  # USD per million tokens


def _hrefs(browser: Browser, selector: str) -> list[str]:
    return browser.eval(f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.pathname)")


async def test_a_kept_session_is_a_chain_of_its_runs_with_their_usage(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            pool_size=0,
            host="127.0.0.1",
            port=free_port("127.0.0.1"),
            auth_tokens=["alice-token", "bob-token"],
            model_prices=PRICES,
        )
        async with serving(settings) as url, as_token(url, "alice-token") as alice, as_token(url, "bob-token") as bob:
            first = (await call(alice, "rlm_load_context", text="alpha beta alpha gamma"))["context_id"]
            second = (await call(alice, "rlm_load_context", text="second context body"))["context_id"]
            one = await call(alice, "rlm_complete", query="FIRST-Q", context_id=first, keep_session=True)
            sid = one["session_id"]
            two = await call(alice, "rlm_complete", query="SECOND-Q", context_id=second, session_id=sid)
            assert two["status"] == "completed" and two["answer"] == "2|second|6|True"

            # The session's usage: its two runs' together, cost included (the price table has the model).
            spent = [
                json.loads(resource_text(await alice.read_resource(f"rlm://runs/{r['run_id']}")))["result"]["usage"]
                for r in (one, two)
            ]
            listed = (await call(alice, "rlm_list_sessions"))["sessions"]
            usage = listed[0]["usage"]["total"]
            assert usage["calls"] == 4
            assert usage["prompt_tokens"] == sum(u["total"]["prompt_tokens"] for u in spent)
            assert usage["completion_tokens"] == sum(u["total"]["completion_tokens"] for u in spent)
            assert usage["cost_usd"] == pytest.approx(sum(u["total"]["cost_usd"] for u in spent))
            assert usage["cost_usd"] == pytest.approx(
                (usage["prompt_tokens"] * 2.0 + usage["completion_tokens"] * 8.0) / 1e6
            )
            resource = json.loads(resource_text(await alice.read_resource(f"rlm://sessions/{sid}")))
            assert resource["usage"] == listed[0]["usage"]

            site = url.removesuffix("/mcp")
            async with httpx.AsyncClient(base_url=site, timeout=30) as http:
                as_alice = {"Authorization": "Bearer alice-token"}
                model = (await http.get(f"/runs/api/runs/{sid}", headers=as_alice)).json()["data"]
                assert [r["run_id"] for r in model["runs"]] == [one["run_id"], two["run_id"]]
                assert [r["query"] for r in model["runs"]] == ["FIRST-Q", "SECOND-Q"]
                assert [r["contexts"] for r in model["runs"]] == [
                    [{"name": "context_0", "context_id": first}],
                    [{"name": "context_1", "context_id": second}],
                ]
                assert model["runs"][1]["answer"] == "2|second|6|True"
                assert model["usage"] == listed[0]["usage"]
                state = model["state"]
                assert state["state"] == "live" and state["sandbox_live"] is True and state["histories"] == 2
                assert state["context_bytes"] == len("alpha beta alpha gamma") + len("second context body")

                # Bob: unknown, as for an id nobody issued.
                as_bob = {"Authorization": "Bearer bob-token"}
                for path in (f"/runs/api/runs/{sid}", f"/runs/{sid}"):
                    refused = await http.get(path, headers=as_bob)
                    assert refused.status_code == 404 and "Unknown session id" in refused.text
                assert (await call(bob, "rlm_list_sessions"))["sessions"] == []
                assert "Unknown session id" in await resource_error(bob, f"rlm://sessions/{sid}")
                assert "Unknown session id" in await call_error(bob, "rlm_complete", query="SECOND-Q", session_id=sid)
                link = (await http.post("/runs/api/login-link", headers=as_alice)).json()["path"]

            def look() -> None:
                browser = Browser()
                try:
                    browser.open(
                        f"{site}{link}&run={sid}", ready="document.querySelectorAll('ol.chain > li').length === 2"
                    )
                    assert texts(browser, "ol.chain .linkhead a.query") == ["FIRST-Q", "SECOND-Q"]
                    binds = texts(browser, "ol.chain .binds")
                    assert binds[0].startswith("binds context_0") and binds[1].startswith("binds context_1")
                    assert texts(browser, "ol.chain pre.answer") == ["built", "2|second|6|True"]
                    assert texts(browser, "main > p.meta .badge") == ["live"]
                    assert "2 runs · 2 contexts bound" in texts(browser, "main > p.summary")[0]
                    if SHOTS:
                        browser.screenshot(Path(SHOTS) / "viewer-session.png")
                    home = str(browser.eval("location.pathname")).removesuffix(sid)
                    assert _hrefs(browser, "ol.chain .linkhead a.query") == [home + one["run_id"], home + two["run_id"]]
                    # From a run of the session, its page links back to the chain; so do the index's rows.
                    browser.open(site + home + two["run_id"], ready="document.querySelector('a.session-link') !== null")
                    assert _hrefs(browser, "a.session-link") == [home + sid]
                    browser.open(site + home, ready="document.querySelectorAll('tr.row').length === 2")
                    assert _hrefs(browser, "tr.row a.session-link") == [home + sid, home + sid]
                finally:
                    browser.close()

            await anyio.to_thread.run_sync(look)

            # A closed session: its chain stays, and the page says it ended and why.
            other = await call(alice, "rlm_complete", query="FIRST-Q", context_id=first, keep_session=True)
            await call(alice, "rlm_close_session", session_id=other["session_id"])
            async with httpx.AsyncClient(base_url=site, timeout=30) as http:
                shown = await http.get(f"/runs/api/runs/{other['session_id']}", headers=as_alice)
            closed = shown.json()["data"]
            assert [r["run_id"] for r in closed["runs"]] == [other["run_id"]]
            assert closed["state"] == {"session_id": other["session_id"], "state": "ended", "why": "was closed"}

    # The server stopped: the session is stored in the data dir; the CLI lists it with its usage.
    listed_cli = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "sessions", "list", RLM_MCP_MODEL_PRICES=PRICES))
    assert listed_cli.returncode == 0, listed_cli.stderr
    (line,) = [x for x in listed_cli.stdout.splitlines() if sid in x]
    assert "2 runs" in line and f"{usage['prompt_tokens']:,}+{usage['completion_tokens']:,} tokens" in line
    assert line.endswith(f"${usage['cost_usd']:.4f}")
    # And a static page of the session, from the records alone (no state: nothing holds it).
    page = tmp_path / "session.html"
    made = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "runs", "view", sid, "-o", str(page), "--no-open"))
    assert made.returncode == 0, made.stderr

    def look_static() -> None:
        browser = Browser()
        try:
            browser.open(page.as_uri(), ready="document.querySelectorAll('ol.chain > li').length === 2")
            assert texts(browser, "main > p.meta .badge") == ["unknown here"]
        finally:
            browser.close()

    await anyio.to_thread.run_sync(look_static)
