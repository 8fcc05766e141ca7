"""HTTP safe on every bind (issue 14 items 7 and 11): Host and Origin checked against the actual
bind, several tokens each their own owner, sessions capped per owner. Real uvicorn servers on
loopback addresses, raw HTTP requests."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rlm_mcp.access import HostPolicy
from rlm_mcp.assembly import make_stores
from rlm_mcp.server.http import build_worker_app
from tests.fixtures_http import INIT, MCP_HEADERS, http_settings, serving

pytestmark = pytest.mark.anyio

LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


async def initialize(client: httpx.AsyncClient, url: str, **headers: str) -> httpx.Response:
    return await client.post(url, json=INIT, headers={**MCP_HEADERS, **headers})


def test_host_policy_follows_the_bind() -> None:
    p = HostPolicy("127.0.0.2", 8765, [], [])
    assert p.host_ok("127.0.0.2:8765") and p.host_ok("localhost:8765")
    assert not p.host_ok("evil.example:8765") and not p.host_ok("127.0.0.2:9999") and not p.host_ok("127.0.0.1:8765")
    assert p.origin_ok(None) and p.origin_ok("http://127.0.0.2:8765")
    assert not p.origin_ok("http://evil.example") and not p.origin_ok("http://localhost:3000")
    assert not p.origin_ok("null")
    assert HostPolicy("127.0.0.2", 8765, [], ["http://localhost:3000"]).origin_ok("http://localhost:3000")
    v6 = HostPolicy("0:0:0:0:0:0:0:1", 8765, [], [])
    assert v6.host_ok("[::1]:8765") and v6.host_ok("[0:0:0:0:0:0:0:1]:8765") and not v6.host_ok("evil.example:8765")
    anywhere = HostPolicy("0.0.0.0", 8765, ["mcp.example.org"], [])
    assert anywhere.host_ok("203.0.113.5:8765") and anywhere.host_ok("mcp.example.org")
    assert not anywhere.host_ok("evil.example:8765")


@pytest.mark.parametrize("host", ["127.0.0.2", "0:0:0:0:0:0:0:1"])
async def test_rebinding_requests_are_refused_on_every_loopback_bind(tmp_path: Path, host: str) -> None:
    settings = http_settings(tmp_path, host)
    async with serving(settings) as url, httpx.AsyncClient(timeout=30) as client:
        evil_host = await initialize(client, url, host=f"evil.example:{settings.server.port}")
        assert evil_host.status_code == 421
        evil_origin = await initialize(client, url, origin="http://evil.example")
        assert evil_origin.status_code == 403
        other_local = await initialize(client, url, origin="http://localhost:3000")
        assert other_local.status_code == 403
        fine = await initialize(client, url)
        assert fine.status_code == 200 and fine.headers.get("mcp-session-id")


async def test_metrics_are_behind_the_host_and_origin_check(tmp_path: Path) -> None:
    # The default local set-up (loopback, no token): a page that rebound its name to 127.0.0.1
    # must not read /metrics, on an MCP server or a team worker's listener.
    settings = http_settings(tmp_path, "127.0.0.1")
    base = f"http://127.0.0.1:{settings.server.port}"
    async with serving(settings), httpx.AsyncClient(timeout=30) as client:
        rebound = await client.get(f"{base}/metrics", headers={"host": f"evil.example:{settings.server.port}"})
        assert rebound.status_code == 421 and "rlm_mcp_" not in rebound.text
        framed = await client.get(f"{base}/metrics", headers={"origin": "http://evil.example"})
        assert framed.status_code == 403 and "rlm_mcp_" not in framed.text
        scraped = await client.get(f"{base}/metrics")  # a scraper names the address it scrapes
        assert scraped.status_code == 200 and "rlm_mcp_" in scraped.text
    worker = build_worker_app(settings, make_stores(settings))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=worker), base_url=base) as client:
        rebound = await client.get("/metrics", headers={"host": "evil.example"})
        assert rebound.status_code == 421 and "rlm_mcp_" not in rebound.text
        assert (await client.get("/metrics")).status_code == 200


async def test_a_misdirected_request_names_the_setting_that_fixes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Behind a balancer that forwards the public name, the replica's 421 and its log say what to set.
    settings = http_settings(tmp_path, "127.0.0.1")
    async with serving(settings) as url, httpx.AsyncClient(timeout=30) as client:
        with caplog.at_level("WARNING", logger="rlm_mcp.server"):
            for _ in range(3):
                refused = await initialize(client, url, host="rlm.example.com")
                assert refused.status_code == 421
        assert "RLM_MCP_PUBLIC_URL=https://" in refused.json()["detail"]
        logged = [r.getMessage() for r in caplog.records if "421" in r.getMessage()]
        assert len(logged) == 1, logged  # once per name, however many requests
        assert "RLM_MCP_PUBLIC_URL=https://rlm.example.com" in logged[0]
    public = http_settings(tmp_path, "127.0.0.1", public_url="https://rlm.example.com")
    async with serving(public) as url, httpx.AsyncClient(timeout=30) as client:
        assert (await initialize(client, url, host="rlm.example.com")).status_code == 200


async def test_a_session_flood_displaces_only_the_flooders_own_sessions(tmp_path: Path) -> None:
    cap = 4
    settings = http_settings(
        tmp_path, "127.0.0.1", auth_tokens=["alice-token", "bob-token"], http_sessions_per_client=cap
    )
    alice = {"authorization": "Bearer alice-token"}
    bob = {"authorization": "Bearer bob-token"}
    async with serving(settings) as url, httpx.AsyncClient(timeout=30) as client:
        bob_init = await initialize(client, url, **bob)
        assert bob_init.status_code == 200
        bob_session = bob_init.headers["mcp-session-id"]
        flood = []
        for _ in range(cap * 25):  # 100 initialize requests from one token
            response = await initialize(client, url, **alice)
            assert response.status_code == 200  # never 503: the flooder's oldest session makes room
            flood.append(response.headers["mcp-session-id"])

        async def tools_list(session: str, who: dict[str, str]) -> int:
            headers = {**MCP_HEADERS, **who, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
            return (await client.post(url, json=LIST, headers=headers)).status_code

        assert await tools_list(bob_session, bob) == 200  # the other owner's session is untouched
        assert await tools_list(flood[-1], alice) == 200  # the newest sessions live
        assert await tools_list(flood[0], alice) == 404  # the oldest were closed by the server itself
        assert await tools_list(bob_session, alice) == 404  # a session belongs to the token that opened it
        no_token = await initialize(client, url)
        assert no_token.status_code == 401
