"""Issue 20 item 8 (part): caps shared by all owners neither hide nor evict one owner's things
because of another's, and a refusal speaks only of the caller's own usage."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from rlm_mcp.access import HostPolicy
from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.errors import uploads_over_store_cap
from rlm_mcp.owners import EVERY_OWNER, Owner
from rlm_mcp.store import RunStore
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.viewer import auth as viewer_auth
from rlm_mcp.viewer.auth import ViewerAuth
from tests.fixtures_store import run_record


def test_the_run_list_is_filtered_by_owner_before_its_cap(tmp_path: Path) -> None:
    store = RunStore(make_settings(tmp_path).store)

    async def record() -> None:
        for i, owner in enumerate(["alice"] + ["mallory"] * 5):
            log = await store.create(run_record(f"run_{i:012d}", {"query": "q", "status": "completed", "owner": owner}))
            await log.aclose()

    anyio.run(record)
    assert [s.request.owner for s in anyio.run(lambda: store.list(3, owner=Owner("alice")))] == ["alice"]
    assert len(anyio.run(lambda: store.list(3, owner=EVERY_OWNER))) == 3  # the operator's view: every owner


def test_one_owners_logins_never_evict_anothers_session(monkeypatch) -> None:
    monkeypatch.setattr(viewer_auth, "MAX_SESSIONS_PER_OWNER", 4)
    auth = ViewerAuth(tokens=["alice-token", "mallory-token"], policy=HostPolicy("127.0.0.1", 1, [], []))
    alice = anyio.run(auth.redeem, auth.issue_code(Owner("alice")))
    for _ in range(50):
        anyio.run(auth.redeem, auth.issue_code(Owner("mallory")))
    assert auth.session_owner(alice) == "alice"
    assert sum(1 for _, owner in auth._sessions.values() if owner == "mallory") == 4


def test_a_full_upload_area_does_not_tell_how_much_others_hold() -> None:
    message = str(uploads_over_store_cap(123_456_789, 1000, 200_000_000))
    assert "123456789" not in message and "123,456,789" not in message
    assert "RLM_MCP_STORE_MAX_BYTES" in message


@pytest.mark.anyio
async def test_run_records_are_pruned_per_owner(store_settings: Callable[..., Settings]) -> None:
    # Both stores: team mode keeps the same per-owner rule (RLM_MCP_RUN_MAX_RECORDS).
    async with make_stores(store_settings()) as stores:
        for i, owner in enumerate(["alice"] + ["mallory"] * 5):
            log = await stores.runs.create(
                run_record(f"run_{i:012d}", {"query": "q", "status": "running", "owner": owner})
            )
            await log.write_summary(
                run_record(log.run_id, {"status": "completed", "owner": owner, "result": {"status": "completed"}})
            )
            await log.aclose()
        removed = await stores.runs.prune(max_records=2, max_age_days=0)
        assert sorted(removed) == [f"run_{i:012d}" for i in (1, 2, 3)]  # mallory's oldest three
        kept = {s.run_id: s.request.owner for s in await stores.runs.list(10, owner=EVERY_OWNER)}
    assert kept == {"run_000000000000": "alice", "run_000000000004": "mallory", "run_000000000005": "mallory"}
