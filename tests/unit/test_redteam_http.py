"""Issue 20, the HTTP server's doors: a configured token source that yields no token stops the
start (item 1); with several tokens, path and glob loads need roots set on purpose (item 2).
Real uvicorn servers on loopback, the real MCP client over streamable HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import AccessDeniedError
from rlm_mcp.server.http import build_http_app
from rlm_mcp.testing.servers import free_port
from tests.fixtures_http import as_token, serving
from tests.fixtures_surface import call, call_error

pytestmark = pytest.mark.anyio


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9/v1",
        "data_dir": tmp_path / "data",
        "host": "127.0.0.1",
        "port": free_port("127.0.0.1"),
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.mark.parametrize("text", ["", "\n\n", "# rotating: new tokens below\n\n   \n# none yet\n"])
def test_a_tokens_file_without_tokens_stops_the_start(tmp_path: Path, text: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(text)
    with pytest.raises(AccessDeniedError) as err:
        build_http_app(_settings(tmp_path, auth_tokens_file=tokens))
    assert "RLM_MCP_AUTH_TOKENS_FILE" in str(err.value)
    assert str(tokens) in str(err.value)


def test_a_blank_token_setting_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(AccessDeniedError) as err:
        build_http_app(_settings(tmp_path, auth_token="   "))
    assert "RLM_MCP_AUTH_TOKEN " in str(err.value) or "RLM_MCP_AUTH_TOKEN." in str(err.value)


@pytest.mark.parametrize("value", ["", ",", " , ,, ", "   "])
def test_a_tokens_list_without_tokens_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # Read from the environment as an operator sets it: the list parses to no token at all.
    monkeypatch.setenv("RLM_MCP_AUTH_TOKENS", value)
    with pytest.raises(AccessDeniedError) as err:
        build_http_app(_settings(tmp_path))
    assert "RLM_MCP_AUTH_TOKENS " in str(err.value)
    assert "\n" not in str(err.value)


def test_a_tokens_list_without_tokens_stops_the_start_beside_another_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other source's token does not excuse the empty list: it was configured to add tokens.
    monkeypatch.setenv("RLM_MCP_AUTH_TOKENS", ",")
    with pytest.raises(AccessDeniedError) as err:
        build_http_app(_settings(tmp_path, auth_token="alice-token"))
    assert "RLM_MCP_AUTH_TOKENS " in str(err.value)


def test_a_tokens_file_with_a_token_starts(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# ops\nalice-token\n")
    build_http_app(_settings(tmp_path, auth_tokens_file=tokens))  # no error


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "bob-notes.txt").write_text("bob's private notes")
    monkeypatch.setenv("HOME", str(home))
    return home


async def test_several_tokens_with_default_roots_refuse_paths(tmp_path: Path, home: Path) -> None:
    settings = _settings(tmp_path, auth_tokens=["alice-token", "bob-token"])
    assert "allowed_roots" not in settings.model_fields_set
    async with serving(settings) as url, as_token(url, "alice-token") as alice:
        for args in ({"path": str(home / "bob-notes.txt")}, {"glob": str(home / "*.txt")}):
            message = await call_error(alice, "rlm_load_context", **args)
            assert "RLM_MCP_ALLOWED_ROOTS" in message
            assert "several tokens" in message
        # Text and uploads still work.
        assert (await call(alice, "rlm_load_context", text="hello"))["context_id"]


async def test_several_tokens_with_explicit_roots_load_paths(tmp_path: Path, home: Path) -> None:
    settings = _settings(tmp_path, auth_tokens=["alice-token", "bob-token"], allowed_roots=[home])
    async with serving(settings) as url, as_token(url, "alice-token") as alice:
        assert (await call(alice, "rlm_load_context", path=str(home / "bob-notes.txt")))["context_id"]


async def test_one_token_keeps_the_default_roots(tmp_path: Path, home: Path) -> None:
    settings = _settings(tmp_path, auth_token="alice-token")
    async with serving(settings) as url, as_token(url, "alice-token") as alice:
        assert (await call(alice, "rlm_load_context", path=str(home / "bob-notes.txt")))["context_id"]
