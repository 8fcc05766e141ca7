"""The same scenario (load a folder, rlm_complete with progress, rlm_start + rlm_status +
rlm_result, rlm_cancel, a resource read) with each Python `mcp` client era, against the real
console script over stdio and streamable HTTP:

- the handshake era's `mcp` 1.x client (protocol 2025-11-25), in an environment of its own (uv
  venv, pinned), running tests/clients/mcp1_scenario.py;
- the `mcp` 2.x `Client` (protocol 2026-07-28, this project's own SDK), running
  tests/clients/mcp2_scenario.py: the same steps, the same JSON, the same assertions.

The TypeScript SDK and LangChain run this scenario in test_ts_sdk_client.py and
test_langchain_client.py; it is tests/fixtures_clients.py's."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures_clients import MCP1, assert_scenario, client_venv, scenario_over_http, scenario_over_stdio
from tests.fixtures_e2e import assert_no_sandboxes_left
from tests.paths import TESTS

CLIENTS = TESTS / "clients"


@dataclass(frozen=True)
class Era:
    python: str  # the interpreter whose `mcp` is the client
    scenario: Path
    protocol: str  # the revision the client and the server agree on


@pytest.fixture(scope="module", params=["mcp1", "mcp2"])
def era(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Era:
    if request.param == "mcp1":
        return Era(client_venv(tmp_path_factory, "mcp1", MCP1), CLIENTS / "mcp1_scenario.py", "2025-11-25")
    return Era(sys.executable, CLIENTS / "mcp2_scenario.py", "2026-07-28")  # the project's own mcp 2.x


def test_client_era_over_stdio(era: Era, tmp_path: Path) -> None:
    seen, instance_id = scenario_over_stdio([era.python, str(era.scenario)], tmp_path)
    assert_scenario(seen, era.protocol)
    assert_no_sandboxes_left(instance_id)


@pytest.mark.anyio
async def test_client_era_over_streamable_http(era: Era, tmp_path: Path) -> None:
    seen, instance_id = await scenario_over_http([era.python, str(era.scenario)], tmp_path)
    assert_scenario(seen, era.protocol)
    assert_no_sandboxes_left(instance_id)
