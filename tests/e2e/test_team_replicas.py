"""Team mode end to end: three `rlm-mcp serve --transport http` processes, each with its own
data dir (as on separate machines), on one PostgreSQL database. A context loaded on one replica
is used by a run started on another and read back on the third; upload chunks land on all
three; another token sees nothing; a delete on one reaches every replica. Real servers, the real
MCP client, real Docker for the run, the scripted LM."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_postgres import PASSWORD
from tests.fixtures_surface import ANSWER_NOW, call, call_error
from tests.fixtures_team import team_replica

pytestmark = pytest.mark.anyio

ALICE, BOB = "alice-team-token", "bob-team-token"


@contextmanager
def replica(tmp_path: Path, name: str, database_url: str, lm_url: str) -> Iterator[str]:
    # DEBUG: the most the logs say (server.log): the password must still be absent
    with team_replica(
        tmp_path / name,
        role="both",
        database_url=database_url,
        lm_url=lm_url,
        tokens=[ALICE, BOB],
        env={"RLM_MCP_LOG_LEVEL": "DEBUG"},
    ) as started:
        yield started.base


def _up(base: str) -> bool:
    try:
        httpx.get(f"{base}/mcp", timeout=2)
        return True
    except httpx.HTTPError:
        return False


@asynccontextmanager
async def as_token(base: str, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
        yield client


def viewer_on(a: str, b: str, c: str, run_id: str) -> None:
    link = httpx.post(f"{a}/runs/api/login-link", headers={"Authorization": f"Bearer {ALICE}"})
    assert link.status_code == 200, link.text
    opened = httpx.get(b + link.json()["path"], follow_redirects=False)
    assert opened.status_code == 303, opened.text
    cookie = opened.cookies.get("rlm_mcp_view")
    assert cookie
    index = httpx.get(f"{c}/runs/api/runs", cookies={"rlm_mcp_view": cookie})
    assert index.status_code == 200 and run_id in index.text
    page = httpx.get(f"{a}/runs/api/runs/{run_id}", cookies={"rlm_mcp_view": cookie})
    assert page.status_code == 200 and "what is it?" in page.text and "forty-two" in page.text
    # a spent code opens no second session, on any replica; a forged cookie fails (its MAC's
    # first character changed: every bit of it counts, so the forgery always differs)
    for base in (a, b, c):
        assert httpx.get(base + link.json()["path"], follow_redirects=False).status_code == 401
    payload, mac = cookie.split(".")
    forged = f"{payload}.{'B' if mac[0] == 'A' else 'A'}{mac[1:]}"
    assert httpx.get(f"{c}/runs/api/runs", cookies={"rlm_mcp_view": forged}).status_code in (401, 403)


async def test_three_replicas_share_contexts_runs_and_uploads(tmp_path: Path, pg_url: str) -> None:
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm, ExitStack() as stack:
        a, b, c = (stack.enter_context(replica(tmp_path, n, pg_url, lm.base_url)) for n in ("a", "b", "c"))
        for base in (a, b, c):
            await wait_until(functools.partial(_up, base), within_s=120, what=f"replica {base} to serve")
        async with as_token(a, ALICE) as on_a, as_token(b, ALICE) as on_b, as_token(c, ALICE) as on_c:
            loaded = await call(on_a, "rlm_load_context", text="the team's haystack " * 1000, name="shared")
            cid = loaded["context_id"]
            listed = await call(on_c, "rlm_list_contexts")
            assert [x["context_id"] for x in listed["contexts"]] == [cid]

            # Loaded on a, run on b (whose cache has never seen the bytes), read on c.
            done = await call(on_b, "rlm_complete", query="what is it?", context_id=cid)
            assert done["answer"] == "forty-two"
            run_id = done["run_id"]
            status = await call(on_c, "rlm_status", run_id=run_id)
            assert status["status"] == "completed"
            result = await call(on_a, "rlm_result", run_id=run_id)
            assert result["answer"] == "forty-two"
            trajectory = await on_c.read_resource(f"rlm://runs/{run_id}/trajectory")
            assert "run_start" in str(trajectory)
            meta = await on_a.read_resource(f"rlm://contexts/{cid}")
            assert "shared" in str(meta)

            # The viewer: a login link asked of a, opened on b; its cookie read on c.
            viewer_on(a, b, c, run_id)

            # An upload whose chunks land on all three replicas.
            parts = ["part one, ", "part two, ", "part three"]
            upload_id = None
            for index, (client, part) in enumerate(zip((on_a, on_b, on_c), parts, strict=True)):
                final = index == len(parts) - 1
                args = {"data": part, "index": index, "final": final, "name": "uploaded"}
                if upload_id:
                    args["upload_id"] = upload_id
                if final:
                    args["sha256"] = hashlib.sha256("".join(parts).encode()).hexdigest()
                state = await call(client, "rlm_upload_context", **args)
                upload_id = state["upload_id"]
            assert state["done"] is True

            # Another token, on any replica, finds nothing of Alice's.
            async with as_token(b, BOB) as bob:
                assert (await call(bob, "rlm_list_contexts"))["contexts"] == []
                assert "Unknown run id" in await call_error(bob, "rlm_status", run_id=run_id)
                assert "Unknown context id" in await call_error(bob, "rlm_delete_context", context_id=cid)

            # A delete on c reaches a and b.
            assert (await call(on_c, "rlm_delete_context", context_id=cid))["deleted"] is True
            for client in (on_a, on_b):
                assert cid not in {x["context_id"] for x in (await call(client, "rlm_list_contexts"))["contexts"]}
            cached = tmp_path / "b" / "data" / "cache" / loaded["sha256"][:2] / loaded["sha256"]
            await wait_until(lambda: not cached.exists(), within_s=60, what="b's cached copy to be swept")
            assert PASSWORD not in json.dumps(status) + json.dumps(result)
    # The database password never reaches a log (the servers have stopped: their logs are whole).
    for name in ("a", "b", "c"):
        assert PASSWORD not in (tmp_path / name / "server.log").read_text(errors="replace")
