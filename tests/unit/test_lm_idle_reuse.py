"""An endpoint's pool does not reuse a connection a plain-http server may be closing: on the
aiohttp path (a non-loopback `http://` endpoint: the environment's proxy honoured) as on
lm/plain_http.py's (tests/unit/test_lm_plain_http.py); a hosted `https://` endpoint keeps
aiohttp's own idle time. A raw server on loopback, aiohttp's clock driven by the test."""

from __future__ import annotations

from pathlib import Path

import aiohttp.connector
import pytest

from rlm_mcp.lm.endpoint import Endpoint, EndpointConfig
from rlm_mcp.lm.http import HttpPool
from rlm_mcp.lm.plain_http import IDLE_REUSE_S
from rlm_mcp.testing.waiting import wait_until
from tests.loopback_tcp import tracking_url

pytestmark = pytest.mark.anyio

REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def test_the_aiohttp_path_closes_a_connection_idle_past_the_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("http_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    now = [1000.0]
    monkeypatch.setattr(aiohttp.connector, "monotonic", lambda: now[0])
    async with tracking_url(REPLY) as (url, seen):
        pool = HttpPool(headers={}, timeout_s=10, connect_s=5, trust_env=True, idle_reuse_s=IDLE_REUSE_S)
        try:
            for idle in (0.0, IDLE_REUSE_S - 0.5, IDLE_REUSE_S + 0.5):
                now[0] += idle
                reply = await pool.request("POST", url + "/v1/chat/completions", json_body=b"{}")
                assert reply.status_code == 200
            await wait_until(lambda: seen.closed == seen.served[:1], what="the stale connection's close")
        finally:
            await pool.aclose()
    assert seen.served[0] == seen.served[1] != seen.served[2], seen


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("http://gpu-host:8000/v1", IDLE_REUSE_S),  # vLLM's uvicorn closes idle connections after 5 s
        ("https://api.example.com/v1", None),  # aiohttp's own 15 s: a new one costs a TLS handshake
    ],
)
async def test_an_endpoint_limits_idle_reuse_for_plain_http_only(
    monkeypatch: pytest.MonkeyPatch, base_url: str, expected: float | None
) -> None:
    made: list[float | None] = []
    real = HttpPool

    def recording(**kwargs: object) -> HttpPool:
        made.append(kwargs.get("idle_reuse_s"))  # type: ignore[arg-type]
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("rlm_mcp.lm.endpoint.HttpPool", recording)
    config = EndpointConfig("root", base_url, api_key="", max_model_len=None, completion_tokens_field="auto")
    endpoint = Endpoint(config, request_timeout_s=5)
    endpoint.http()
    await endpoint.aclose()
    assert made == [expected]
