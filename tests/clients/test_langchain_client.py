"""LangChain's `langchain-mcp-adapters`, pinned, with its own `mcp` 1.x (handshake era) in an
environment of its own (uv venv; it does not constrain the server's `mcp`), calling rlm-mcp's
tools through LangChain tool objects over stdio and streamable HTTP: load a folder, rlm_complete with progress,
rlm_start + rlm_status + rlm_result, rlm_cancel, a resource read (as LangChain blobs), against
the real console script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_clients import MCP1, assert_scenario, client_venv, scenario_over_http, scenario_over_stdio
from tests.fixtures_e2e import assert_no_sandboxes_left
from tests.paths import TESTS

ADAPTERS = "langchain-mcp-adapters==0.3.2"
LANGCHAIN_CORE = "langchain-core==1.7.2"
SCENARIO = TESTS / "clients" / "langchain_scenario.py"


@pytest.fixture(scope="module")
def langchain_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return client_venv(tmp_path_factory, "langchain", ADAPTERS, LANGCHAIN_CORE, MCP1)


def test_langchain_tools_over_stdio(langchain_python: str, tmp_path: Path) -> None:
    _check(*scenario_over_stdio([langchain_python, str(SCENARIO)], tmp_path))


@pytest.mark.anyio
async def test_langchain_tools_over_streamable_http(langchain_python: str, tmp_path: Path) -> None:
    _check(*await scenario_over_http([langchain_python, str(SCENARIO)], tmp_path))


def _check(seen: dict[str, Any], instance_id: str) -> None:
    assert seen["mcp"] == MCP1.split("==")[1] and seen["adapters"] == ADAPTERS.split("==")[1]
    assert seen["is_base_tool"] is True
    assert_scenario(seen, None)  # the adapters do not report the negotiated version
    assert seen["result"]["answer"].startswith("files:")
    assert_no_sandboxes_left(instance_id)
