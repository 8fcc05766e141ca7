"""A context over the largest one the server takes names the setting to change (issue 41, from
round three): by default that limit follows the sandbox's memory, so the refusal names
RLM_MCP_SANDBOX_MEMORY; set on purpose, it names RLM_MCP_MAX_CONTEXT_BYTES. Loads and uploads
alike, through the service as a tool or the CLI calls it."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import build_service
from rlm_mcp.errors import TooLargeError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.testing.settings import make_settings

OVER = "x" * (2 << 20)  # 2 MiB: over the 1 MiB floor a small sandbox gives


async def refusals(tmp_path: Path, **settings: object) -> list[TooLargeError]:
    async with build_service(make_settings(tmp_path, **settings)) as service:
        caller = Caller(service, LOCAL_OWNER)
        found: list[TooLargeError] = []
        with pytest.raises(TooLargeError) as loaded:
            await caller.load_context(text=OVER)
        found.append(loaded.value)
        chunk = OVER[: 1 << 20]
        first = await caller.upload_chunk(
            data=chunk, index=0, upload_id=None, final=False, encoding="text", sha256=None, name=None, format=None
        )
        with pytest.raises(TooLargeError) as uploaded:
            await caller.upload_chunk(
                data=chunk, index=1, upload_id=first.upload_id, final=True, encoding="text", sha256=None, name=None,
                format=None,
            )  # fmt: skip
        found.append(uploaded.value)
        return found


def test_a_limit_that_follows_the_memory_names_the_memory(tmp_path: Path) -> None:
    for refused in anyio.run(functools.partial(refusals, tmp_path, sandbox_memory="32m")):
        assert "RLM_MCP_SANDBOX_MEMORY" in str(refused) and "RLM_MCP_MAX_CONTEXT_BYTES" not in str(refused), refused
        assert refused.fix is not None and "raise RLM_MCP_SANDBOX_MEMORY" in refused.fix


def test_a_limit_set_on_purpose_names_itself(tmp_path: Path) -> None:
    for refused in anyio.run(functools.partial(refusals, tmp_path, sandbox_memory="32m", max_context_bytes=1 << 20)):
        assert refused.fix is not None and refused.fix.endswith("or raise RLM_MCP_MAX_CONTEXT_BYTES."), refused
