"""Team mode's PostgreSQL store: what only it does (the rules both stores share are tested
against both in test_store_owners.py). Two store bundles with separate data dirs on one
database stand for two replicas on separate machines."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import anyio
import psycopg
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.events import Cell, LogTruncated, TurnStart, dumps
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER, Owner
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.pg import Database, DatabaseUnavailableError, SchemaError
from rlm_mcp.store.pg.contexts import PgContextStore
from rlm_mcp.store.pg.migrations import LATEST
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_postgres import PASSWORD, Cluster
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

ALICE = Owner("token-alice")


def _cell(block: int, output: str) -> Cell:
    return Cell(
        run_id="run_1", iteration=1, block=block, code="print()", output=output, duration_s=0.1, error=None,
        timed_out=False, restarted=False, depth=0,
    )  # fmt: skip


def _replica(tmp_path: Path, name: str, url: str, **overrides: object) -> Stores:
    return make_stores(make_settings(tmp_path, data_dir=tmp_path / name, database_url=url, **overrides), replica=True)


def _contexts(stores: Stores) -> PgContextStore:
    assert isinstance(stores.contexts, PgContextStore)
    return stores.contexts


async def test_bytes_stored_on_one_replica_reach_another_chunked(tmp_path: Path, pg_url: str) -> None:
    data = ("line of text é\n" * 250_000).encode()  # ~3.8 MiB: several 1 MiB chunks
    async with _replica(tmp_path, "a", pg_url) as a, _replica(tmp_path, "b", pg_url) as b:
        info = await a.contexts.put_bytes(data, name="big", format="text", source={}, owner=ALICE)
        assert [i.context_id for i in await b.contexts.list(owner=ALICE)] == [info.context_id]
        path = b.contexts.spec(info).path
        assert not path.exists()  # b has not seen it yet
        async with b.contexts.in_use([info.context_id], owner=ALICE) as infos:
            assert infos[0].chars == len(data.decode())
            assert hashlib.sha256(path.read_bytes()).hexdigest() == info.sha256
            # a pin taken on b protects the context from a's delete of every owner
            with pytest.raises(BadArgumentError, match="in use by a running run"):
                await a.contexts.delete(info.context_id, owner=EVERY_OWNER)
        # a delete on a reaches b's cache at b's next sweep (each heartbeat runs one)
        assert await a.contexts.delete(info.context_id, owner=ALICE) is True
        assert not _contexts(a).cache.path(info.sha256).exists()
        assert await _contexts(b).cache.sweep(_db(b)) == [info.sha256]
        assert not path.exists()
        with pytest.raises(NotFoundError):
            await b.contexts.get(info.context_id, owner=ALICE)


def _db(stores: Stores) -> Database:
    assert isinstance(stores.lifecycle, Database)
    return stores.lifecycle


async def test_upload_chunks_may_land_on_different_replicas(tmp_path: Path, pg_url: str) -> None:
    parts = [b"first part, ", b"second part, ", b"last part"]
    async with _replica(tmp_path, "a", pg_url) as a, _replica(tmp_path, "b", pg_url) as b:
        replicas = [a, b, a]
        upload_id = None
        for index, (part, stores) in enumerate(zip(parts, replicas, strict=True)):
            state = await stores.uploads.put_chunk(
                data=part,
                index=index,
                upload_id=upload_id,
                final=index == len(parts) - 1,
                sha256=hashlib.sha256(b"".join(parts)).hexdigest() if index == len(parts) - 1 else None,
                name="parts",
                format="text",
                owner=ALICE,
            )
            upload_id = state.upload_id
        assert state.done and state.context is not None
        # the resend of an already stored chunk on the other replica is a no-op; a gap is refused
        again = await b.uploads.put_chunk(
            data=parts[-1], index=2, upload_id=upload_id, final=True, sha256=None, name=None, format=None, owner=ALICE
        )
        assert again.done and again.context is not None and again.context.context_id == state.context.context_id
        async with b.contexts.in_use([state.context.context_id], owner=ALICE):
            assert b.contexts.spec(state.context).path.read_bytes() == b"".join(parts)
        with pytest.raises(BadArgumentError, match="expects index 1"):
            first = await a.uploads.put_chunk(
                data=b"x", index=0, upload_id=None, final=False, sha256=None, name=None, format=None, owner=ALICE
            )
            await b.uploads.put_chunk(
                data=b"y", index=2, upload_id=first.upload_id, final=False, sha256=None, name=None, format=None,
                owner=ALICE,
            )  # fmt: skip


async def test_run_records_are_read_on_every_replica(tmp_path: Path, pg_url: str) -> None:
    async with _replica(tmp_path, "a", pg_url) as a, _replica(tmp_path, "b", pg_url) as b:
        log = await a.runs.create(run_record("run_1", {"status": "running", "owner": ALICE}))
        before = await b.runs.version("run_1")
        await log.append(_cell(0, "x" * 10))
        await log.append(TurnStart(run_id="run_1", iteration=1, max_iterations=1, depth=0))
        assert await b.runs.version("run_1") != before
        await log.write_summary(
            run_record(log.run_id, {"status": "completed", "owner": ALICE, "result": {"answer": "42"}})
        )
        await log.aclose()
        assert (await b.runs.read_summary("run_1", owner=ALICE)).result.answer == "42"  # type: ignore[union-attr]
        assert [e.type for e in await b.runs.read_events("run_1", owner=ALICE)] == ["cell", "turn_start"]
        with pytest.raises(NotFoundError):
            await b.runs.read_events("run_1", owner=LOCAL_OWNER)
        with pytest.raises(BadArgumentError, match="already exists"):
            await b.runs.create(run_record("run_1", {"owner": ALICE}))
        assert await b.runs.prune(max_records=0, max_age_days=0) == ["run_1"]
        assert await a.runs.list(owner=EVERY_OWNER) == []


async def test_run_log_is_capped_like_the_file_log(tmp_path: Path, pg_url: str) -> None:
    settings = make_settings(tmp_path, database_url=pg_url)
    from rlm_mcp.store.pg.runs import PgRunStore

    async with make_stores(settings) as stores:
        runs = PgRunStore(_db(stores), max_event_bytes=200, max_log_bytes=600)
        log = await runs.create(run_record("run_cap", {"owner": ALICE}))
        for i in range(20):
            await log.append(_cell(i, "y" * 1000))
        events = await runs.read_events("run_cap", owner=ALICE)
        assert isinstance(events[-1], LogTruncated) and events[-1].max_bytes == 600
        assert all(len(dumps(e).encode()) < 200 for e in events)  # each line within the event cap


async def test_migrations_apply_once_and_a_newer_schema_is_refused(tmp_path: Path, pg_url: str) -> None:
    dbs = [Database(pg_url, replica=False) for _ in range(4)]
    async with anyio.create_task_group() as tg:
        for db in dbs:
            tg.start_soon(db.open)
    try:
        assert {db.schema_version for db in dbs} == {LATEST}
        async with dbs[0].connection() as conn:
            cur = await conn.execute("SELECT count(*) AS n FROM rlm_schema")
            assert (await cur.fetchone() or {})["n"] == LATEST
            await conn.execute("INSERT INTO rlm_schema VALUES (%s, now())", (LATEST + 1,))
    finally:
        for db in dbs:
            await db.close()
    with pytest.raises(SchemaError) as caught:
        async with make_stores(make_settings(tmp_path, database_url=pg_url)):
            pass
    message = str(caught.value)
    assert f"version {LATEST + 1}" in message and f"version {LATEST})" in message and "\n" not in message


async def test_unreachable_database_is_a_clear_error_without_the_password(
    tmp_path: Path, pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = pg_cluster.url(password="not-the-" + PASSWORD)
    with pytest.raises(DatabaseUnavailableError) as caught:
        async with make_stores(make_settings(tmp_path, database_url=wrong)):
            pass
    text = str(caught.value)
    assert "is unreachable" in text and "RLM_MCP_DATABASE_URL" in text and "rlm@127.0.0.1" in text
    assert PASSWORD not in text and PASSWORD not in caplog.text
    nothing = f"postgresql://rlm:{PASSWORD}@127.0.0.1:1/postgres"  # nothing listens on port 1
    with pytest.raises(DatabaseUnavailableError) as caught:
        async with make_stores(make_settings(tmp_path, database_url=nothing)):
            pass
    assert PASSWORD not in str(caught.value) and "Check that PostgreSQL is running" in str(caught.value)


async def test_a_postgresql_restart_is_survived_by_reconnecting(
    tmp_path: Path, pg_cluster: Cluster, pg_url: str
) -> None:
    async with _replica(tmp_path, "a", pg_url) as a:
        info = await a.contexts.put_bytes(b"before", name="x", format="text", source={}, owner=ALICE)
        pg_cluster.stop()
        try:
            with pytest.raises(DatabaseUnavailableError, match="is unreachable") as caught:
                await a.contexts.list(owner=ALICE)
            assert PASSWORD not in str(caught.value)
        finally:
            pg_cluster.start()
        assert [i.context_id for i in await a.contexts.list(owner=ALICE)] == [info.context_id]


def test_the_url_is_never_shown() -> None:
    from rlm_mcp.store.pg.db import describe, redact

    url = "postgresql://team:s3cret@db.example:6543/rlm"
    assert describe(url) == "team@db.example:6543/rlm"
    assert "s3cret" not in redact(f"connection to {url} failed: password s3cret", url)
    with pytest.raises(psycopg.ProgrammingError):
        psycopg.conninfo.conninfo_to_dict("not a url ===")


async def test_doctor_reports_the_database_schema_and_replicas(
    tmp_path: Path, pg_cluster: Cluster, pg_url: str
) -> None:
    from rlm_mcp.doctor import _team

    fresh = await _team(make_settings(tmp_path, database_url=pg_url))
    assert [(c.name, c.ok) for c in fresh] == [
        ("database", True),
        ("database encoding", True),
        ("database privileges", True),
        ("schema", True),
        ("clock", True),
        ("replicas", True),
    ]
    assert "the first server start migrates it" in fresh[3].detail
    async with _replica(tmp_path, "a", pg_url):
        checks = {c.name: c for c in await _team(make_settings(tmp_path, database_url=pg_url))}
        assert checks["schema"].detail == f"version {LATEST}"
        assert "pid" in checks["replicas"].detail
    wrong = await _team(make_settings(tmp_path, database_url=pg_cluster.url(password="wrong")))
    assert wrong[0].name == "database" and not wrong[0].ok and "RLM_MCP_DATABASE_URL" in wrong[0].fix
    assert PASSWORD not in wrong[0].detail + wrong[0].fix


def test_a_bad_database_url_is_refused_without_echoing_it() -> None:
    from pydantic import ValidationError

    from rlm_mcp.config import SETTING_FIELDS, Settings
    from rlm_mcp.config_check import describe_validation_error

    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, database_url="mysql://u:s3cret@h/db")
    text = describe_validation_error(caught.value, SETTING_FIELDS)
    assert "RLM_MCP_DATABASE_URL" in text and "postgresql://" in text and "s3cret" not in text


async def test_a_host_clock_off_the_databases_is_shown_by_doctor_and_warned_of_at_start(
    tmp_path: Path, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Leases, timeouts and record ages use the database's clock; a host whose own clock is two
    minutes off says so (doctor's `clock` row, a warning at start), and one in sync does not."""
    import time

    from rlm_mcp.doctor import _clock
    from rlm_mcp.service.queue import warn_of_clock_skew
    from rlm_mcp.service.queue.rules import queue_rules
    from rlm_mcp.store.pg.queue import PgRunQueue
    from rlm_mcp.store.pg.status import team_status

    def ahead() -> float:
        return time.time() + 120

    in_sync, off = await team_status(pg_url, 30.0), await team_status(pg_url, 30.0, clock=ahead)
    assert in_sync.clock_skew_s is not None and abs(in_sync.clock_skew_s) < 2
    assert off.clock_skew_s is not None and 118 < off.clock_skew_s < 122
    assert not _clock(in_sync.clock_skew_s).warn
    row = _clock(off.clock_skew_s)
    assert row.warn and "ahead of the database's" in row.detail and "NTP" in row.fix
    settings = make_settings(tmp_path, database_url=pg_url)
    async with make_stores(settings) as stores:
        assert isinstance(stores.lifecycle, Database)
        with caplog.at_level(logging.WARNING, logger="rlm_mcp.queue"):
            await warn_of_clock_skew(PgRunQueue(queue_rules(settings.queue), stores.lifecycle))
            assert not caplog.records
            skew = await warn_of_clock_skew(PgRunQueue(queue_rules(settings.queue), stores.lifecycle, clock=ahead))
        assert skew is not None and skew > 100
        assert "120" in caplog.text or "119" in caplog.text or "121" in caplog.text


