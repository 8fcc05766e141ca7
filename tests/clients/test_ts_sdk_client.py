"""The protocol-era scenario (load a folder, rlm_complete with progress, rlm_start + rlm_status +
rlm_result, rlm_cancel, a resource read) with the official TypeScript SDK client
(`@modelcontextprotocol/sdk`, pinned in tests/js/package.json; handshake era, 2025-11-25), the
client desktop apps are built on, on Node, against the real console script over stdio and over
streamable HTTP."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_clients import assert_scenario, scenario_over_http, scenario_over_stdio
from tests.fixtures_e2e import assert_no_sandboxes_left
from tests.fixtures_js import js_tools
from tests.paths import TESTS

SCENARIO = TESTS / "clients" / "ts_sdk_scenario.mjs"


def _node() -> list[str]:
    node = shutil.which("node")
    assert node, "Node.js is a prerequisite of the test suite (docs/getting-started.md, Install)."
    return [node, str(SCENARIO), str(js_tools() / "node_modules")]


def _check(seen: dict[str, Any], instance_id: str) -> None:
    assert_scenario(seen, "2025-11-25")
    assert_no_sandboxes_left(instance_id)


def test_ts_sdk_client_over_stdio(tmp_path: Path) -> None:
    _check(*scenario_over_stdio(_node(), tmp_path))


@pytest.mark.anyio
async def test_ts_sdk_client_over_streamable_http(tmp_path: Path) -> None:
    _check(*await scenario_over_http(_node(), tmp_path))
