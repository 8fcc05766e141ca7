"""A `prompts/get` for a prompt the server does not have is the client's mistake: a protocol
error naming it (invalid params), in both protocol eras, and no traceback in the server log
(issue 40 item 4: at 2026-07-28 it answered "Internal server error" and logged a traceback)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from rlm_mcp.server.app import build_server
from tests.fixtures_surface import make_settings


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_an_unknown_prompt_is_an_invalid_params_error(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Client(build_server(make_settings(tmp_path, "http://127.0.0.1:9/v1")), mode=mode) as client:
        with pytest.raises(MCPError) as raised:
            await client.get_prompt("no-such-prompt")
    assert raised.value.error.code == INVALID_PARAMS
    assert raised.value.error.message == "Unknown prompt: no-such-prompt"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