# Today's release's queue tables as its migration 3 left them (the columns migration 6 reads or
# drops), and rows as that release writes them.
_FORMER_QUEUE = """
CREATE TYPE procrastinate_job_status AS ENUM ('todo', 'doing', 'succeeded', 'failed', 'cancelled', 'aborted');
CREATE TABLE procrastinate_workers (id bigserial PRIMARY KEY, last_heartbeat timestamptz NOT NULL DEFAULT now());
CREATE TABLE procrastinate_jobs (
    id bigserial PRIMARY KEY, queue_name text NOT NULL, task_name text NOT NULL,
    status procrastinate_job_status NOT NULL DEFAULT 'todo', args jsonb NOT NULL DEFAULT '{}',
    worker_id bigint REFERENCES procrastinate_workers (id) ON DELETE SET NULL
);
CREATE FUNCTION procrastinate_fetch_job_v2(target_queue_names character varying[], p_worker_id bigint)
    RETURNS procrastinate_jobs LANGUAGE sql AS 'SELECT * FROM procrastinate_jobs LIMIT 1';
"""


async def test_a_database_of_the_former_release_migrates_with_its_runs_in_flight(tmp_path: Path, pg_url: str) -> None:
    """Migration 6 from a database made by the release that queued runs through Procrastinate:
    finished runs stay finished, queued runs stay queued (claimable, with their sandbox need),
    a run running on a former worker stays running under it but is never queued again (its
    worker cannot heartbeat the new table: the sweepers end it one lease later), a summary
    holding a NUL does not stop the migration, the former queue's tables, functions and types
    are gone, and the waiting bound and claims work on the result."""
    from rlm_mcp.service.queue.rules import queue_rules
    from rlm_mcp.store.migrations import migrations
    from rlm_mcp.store.pg.queue import PgRunQueue

    limits = '"limits": {"max_iterations": 5, "max_depth": %d, "timeout_s": 60.0}'
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE rlm_schema (version integer NOT NULL, applied_at timestamptz)")
        for step in migrations("postgres")[:5]:
            text = _FORMER_QUEUE if step.version == 3 else step.sql
            assert text is not None
            await conn.execute(text.encode())
            await conn.execute("INSERT INTO rlm_schema VALUES (%s, now())", (step.version,))
        await conn.execute("INSERT INTO procrastinate_workers (id) VALUES (41)")
        await conn.execute("INSERT INTO rlm_workers VALUES (41, 'owner-old', 'oldhost', 7, 0, NULL)")
        rows = [
            ("run_old_done00000001", True, None, 1, '{"result": {"status": "completed"}}'),
            ("run_old_queued000001", False, None, 3, "{%s}" % (limits % 3)),
            ("run_old_running00001", False, 41, 1, '{"query": "nul \\u0000 here", %s}' % (limits % 1)),
        ]
        for run_id, done, worker, job, summary in rows:
            await conn.execute(
                "INSERT INTO rlm_runs (run_id, owner, created_at, updated_at, done, summary, job_id, worker_id) "
                "VALUES (%s, 'local', 1, 1, %s, %s, %s, %s)",
                (run_id, done, summary, job, worker),
            )
    settings = make_settings(tmp_path, database_url=pg_url, worker_lease_s=30.0)
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database) and db.schema_version == LATEST
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT run_id, state, attempt, need, requeues, worker_id FROM rlm_runs ORDER BY run_id"
            )
            got = {
                r["run_id"]: (r["state"], r["attempt"], r["need"], r["requeues"], r["worker_id"])
                for r in await cur.fetchall()
            }
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM pg_class WHERE relname LIKE 'procrastinate%%') + "
                "(SELECT count(*) FROM pg_proc WHERE proname LIKE 'procrastinate%%') + "
                "(SELECT count(*) FROM pg_type WHERE typname LIKE 'procrastinate%%') AS n"
            )
            left = (await cur.fetchone() or {})["n"]
        assert got == {
            "run_old_done00000001": ("done", 0, 1, 0, None),
            "run_old_queued000001": ("queued", 0, 3, 0, None),
            "run_old_running00001": ("running", 1, 1, 1, 41),
        }
        assert left == 0
        queue = PgRunQueue(queue_rules(settings.queue), db)
        worker = await queue.register_worker("owner-new", 4)
        assert worker > 41
        assert await queue.claim(worker, free_sandboxes=2, max_sandboxes=8) is None  # needs 3 sandboxes
        claimed = await queue.claim(worker, free_sandboxes=3, max_sandboxes=8)
        assert claimed is not None and claimed.run_id == "run_old_queued000001" and claimed.attempt == 1


