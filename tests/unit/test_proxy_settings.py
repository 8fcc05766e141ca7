"""What a replica behind a reverse proxy needs (issue 22 item 5): `RLM_MCP_PUBLIC_URL` (the name
browsers and clients use) is accepted as Host and Origin, names itself in viewer login links and,
when it is https, marks the viewer's cookie Secure; `RLM_MCP_ALLOWED_HOSTS` still adds names.
A real uvicorn server on loopback, raw HTTP requests carrying what a proxy forwards."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rlm_mcp.access import host_policy
from rlm_mcp.config_check import SettingsError
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_http import INIT, MCP_HEADERS, http_settings, serving

pytestmark = pytest.mark.anyio

TOKEN = "proxy-test-token"
PUBLIC = "https://rlm.example.com"


@pytest.mark.parametrize(
    "value",
    [
        "rlm.example.com",
        "ftp://rlm.example.com",
        "https://",
        "https://rlm.example.com/rlm",
        "https://u:p@rlm.example.com",
        "https://rlm.example.com/?a=1",
    ],
)
def test_a_public_url_is_a_scheme_a_host_and_a_port(value: str, tmp_path: Path) -> None:
    with pytest.raises((ValueError, SettingsError), match="public_url|scheme, host and port|http:// or https://"):
        make_settings(tmp_path, public_url=value)


def test_the_public_url_is_normalised_and_empty_means_none(tmp_path: Path) -> None:
    assert (
        make_settings(tmp_path, public_url="HTTPS://RLM.Example.com:8443/").server.public_url
        == "https://rlm.example.com:8443"
    )
    assert make_settings(tmp_path, public_url="").server.public_url is None


def test_the_public_urls_host_and_origin_are_accepted(tmp_path: Path) -> None:
    policy = host_policy(make_settings(tmp_path, public_url="https://rlm.example.com:8443").server)
    assert policy.host_ok("rlm.example.com:8443")
    assert policy.origin_ok("https://rlm.example.com:8443")
    assert not policy.host_ok("rlm.example.com.evil.test:8443")
    assert not policy.origin_ok("https://evil.test")
    assert not host_policy(make_settings(tmp_path).server).host_ok("rlm.example.com")


async def test_a_proxied_replica_answers_by_its_public_name(tmp_path: Path) -> None:
    settings = http_settings(tmp_path, "127.0.0.1", auth_token=TOKEN, public_url=PUBLIC, allowed_hosts=["lb.internal"])
    bearer = {"authorization": f"Bearer {TOKEN}"}
    async with serving(settings) as url, httpx.AsyncClient(timeout=30) as client:
        base = url.removesuffix("/mcp")
        # what the proxy forwards: the public Host, a browser's Origin
        for host in ("rlm.example.com", "lb.internal"):
            ok = await client.post(url, json=INIT, headers={**MCP_HEADERS, **bearer, "host": host, "origin": PUBLIC})
            assert ok.status_code == 200, ok.text
        foreign = await client.post(url, json=INIT, headers={**MCP_HEADERS, **bearer, "host": "evil.test"})
        assert foreign.status_code == 421

        link = await client.post(f"{base}/runs/api/login-link", headers={**bearer, "host": "rlm.example.com"})
        assert link.status_code == 200
        assert link.json()["url"] == PUBLIC + link.json()["path"]
        opened = await client.get(base + link.json()["path"], headers={"host": "rlm.example.com"})
        assert opened.status_code == 303
        cookie = opened.headers["set-cookie"].lower()
        assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie


async def test_without_a_public_url_links_are_paths_and_cookies_not_secure(tmp_path: Path) -> None:
    settings = http_settings(tmp_path, "127.0.0.1", auth_token=TOKEN)
    async with serving(settings) as url, httpx.AsyncClient(timeout=30) as client:
        base = url.removesuffix("/mcp")
        link = await client.post(f"{base}/runs/api/login-link", headers={"authorization": f"Bearer {TOKEN}"})
        assert set(link.json()) == {"path"}
        opened = await client.get(base + link.json()["path"])
        assert opened.status_code == 303
        assert "secure" not in opened.headers["set-cookie"].lower()


def test_behind_a_public_url_only_its_exact_origin_is_the_servers_own(tmp_path: Path) -> None:
    """Another scheme or port of the public host is another site (a plain-http page, another
    service on that host): refused as an Origin, while Host keeps its port-free match."""
    policy = host_policy(make_settings(tmp_path, public_url="https://rlm.example.com").server)
    assert policy.origin_ok("https://rlm.example.com")  # positive control
    assert policy.origin_ok("https://rlm.example.com:443")  # the same origin, its default port spelled out
    assert policy.host_ok("rlm.example.com:8443") and policy.host_ok("rlm.example.com")
    for other in ("http://rlm.example.com", "https://rlm.example.com:8443", "http://rlm.example.com:8080"):
        assert not policy.origin_ok(other), other
    # a name listed in RLM_MCP_ALLOWED_HOSTS keeps its meaning for both
    listed = host_policy(make_settings(tmp_path, host="0.0.0.0", port=8765, allowed_hosts=["lb.internal"]).server)
    assert listed.origin_ok("http://lb.internal:8765")
