"""Team-mode kept sessions in a real PostgreSQL, in process (no Docker): of many follow-ups sent at
once through two replicas' connections exactly one takes the session, and the session is free again
once its run's row is done; the per-owner cap holds under concurrent opens; a snapshot is stored
only for the generation it was taken after and within the owner's byte cap, read back byte for
byte; a follow-up queued for the worker holding the live sandbox is claimed by no other worker
until the preference lapses (or that worker is gone); a session past its maximum age (the
database's clock) expires; the CLI lists and closes its own team sessions."""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio
import pytest

from rlm_mcp.cli.sessions import sessions_close, sessions_list
from rlm_mcp.config import Settings
from rlm_mcp.errors import BusyError, NotFoundError
from rlm_mcp.ports.session_store import AfterRun
from rlm_mcp.store.pg.sessions import FORGET_ENDED_S, PgSessionStore
from tests.fixtures_sessions import DAY, replica
from tests.fixtures_store import final, summary

pytestmark = pytest.mark.anyio


async def test_of_many_follow_ups_exactly_one_takes_the_session(tmp_path: Path, pg_url: str) -> None:
    async with replica(tmp_path, pg_url, "a") as (a, queue), replica(tmp_path, pg_url, "b") as (b, _):
        await a.open("ses_1", "alice", "run_first", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_first", owner="alice"), 1)
        # The first run has not ended: nobody takes the session.
        assert await b.claim("ses_1", "alice", "run_x", max_age_s=DAY) is None

        await queue.finish("run_first", final("run_first"))
        won: list[str] = []

        async def follow_up(store: PgSessionStore, run_id: str) -> None:
            if await store.claim("ses_1", "alice", run_id, max_age_s=DAY) is not None:
                won.append(run_id)

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(follow_up, (a, b)[i % 2], f"run_{i}")
        assert len(won) == 1
        row = await a.read("ses_1")
        assert row is not None and row.running_run == won[0] and not row.free
        assert row.run_ids == ["run_first", won[0]]

        # The worker records the run's end: the session is free and one generation further.
        generation = await b.finish_run(
            "ses_1",
            won[0],
            AfterRun(
                worker_id=7, began=True, context_ids=["ctx_a"], histories=[[{"role": "user", "content": "q\u0000"}]]
            ),
        )
        assert generation == 1
        row = await a.read("ses_1")
        assert row is not None and row.free and row.worker_id == 7
        assert row.histories == [[{"role": "user", "content": "q\u0000"}]]
        assert await a.claim("ses_1", "bob", "run_bob", max_age_s=DAY) is None  # another owner's: never


async def test_the_per_owner_cap_holds_under_concurrent_opens(tmp_path: Path, pg_url: str) -> None:
    async with replica(tmp_path, pg_url, "a") as (a, _), replica(tmp_path, pg_url, "b") as (b, _):
        refused: list[str] = []

        async def open_one(store: PgSessionStore, i: int) -> None:
            try:
                await store.open(f"ses_{i}", "alice", f"run_{i}", cap=3, max_age_s=DAY)
            except BusyError as exc:
                refused.append(str(exc))

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(open_one, (a, b)[i % 2], i)
        assert len(refused) == 5 and all("RLM_MCP_MAX_SESSIONS_PER_OWNER=3" in r for r in refused)
        assert len(await a.list_open("alice", max_age_s=DAY)) == 3
        await b.open("ses_bob", "bob", "run_bob", cap=3, max_age_s=DAY)  # another owner's own share
        # A session whose first run is on its way to the queue is not closed under it.
        assert await a.close("ses_0") is False
        assert [r.session_id for r in await a.list_open("bob", max_age_s=DAY)] == ["ses_bob"]


async def test_a_snapshot_is_stored_for_its_generation_within_the_owner_cap(tmp_path: Path, pg_url: str) -> None:
    async with replica(tmp_path, pg_url, "a") as (store, queue):
        for sid in ("ses_s1", "ses_s2"):
            await store.open(sid, "alice", f"run_{sid}", cap=4, max_age_s=DAY)
            await queue.enqueue(summary(f"run_{sid}", owner="alice"), 1)
            assert await store.finish_run(sid, f"run_{sid}", AfterRun(worker_id=1, began=True, context_ids=["c"]))
        blob = bytes(range(256)) * 9000  # a little over two 1 MiB chunks
        assert await store.save_snapshot("ses_s1", 0, blob, owner_cap=10 << 20) is not None  # not its generation
        assert await store.save_snapshot("ses_s1", 1, blob, owner_cap=10 << 20) is None
        assert await store.read_snapshot("ses_s1") == (1, blob)
        why = await store.save_snapshot("ses_s2", 1, blob, owner_cap=len(blob) + 10)
        assert why is not None and "RLM_MCP_SESSION_SNAPSHOT_BYTES_PER_OWNER" in why
        row = await store.read("ses_s2")
        assert row is not None and row.snapshot_error == why and await store.read_snapshot("ses_s2") is None

        await queue.finish("run_ses_s1", final("run_ses_s1"))
        assert await store.close("ses_s1") is True
        assert await store.read_snapshot("ses_s1") is None
        closed = await store.read("ses_s1")
        assert closed is not None and closed.state == "closed"
        assert await store.claim("ses_s1", "alice", "run_late", max_age_s=DAY) is None


async def test_a_follow_up_waits_for_the_worker_holding_its_sandbox(tmp_path: Path, pg_url: str) -> None:
    async with replica(tmp_path, pg_url, "a") as (_, queue):
        holder = await queue.register_worker("owner-holder", 2)
        other = await queue.register_worker("owner-other", 2)
        await queue.enqueue(summary("run_pref", owner="alice"), 1, prefer_worker=holder, prefer_s=3600)
        assert await queue.claim(other, 2, 2) is None  # held back for the holder
        claimed = await queue.claim(holder, 2, 2)
        assert claimed is not None and claimed.run_id == "run_pref"

        await queue.enqueue(summary("run_lapsed", owner="alice"), 1, prefer_worker=holder, prefer_s=0)
        lapsed = await queue.claim(other, 2, 2)  # the preference has lapsed: anyone may take it
        assert lapsed is not None and lapsed.run_id == "run_lapsed"

        await queue.enqueue(summary("run_gone", owner="carol"), 1, prefer_worker=holder, prefer_s=3600)
        await queue.mark_gone(holder)  # the holder is gone: no wait for it
        gone = await queue.claim(other, 2, 2)
        assert gone is not None and gone.run_id == "run_gone"


async def test_a_session_past_its_maximum_age_expires_and_says_so(tmp_path: Path, pg_url: str) -> None:
    async with replica(tmp_path, pg_url, "a") as (store, queue):
        await store.open("ses_old", "alice", "run_old", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_old", owner="alice"), 1)
        await queue.finish("run_old", final("run_old"))
        # Judged by the database's clock: with a maximum age of 0 s it is over at once.
        assert await store.claim("ses_old", "alice", "run_next", max_age_s=0.0) is None
        assert await store.list_open("alice", max_age_s=0.0) == []
        assert await store.expire(max_age_s=0.0) == 1
        row = await store.read("ses_old")
        assert row is not None and row.state == "expired"
        assert await store.claim("ses_old", "alice", "run_next", max_age_s=DAY) is None


async def test_the_expiry_sweep_forgets_sessions_ended_a_day_ago_in_the_same_statement(
    tmp_path: Path, pg_url: str
) -> None:
    """`expire`'s one statement ends what is past its age and forgets what ended over a day ago
    (FORGET_ENDED_S), and no other: a session it ends now is kept, and so is one ended lately."""
    async with replica(tmp_path, pg_url, "a") as (store, queue):
        for sid, run in (("ses_ancient", "run_ancient"), ("ses_lately", "run_lately"), ("ses_now", "run_now")):
            await store.open(sid, "alice", run, cap=4, max_age_s=DAY)
            await queue.enqueue(summary(run, owner="alice"), 1)
            await queue.finish(run, final(run))
        async with store._db.connection() as conn:
            await conn.execute(
                "UPDATE rlm_sessions SET state = 'closed', ended_at = now() - make_interval(secs => %s), "
                "created_at = now() WHERE session_id = %s",
                (FORGET_ENDED_S + 60, "ses_ancient"),
            )
            await conn.execute(
                "UPDATE rlm_sessions SET state = 'closed', ended_at = now() - interval '1 hour', created_at = now() "
                "WHERE session_id = 'ses_lately'"
            )
            await conn.execute(
                "UPDATE rlm_sessions SET created_at = now() - interval '2 days' WHERE session_id = 'ses_now'"
            )
        assert await store.expire(max_age_s=DAY) == 1
        assert await store.read("ses_ancient") is None
        lately, now = await store.read("ses_lately"), await store.read("ses_now")
        assert lately is not None and lately.state == "closed"
        assert now is not None and now.state == "expired"


async def test_the_cli_lists_and_closes_its_team_sessions(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(database_url=pg_url, data_dir=tmp_path / "cli")
    async with replica(tmp_path, pg_url, "a") as (store, queue):
        await store.open("ses_cli", "local", "run_cli", cap=4, max_age_s=DAY)
        await store.open("ses_other", "alice", "run_alice", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_cli", owner="local"), 1)
        await queue.finish("run_cli", final("run_cli"))
        assert await sessions_list(argparse.Namespace(), settings) == 0
        listed = capsys.readouterr().out
        assert "ses_cli" in listed and "1 runs" in listed and "ses_other" not in listed
        assert await sessions_close(argparse.Namespace(session_id="ses_cli"), settings) == 0
        assert "closed ses_cli" in capsys.readouterr().out
        with pytest.raises(NotFoundError, match="was closed"):
            await sessions_close(argparse.Namespace(session_id="ses_cli"), settings)
        with pytest.raises(NotFoundError, match="Unknown session id 'ses_other'"):
            await sessions_close(argparse.Namespace(session_id="ses_other"), settings)


async def test_doctor_counts_the_open_sessions_and_their_snapshot_bytes(tmp_path: Path, pg_url: str) -> None:
    """`rlm-mcp doctor` in team mode: the open sessions, those a run holds now, the snapshots'
    bytes, and why a session has no current snapshot (read from the database, changing nothing)."""
    from rlm_mcp.doctor import _team

    async def shown() -> tuple[str, bool]:
        settings = Settings(database_url=pg_url, data_dir=tmp_path / "doctor")
        [check] = [c for c in await _team(settings) if c.name == "sessions"]
        assert check.ok
        return check.detail, check.warn

    async with replica(tmp_path, pg_url, "a") as (store, queue):
        assert await shown() == ("none open", False)
        await store.open("ses_doc1", "alice", "run_doc1", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_doc1", owner="alice"), 1)
        await queue.finish("run_doc1", final("run_doc1"))
        generation = await store.finish_run("ses_doc1", "run_doc1", AfterRun(worker_id=None, began=True))
        assert generation == 1
        assert await store.save_snapshot("ses_doc1", 1, b"x" * 3072, owner_cap=2**20) is None
        await store.open("ses_doc2", "bob", "run_doc2", cap=4, max_age_s=DAY)
        await queue.enqueue(summary("run_doc2", owner="bob"), 1)  # still queued: the session is busy
        assert await shown() == (
            "2 open (1 running a run now); 1 with a snapshot, 3.0 KiB in all, the largest 3.0 KiB",
            False,
        )

        await store.snapshot_failed("ses_doc1", 1, "the namespace is larger than RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES")
        detail, warn = await shown()
        assert warn and detail.endswith(
            "; 1 without a current snapshot: the namespace is larger than RLM_MCP_SESSION_SNAPSHOT_MAX_BYTES"
        ), detail