async def test_replicas_with_skewed_clocks_keep_each_others_pins_and_live_runs(tmp_path: Path, pg_url: str) -> None:
    """Pins, replica heartbeats and record ages are judged by the database's clock: a replica two
    minutes behind keeps its pin against another replica's delete, and one 31 days ahead prunes
    no live run and no recent record (both broke when each replica used its own clock)."""
    import time

    async with _replica(tmp_path, "a", pg_url) as a, _replica(tmp_path, "b", pg_url) as b:
        info = await a.contexts.put_bytes(b"pinned text", name="p", format="text", source={}, owner=ALICE)
        _contexts(b).index.clock = lambda: time.time() - 120  # replica b's clock is behind
        assert isinstance(b.lifecycle, Database)
        await b.lifecycle._beat()
        async with b.contexts.in_use([info.context_id], owner=ALICE):
            with pytest.raises(BadArgumentError, match="in use by a running run"):
                await a.contexts.delete(info.context_id, owner=EVERY_OWNER)
        await a.runs.create(run_record("run_live_skew0000001", {"status": "running", "owner": ALICE}))
        finished = await a.runs.create(run_record("run_done_skew0000001", {"status": "running", "owner": ALICE}))
        await finished.write_summary(
            run_record(
                "run_done_skew0000001", {"status": "completed", "owner": ALICE, "result": {"status": "completed"}}
            )
        )
        # Replica b's clock is far ahead (its run store reads no clock of its own: prune ages by the database's).
        _contexts(b).index.clock = lambda: time.time() + 31 * 86400
        assert await b.runs.prune(max_records=1000, max_age_days=30) == []
        assert {r.run_id for r in await a.runs.list(owner=ALICE)} == {"run_live_skew0000001", "run_done_skew0000001"}
