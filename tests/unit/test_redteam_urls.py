"""Issue 20 item 10: over HTTP, RLM_MCP_ALLOW_PRIVATE_URLS opens private networks but not
loopback or link-local (cloud metadata) addresses; those only when listed in
RLM_MCP_ALLOWED_URL_ADDRESSES. A real loopback HTTP server; the metadata address is refused
before any connection."""

from __future__ import annotations

from typing import Any

import pytest

from rlm_mcp.errors import AccessDeniedError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.contexts import ContextLoader
from rlm_mcp.store import ContextStore
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_store import sections

pytestmark = pytest.mark.anyio


async def _load(tmp_path: Any, url: str, *, stdio: bool = False, **overrides: Any) -> str:
    settings = make_settings(tmp_path, **overrides)
    loader = ContextLoader(ContextStore(settings.store), **sections(settings), allow_loopback_urls=stdio)
    info = await loader.load(
        text=None,
        path=None,
        glob=None,
        url=url,
        name=None,
        format="text",
        include=None,
        exclude=None,
        owner=LOCAL_OWNER,
    )
    return info.context_id


@pytest.mark.parametrize("target", ["loopback", "metadata", "metadata-v6"])
async def test_private_urls_allowed_keeps_loopback_and_link_local_refused(tmp_path, http_server, target) -> None:
    http_server.route("/page.txt", b"local service", Content_Type="text/plain")
    url = {
        "loopback": http_server.url("/page.txt"),
        "metadata": "http://169.254.169.254/latest/meta-data/",
        "metadata-v6": "http://[fe80::a9fe:a9fe]/latest/",
    }[target]
    with pytest.raises(AccessDeniedError) as err:
        await _load(tmp_path, url, allow_private_urls=True)
    assert "RLM_MCP_ALLOWED_URL_ADDRESSES" in str(err.value)


async def test_a_listed_loopback_address_is_allowed(tmp_path, http_server) -> None:
    http_server.route("/page.txt", b"local service", Content_Type="text/plain")
    assert await _load(tmp_path, http_server.url("/page.txt"), allowed_url_addresses=["127.0.0.0/8"])


async def test_stdio_still_reaches_loopback(tmp_path, http_server) -> None:
    http_server.route("/page.txt", b"local service", Content_Type="text/plain")
    assert await _load(tmp_path, http_server.url("/page.txt"), stdio=True)
