"""The one loopback test and the one bearer matcher (`rlm_mcp.access`), shared by the MCP
endpoint's guard, the viewer and the LM client."""

from __future__ import annotations

import pytest

from rlm_mcp.access import BearerTokens, is_loopback_host, owner_of_token
from rlm_mcp.owners import LOCAL_OWNER


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST", "127.0.0.1", "127.9.9.9", "::1", "[::1]"])
def test_loopback_spellings(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "example.com", "localhost.example.com", ""])
def test_not_loopback(host: str) -> None:
    assert not is_loopback_host(host)


def test_bearer_tokens_name_the_owner_of_the_matching_token() -> None:
    bearer = BearerTokens(["alpha", "beta"])
    assert bearer
    assert bearer.owner("Bearer beta") == owner_of_token("beta") != owner_of_token("alpha")
    assert bearer.owner("Bearer gamma") is None
    assert bearer.owner("beta") is None
    assert bearer.owner(None) is None


def test_without_tokens_everyone_is_the_local_user() -> None:
    bearer = BearerTokens([])
    assert not bearer
    assert bearer.owner(None) == LOCAL_OWNER
