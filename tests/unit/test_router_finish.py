"""The finish-session call against a loopback HTTP server: it carries the endpoint's key, or
`RLM_MCP_ROUTER_API_KEY` when set; a withdrawn run's sessions are finished too; a router that never answers costs the bound, not the run's end
(nothing raises); a router that is down costs nothing; with the setting off nothing is sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from aiohttp import web

from rlm_mcp.assembly.roles import run_ends
from rlm_mcp.lm.client import LMClient
from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.settings import make_settings

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def router(*, hang: bool = False) -> AsyncIterator[tuple[str, list[tuple[str, str]]]]:
    """A stand-in for the router's /finish_session; yields its /v1 URL and what it was sent."""
    seen: list[tuple[str, str]] = []
    never = anyio.Event()

    async def finish(request: web.Request) -> web.Response:
        seen.append((request.query["session_id"], request.headers.get("Authorization", "")))
        if hang:
            await never.wait()
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/finish_session", finish)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        never.set()
        await runner.cleanup()


def client(url: str, **routing: Any) -> LMClient:
    s = make_settings(base_url=url, api_key="endpoint-key", router_sub_sessions=2, **routing)
    return LMClient(s.lm, routing=s.routing)


async def test_the_run_id_s_sessions_are_finished_with_the_endpoint_key() -> None:
    async with router() as (url, seen), client(url, router_sessions=True) as lm:
        assert await lm.finish_sessions("run_x") == 3
    assert sorted(seen) == [(s, "Bearer endpoint-key") for s in ("run_x", "run_x~sub0", "run_x~sub1")]


async def test_a_withdrawn_run_s_sessions_are_finished_through_the_assembly_s_registry() -> None:
    """A run whose first record was refused is never ended, but its first request may have gone out:
    the process's run-end registry tells the router of its withdrawal all the same."""
    async with router() as (url, seen), client(url, router_sessions=True) as lm:
        await run_ends(lm=lm).withdrawn("run_w")
    assert sorted(s for s, _ in seen) == ["run_w", "run_w~sub0", "run_w~sub1"]


async def test_the_router_key_replaces_the_endpoint_key_when_set() -> None:
    async with router() as (url, seen), client(url, router_sessions=True, router_api_key="router-key") as lm:
        await lm.finish_sessions("run_x")
    assert {auth for _, auth in seen} == {"Bearer router-key"}


async def test_a_router_that_never_answers_costs_the_bound_and_raises_nothing() -> None:
    async with (
        router(hang=True) as (url, seen),
        client(url, router_sessions=True, router_finish_timeout_s=0.2) as lm,
    ):
        with anyio.fail_after(30):  # a guard, not a measurement: the bound is 0.2 s
            assert await lm.finish_sessions("run_x") == 0
        assert len(seen) == 3  # all sent at once, none answered


async def test_a_router_that_is_down_raises_nothing() -> None:
    async with client(f"http://127.0.0.1:{free_port()}/v1", router_sessions=True) as lm:
        assert await lm.finish_sessions("run_x") == 0


async def test_nothing_is_sent_when_the_setting_is_off() -> None:
    async with router() as (url, seen), client(url) as lm:
        assert await lm.finish_sessions("run_x") == 0
        await lm.session_done("run_x.1")
    assert seen == []
