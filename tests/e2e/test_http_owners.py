"""Over HTTP with tokens, contexts and runs belong to the token that made them (issue 14 item 11):
another token gets "not found" from every tool and resource, and identical bytes stored by two
tokens reveal nothing across them. A real uvicorn server on loopback, the real MCP client over
streamable HTTP, real Docker for the run, the scripted LM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port
from tests.fixtures_e2e import sandbox_container_ids
from tests.fixtures_http import as_token, resource_error, serving
from tests.fixtures_surface import STUCK, call, call_error, make_settings, resource_text

pytestmark = pytest.mark.anyio


async def names(client: Client) -> dict[str, str]:
    listed: dict[str, Any] = await call(client, "rlm_list_contexts")
    return {c["context_id"]: c["name"] for c in listed["contexts"]}


async def test_another_token_finds_nothing_of_the_first(tmp_path: Path, database_url: str | None) -> None:
    """Against both stores: the embedded one and PostgreSQL (team mode)."""
    with ScriptedLM(Script(root=[STUCK])) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            host="127.0.0.1",
            port=free_port("127.0.0.1"),
            auth_tokens=["alice-token", "bob-token"],
            database_url=database_url,
        )
        async with serving(settings) as url, as_token(url, "alice-token") as alice, as_token(url, "bob-token") as bob:
            mine = await call(alice, "rlm_load_context", text="the shared bytes", name="alice's plan")
            cid = mine["context_id"]
            started = await call(alice, "rlm_start", query="q", context_id=cid, timeout_s=300)
            run_id = started["run_id"]

            # Bob sees neither the context nor the run, through any tool or resource.
            assert await names(bob) == {}
            assert "Unknown context id" in await call_error(bob, "rlm_delete_context", context_id=cid)
            assert "Unknown context id" in await call_error(bob, "rlm_start", query="q", context_id=cid)
            assert "Unknown context id" in await call_error(bob, "rlm_complete", query="q", context_id=[cid])
            assert "Unknown context id" in await resource_error(bob, f"rlm://contexts/{cid}")
            for tool in ("rlm_status", "rlm_result", "rlm_cancel"):
                assert "Unknown run id" in await call_error(bob, tool, run_id=run_id)
            for suffix in ("", "/trajectory", "/answer"):
                assert "Unknown run id" in await resource_error(bob, f"rlm://runs/{run_id}{suffix}")

            # The same bytes stored by Bob: the same id, his own name; Alice's stays hers.
            his = await call(bob, "rlm_load_context", text="the shared bytes", name="bob's copy")
            assert his["context_id"] == cid
            assert await names(bob) == {cid: "bob's copy"}
            assert await names(alice) == {cid: "alice's plan"}
            # Bob deletes his copy: Alice's context (in use by her run) is untouched, and Bob
            # learns nothing about her run from it.
            assert (await call(bob, "rlm_delete_context", context_id=cid))["deleted"] is True
            assert await names(bob) == {}
            assert json.loads(resource_text(await alice.read_resource(f"rlm://contexts/{cid}")))["name"] == (
                "alice's plan"
            )

            # Alice's run is hers to see and cancel.
            assert (await call(alice, "rlm_status", run_id=run_id))["status"] in ("queued", "running")
            assert (await call(alice, "rlm_cancel", run_id=run_id))["status"] == "cancelled"
            summary = json.loads(resource_text(await alice.read_resource(f"rlm://runs/{run_id}")))
            assert summary["status"] == "cancelled"
            assert "Unknown run id" in await call_error(bob, "rlm_result", run_id=run_id)
    assert sandbox_container_ids(str(settings.sandbox.instance_id)) == set()
