"""fetch_url against a real loopback HTTP server."""

from __future__ import annotations

import pytest

from rlm_mcp.errors import AccessDeniedError, BadArgumentError, TooLargeError
from rlm_mcp.service.loaders import fetch_url
from rlm_mcp.service.loaders.addresses import AddressPolicy, parse_networks
from tests.fixtures_store import sections

pytestmark = pytest.mark.anyio


def _read(loaded) -> bytes:
    try:
        return loaded.path.read_bytes()
    finally:
        loaded.cleanup()


async def test_text(settings, http_server) -> None:
    http_server.route("/docs/page.txt", "héllo".encode(), Content_Type="text/plain; charset=utf-8")
    loaded = await fetch_url(http_server.url("/docs/page.txt"), **sections(settings), allow_private=True)
    assert loaded.name == "page.txt"
    assert loaded.source["type"] == "url" and loaded.source["content_type"] == "text/plain"
    assert _read(loaded) == "héllo".encode()
    assert http_server.handler.seen_hosts[-1] == f"127.0.0.1:{http_server.port}"


async def test_charset_is_decoded_to_utf8(settings, http_server) -> None:
    http_server.route("/latin", "café".encode("latin-1"), Content_Type="text/plain; charset=iso-8859-1")
    assert (
        _read(await fetch_url(http_server.url("/latin"), **sections(settings), allow_private=True)) == "café".encode()
    )


async def test_redirect_chain_and_limit(settings_factory, http_server) -> None:
    http_server.route("/final", b"done", Content_Type="text/plain")
    for i in range(1, 5):
        http_server.redirect(f"/r{i}", "/final" if i == 1 else f"/r{i - 1}")
    loaded = await fetch_url(
        http_server.url("/r3"), **sections(settings_factory(url_max_redirects=3)), allow_private=True
    )
    assert loaded.source["redirects"] == 3 and loaded.source["final_url"].endswith("/final")
    assert loaded.name == "r3" and _read(loaded) == b"done"
    with pytest.raises(BadArgumentError, match="more than 3 times.*RLM_MCP_URL_MAX_REDIRECTS"):
        await fetch_url(http_server.url("/r4"), **sections(settings_factory(url_max_redirects=3)), allow_private=True)


async def test_too_large(settings_factory, http_server) -> None:
    s = settings_factory(max_context_bytes=100)
    http_server.route("/big", b"x" * 200, Content_Type="text/plain")
    http_server.route("/big-unsized", b"x" * 200, Content_Type="text/plain", X_No_Length="1")
    for path in ("/big", "/big-unsized"):
        with pytest.raises(TooLargeError, match="RLM_MCP_MAX_CONTEXT_BYTES"):
            await fetch_url(http_server.url(path), **sections(s), allow_private=True)


async def test_binary_refused(settings, http_server) -> None:
    http_server.route("/img", b"\x89PNG\r\n", Content_Type="image/png")
    http_server.route("/blob", b"abc\0def", Content_Type="application/octet-stream")
    http_server.route("/untyped-text", b"plain words")
    with pytest.raises(BadArgumentError, match="image/png.*not text"):
        await fetch_url(http_server.url("/img"), **sections(settings), allow_private=True)
    with pytest.raises(BadArgumentError, match="binary"):
        await fetch_url(http_server.url("/blob"), **sections(settings), allow_private=True)
    assert (
        _read(await fetch_url(http_server.url("/untyped-text"), **sections(settings), allow_private=True))
        == b"plain words"
    )


async def test_errors(settings, http_server) -> None:
    with pytest.raises(BadArgumentError, match="HTTP 404"):
        await fetch_url(http_server.url("/missing"), **sections(settings), allow_private=True)
    with pytest.raises(BadArgumentError, match="http"):
        await fetch_url("file:///etc/passwd", **sections(settings), allow_private=True)
    with pytest.raises(BadArgumentError, match="cannot be resolved"):
        await fetch_url("http://no-such-host.invalid/x", **sections(settings), allow_private=True)


async def test_private_addresses(settings, http_server) -> None:
    http_server.route("/t", b"ok", Content_Type="text/plain")
    with pytest.raises(AccessDeniedError, match="RLM_MCP_ALLOW_PRIVATE_URLS"):
        await fetch_url(http_server.url("/t"), **sections(settings), allow_private=False)
    with pytest.raises(AccessDeniedError):
        await fetch_url(http_server.url("/t", host="localhost"), **sections(settings), allow_private=False)
    assert _read(await fetch_url(http_server.url("/t"), **sections(settings), allow_private=True)) == b"ok"


async def test_every_redirect_hop_is_checked(settings, http_server) -> None:
    # 127.0.0.1 listed as allowed; a redirect to 127.0.0.2 (also loopback) must still be refused.
    policy = AddressPolicy(listed=tuple(parse_networks(["127.0.0.1"])))
    http_server.route("/t", b"ok", Content_Type="text/plain")
    http_server.redirect("/hop", http_server.url("/t", host="127.0.0.2"))
    assert _read(await fetch_url(http_server.url("/t"), **sections(settings), allow_private=policy)) == b"ok"
    with pytest.raises(AccessDeniedError, match="127.0.0.2"):
        await fetch_url(http_server.url("/hop"), **sections(settings), allow_private=policy)
    assert not list((settings.data_dir / "tmp").iterdir())  # temp files of failed fetches are gone
