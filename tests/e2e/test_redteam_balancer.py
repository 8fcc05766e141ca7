"""The shipped HAProxy configuration against a session flood (reliability and security round
four): each token may create 30 MCP sessions a minute through the balancer; past that, its
requests without a session get 429, so it cannot fill the stick table and unpin other users'
sessions. Its open sessions and every other token keep working. Real HAProxy (Debian's), two
replicas on one PostgreSQL database, raw MCP over TLS."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from tests.fixtures_haproxy import balanced_replicas
from tests.fixtures_http import INIT, MCP_HEADERS

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

FLOODER, VICTIM = "flooding-token", "victim-token"
NO_LM = "http://127.0.0.1:9/v1"
LIMIT = 30  # sessions a token may create per minute (deploy/haproxy/haproxy.cfg)


def _headers(token: str, session: str | None = None) -> dict[str, str]:
    extra = {"mcp-session-id": session, "mcp-protocol-version": "2025-06-18"} if session else {}
    return {**MCP_HEADERS, "authorization": f"Bearer {token}", **extra}


async def _open(client: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
    init = {**INIT, "params": {**INIT["params"], "protocolVersion": "2025-06-18"}}  # type: ignore[dict-item]
    return await client.post(url, json=init, headers=_headers(token))


async def _list_tools(client: httpx.AsyncClient, url: str, token: str, session: str) -> int:
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await client.post(url, json=note, headers=_headers(token, session))
    listed = await client.post(
        url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=_headers(token, session)
    )
    return listed.status_code


async def test_one_token_cannot_create_sessions_past_its_rate(tmp_path: Path, pg_url: str) -> None:
    with balanced_replicas(
        tmp_path, database_url=pg_url, lm_url=NO_LM, tokens=[FLOODER, VICTIM], count=2, roles=["front", "front"]
    ) as balanced:
        url = f"{balanced.url}/mcp"
        tls = ssl.create_default_context(cafile=balanced.cafile)
        async with httpx.AsyncClient(verify=tls, timeout=60) as client:
            victim = await _open(client, url, VICTIM)
            assert victim.status_code == 200, victim.text
            victim_session = victim.headers["mcp-session-id"]
            statuses = []
            first_session = None
            for _ in range(LIMIT + 5):
                opened = await _open(client, url, FLOODER)
                statuses.append(opened.status_code)
                first_session = first_session or opened.headers.get("mcp-session-id")
            assert statuses[:LIMIT] == [200] * LIMIT  # positive control: a normal rate passes
            assert statuses[LIMIT:] == [429] * 5, statuses
            refused = await _open(client, url, FLOODER)
            assert refused.status_code == 429 and refused.headers.get("retry-after") == "60"
            # The flooder's open sessions, and the other token, are untouched.
            assert first_session is not None
            assert await _list_tools(client, url, FLOODER, first_session) == 200
            assert await _list_tools(client, url, VICTIM, victim_session) == 200
            again = await _open(client, url, VICTIM)
            assert again.status_code == 200, again.text
