"""The one loopback test and the one bearer matcher (`rlm_mcp.access`), shared by the MCP
endpoint's guard, the viewer and the LM client."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from rlm_mcp.access import BearerTokens, WebhookGrant, is_loopback_host, owner_of_token, webhook_grants
from rlm_mcp.config import ServerSettings
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


def test_the_webhook_settings_grant_the_owners_no_tokens_file_line_covers(tmp_path: Path) -> None:
    old, new, own = (secrets.token_bytes(32) for _ in range(3))
    tokens = tmp_path / "tokens"
    tokens.write_text(f"file-token webhook_secret={_whsec(own)} webhook_allow=https://own.example/\nplain-token\n")
    settings = ServerSettings(
        auth_token="single",
        auth_tokens=["listed", "file-token"],
        auth_tokens_file=tokens,
        webhook_secret=f"{_whsec(old)}, {_whsec(new)}",
        webhook_allow=["https://ci.example.com/hooks/"],
    )
    grants = webhook_grants(settings)
    shared = WebhookGrant(secrets=(old, new), allow=("https://ci.example.com/hooks/",))
    assert grants[str(LOCAL_OWNER)] == shared
    assert grants[owner_of_token("single")] == grants[owner_of_token("listed")] == shared
    assert grants[owner_of_token("file-token")] == WebhookGrant(secrets=(own,), allow=("https://own.example/",))
    assert owner_of_token("plain-token") not in grants  # a file line without options: none
    assert webhook_grants(ServerSettings()) == {}
    with pytest.raises(ValueError, match="without RLM_MCP_WEBHOOK_ALLOW"):
        webhook_grants(ServerSettings(webhook_secret=_whsec(old)))
    with pytest.raises(ValueError, match="RLM_MCP_WEBHOOK_SECRET: a webhook_secret must start with whsec_"):
        webhook_grants(ServerSettings(webhook_secret="hunter2", webhook_allow=["https://x.example/"]))
    with pytest.raises(ValueError, match="RLM_MCP_WEBHOOK_ALLOW: webhook_allow='ftp://x' is not"):
        webhook_grants(ServerSettings(webhook_secret=_whsec(old), webhook_allow=["ftp://x"]))


def _whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()
