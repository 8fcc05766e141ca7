"""The official MCP conformance suite (issue 40 item 4), run from outside against the HTTP server
as a user would: the frozen 2026-07-28 requirement set and the 2025-11-25 scenarios, against an
embedded server and a team front (PostgreSQL). The suite's exit code is the verdict: every check
not listed, with its reason, in tests/js/conformance/expected-failures-<revision>.yml must pass,
and a listed one that passes is a stale entry (the suite fails on it too). The Tasks scenarios'
checks that need no fixture tool of the suite pass since server/tasks.py."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.fixtures_conformance import RUNS, conformance_cli, run_suite
from tests.fixtures_http import http_settings, serving

pytestmark = pytest.mark.anyio

# Far fewer would mean the suite ran nothing (a wrong flag, a server it could not reach).
LEAST_PASSED = {"2026-07-28": 110, "2025-11-25": 40}


@pytest.fixture(scope="module")
def suite_installed() -> None:
    conformance_cli()  # Node 24 and the pinned suite, installed once per machine


@pytest.mark.parametrize("revision", sorted(RUNS))
async def test_the_conformance_suite_passes_but_for_its_listed_fixtures(
    revision: str, suite_installed: None, tmp_path: Path, database_url: str | None
) -> None:
    # A team front (role front: it queues runs for workers) on PostgreSQL, or an embedded server.
    team = {"database_url": database_url, "role": "front"} if database_url else {}
    settings = http_settings(tmp_path, "127.0.0.1", **team)
    async with serving(settings) as url:
        run = await anyio.to_thread.run_sync(lambda: run_suite(url, revision, tmp_path / "results"))
    assert run.returncode == 0, run.output[-6000:]
    assert run.passed >= LEAST_PASSED[revision], run.output[-3000:]
    if revision == "2026-07-28":
        # Tasks checks that need none of the suite's fixture tools.
        for check in (
            "tasks-capability-negotiation:tasks-extension-advertised",
            "tasks-capability-negotiation:sep-2663-tasks-methods-non-declaring",
            "tasks-capability-negotiation:sep-2663-server-rejects-undeclared-client",
            "tasks-dispatch-and-envelope:sep-2663-tasks-get-invalid-task-id-32602",
        ):
            assert run.checks.get(check) == "SUCCESS", (check, run.checks.get(check))
