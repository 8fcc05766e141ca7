"""The assembly: one builder per role gives `RlmService` its parts, each component its own
settings section, and the run backend the deployment calls for, over either store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from rlm_mcp import assembly
from rlm_mcp.config import LMSettings, LoadSettings, SandboxSettings, Settings, StoreSettings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.store.contexts import Contexts
from rlm_mcp.store.uploads import Uploads
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until


def test_front_and_worker_refuse_the_embedded_deployment(tmp_path: Path) -> None:
    # `front` and `worker` take team stores, which only a deployment with the database has; a
    # process configured as one without it is refused where it would start serving.
    assert make_settings(tmp_path, role="front").deployment.database is None
    with pytest.raises(RlmMcpError, match="RLM_MCP_DATABASE_URL"):
        make_settings(tmp_path, role="front").deployment.served()
    with pytest.raises(RlmMcpError, match="RLM_MCP_DATABASE_URL"):
        make_settings(tmp_path, role="worker").deployment.served()
    assert make_settings(tmp_path).deployment.served().embedded


def test_each_component_takes_its_own_section(store_settings: Callable[..., Settings]) -> None:
    settings = store_settings(max_sandboxes=3, model="root-m", max_files=7, store_max_bytes=12345)
    parts = assembly.service_parts(settings, transport="stdio")
    assert type(parts.lm.settings) is LMSettings and parts.lm.settings.model == "root-m"
    assert type(parts.sandboxes.settings) is SandboxSettings and parts.sandboxes.settings.max_sandboxes == 3
    assert parts.stores.kind == ("sqlite" if settings.deployment.embedded else "postgresql")
    for rules in (parts.stores.contexts, parts.stores.uploads):
        assert isinstance(rules, Contexts | Uploads) and type(rules.settings) is StoreSettings
        assert (
            rules.settings.max_context_bytes == settings.store.max_context_bytes > 0
        )  # derived from the sandbox's memory
    assert type(parts.loader.loads) is LoadSettings and parts.loader.loads.max_files == 7
    assert type(parts.loader.store) is StoreSettings and parts.loader.store.store_max_bytes == 12345
    # Idle kept sessions yield their sandbox slots to runs: the one hook between two parts.
    assert parts.sandboxes.reclaim == parts.sessions.reclaim


@pytest.mark.parametrize("role", ["both", "front"])
def test_the_service_runs_where_the_deployment_says(
    store_settings: Callable[..., Settings], role: str, tmp_path: Path
) -> None:
    settings = store_settings(role=role)

    async def opened() -> tuple[bool, bool]:
        async with assembly.build_service(settings, mode="http") as service:
            return service.runs.local, service.stores.kind == "postgresql"

    local, team = anyio.run(opened)
    # Embedded: runs execute in this process; team mode: through the queue, whatever the role.
    assert (local, team) == ((True, False) if settings.deployment.embedded else (False, True))


@pytest.mark.parametrize("role", ["both", "front"])
def test_processes_that_call_the_lm_share_its_throttle_cuts(
    store_settings: Callable[..., Settings], role: str, tmp_path: Path
) -> None:
    settings = store_settings(role=role)
    team_executor = not settings.deployment.embedded and role == "both"

    async def shares() -> bool:
        async with assembly.build_service(settings, mode="http") as service:
            if team_executor:
                await wait_until(lambda: service.lm.throttles.shared, within_s=30, what="the throttle channel")
            return service.lm.throttles.shared

    # Embedded: one process, nothing to share with. A team front executes no run, so it calls no
    # LM and listens to nothing; `both` executes runs and shares.
    assert anyio.run(shares) is team_executor


@pytest.mark.parametrize("role", ["both", "front"])
def test_team_fronts_show_the_workers_limits(store_settings: Callable[..., Settings], role: str) -> None:
    settings = store_settings(role=role)

    async def board() -> bool:
        async with assembly.build_service(settings, mode="http") as service:
            return service.lm.throttles.team_view is not None

    # A team front's viewer shows the workers' gates (lm/throttle_board.py); embedded, its own.
    assert anyio.run(board) is (not settings.deployment.embedded)


@pytest.mark.postgres
@pytest.mark.parametrize(("role", "kept_open"), [("worker", 3), ("both", 3), ("front", 1)])
def test_a_replica_that_executes_runs_opens_a_store_connection_per_run_slot(
    pg_migrated_url: str, tmp_path: Path, role: str, kept_open: int
) -> None:
    # (The heartbeat's statement at the start may take one more while they open: at least.)
    # Each running run writes its log on its own pooled connection; a replica that executes runs
    # opens one per run slot from the start, not one at a time while a burst's first turns wait.
    settings = make_settings(tmp_path, database_url=pg_migrated_url, role=role, max_runs=3)

    async def opened() -> tuple[int, int]:
        stores = assembly.service_parts(settings, transport="http").stores
        async with stores:
            pool = stores.db.pool  # type: ignore[attr-defined]  # team mode's bundle
            await pool.wait(timeout=30)
            return int(pool.get_stats()["pool_size"]), pool.min_size

    size, kept = anyio.run(opened)
    assert size >= kept_open and kept == kept_open
