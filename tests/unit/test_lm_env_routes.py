"""An endpoint off loopback honours the environment's proxy and `.netrc` login as aiohttp's
`trust_env` does (lm/env_routes.py), looked up once per URL rather than in two worker-thread hops
per request. The proxy is a real HTTP server on loopback that records what it was sent."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from rlm_mcp.lm import env_routes
from rlm_mcp.lm.http import HttpError, HttpPool, HttpTransportError
from tests.loopback_tcp import loopback_url

pytestmark = pytest.mark.anyio

REMOTE = "http://lm.example.test:8000/v1/chat/completions"  # never resolved: only the proxy answers
REPLY = b'{"ok": true}'


@asynccontextmanager
async def recording_proxy() -> AsyncIterator[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """A plain-http forward proxy that answers every request itself: (its URL, what it received:
    the request line and the headers, lower-cased names, a repeated one's values joined)."""
    seen: list[tuple[str, dict[str, str]]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode("latin-1").split("\r\n")[:-2]
                headers: dict[str, str] = {}
                for name, value in (f.split(":", 1) for f in fields):  # a repeated name: its values joined
                    key = name.strip().lower()
                    headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
                await reader.readexactly(int(headers.get("content-length", "0")))
                seen.append((line, headers))
                if line.startswith("CONNECT "):  # an https target: refused, its request line is what counts
                    writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    break
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(REPLY)
                )
                writer.write(REPLY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async with loopback_url(serve) as url:
        yield url, seen


def _pool(headers: dict[str, str] | None = None) -> HttpPool:
    return HttpPool(headers=headers or {}, timeout_s=10, connect_s=5, trust_env=True)


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


async def test_the_environments_proxy_carries_every_request_and_is_looked_up_once(
    no_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[str] = []
    original = env_routes._lookup

    def counted(url: str) -> env_routes.Route:
        lookups.append(url)
        return original(url)

    monkeypatch.setattr(env_routes, "_lookup", counted)
    async with recording_proxy() as (proxy, seen):
        monkeypatch.setenv("HTTP_PROXY", proxy.replace("http://", "http://user:secret@"))
        pool = _pool({"Authorization": "Bearer key"})
        try:
            for _ in range(3):
                reply = await pool.request("POST", REMOTE, json_body=b"{}")
                assert (reply.status_code, reply.content) == (200, REPLY)
        finally:
            await pool.aclose()
    assert lookups == [REMOTE]
    assert [line for line, _ in seen] == [f"POST {REMOTE} HTTP/1.1"] * 3  # absolute form: through the proxy
    headers = seen[0][1]
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"user:secret").decode()
    assert headers["authorization"] == "Bearer key"
    assert headers["host"] == "lm.example.test:8000"


async def test_an_https_endpoint_tunnels_with_the_proxys_credentials_and_not_the_key(
    no_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with recording_proxy() as (proxy, seen):
        monkeypatch.setenv("HTTPS_PROXY", proxy.replace("http://", "http://user:secret@"))
        pool = _pool({"Authorization": "Bearer key"})
        try:
            with pytest.raises(HttpError):  # the proxy refuses the tunnel
                await pool.request("POST", REMOTE.replace("http://", "https://"), json_body=b"{}")
        finally:
            await pool.aclose()
    [(line, headers)] = seen
    assert line == "CONNECT lm.example.test:8000 HTTP/1.1"
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"user:secret").decode()
    assert "authorization" not in headers  # the endpoint's key stays inside the tunnel


async def test_no_proxy_exempts_the_host(no_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    async with recording_proxy() as (proxy, seen):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", "lm.example.test")
        pool = _pool()
        try:
            with pytest.raises(HttpTransportError):  # straight to a name that does not resolve
                await pool.request("POST", REMOTE, json_body=b"{}")
        finally:
            await pool.aclose()
    assert seen == []


async def test_a_netrc_login_is_sent_unless_the_endpoint_has_a_key(
    no_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine lm.example.test login alice password wonder\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    async with recording_proxy() as (proxy, seen):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        for headers in ({}, {"Authorization": "Bearer key"}):
            pool = _pool(headers)
            try:
                await pool.request("POST", REMOTE, json_body=b"{}")
            finally:
                await pool.aclose()
            pool = _pool(headers)
            try:  # a request's own key (a router's) replaces the pool's, whatever the name's case
                await pool.request("POST", REMOTE, json_body=b"{}", headers={"authorization": "Bearer router"})
            finally:
                await pool.aclose()
    basic = "Basic " + base64.b64encode(b"alice:wonder").decode()
    assert [h.get("authorization") for _, h in seen] == [basic, "Bearer router", "Bearer key", "Bearer router"]
    assert "proxy-authorization" not in seen[0][1]


async def test_a_loopback_endpoint_ignores_the_environment(no_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    async with recording_proxy() as (proxy, seen):
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens: used, it would fail
        pool = HttpPool(headers={}, timeout_s=10, connect_s=5, trust_env=False)
        try:
            reply = await pool.request("POST", f"{proxy}/v1/chat/completions", json_body=b"{}")
        finally:
            await pool.aclose()
    assert reply.status_code == 200
    assert [line for line, _ in seen] == ["POST /v1/chat/completions HTTP/1.1"]
