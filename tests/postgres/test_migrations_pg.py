"""Team mode's migrations (rlm_mcp/store/migrations/postgres/) over a database written by rlm-mcp
0.2 (schema version 6, tests/data/migrations/postgres_0_2.sql): it comes up at the latest
version with its contexts, uploads and runs, and in the schema a new database gets.
(tests/unit/test_migrations_sqlite.py is the same for the SQLite index.)"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store.migrations import MigrationError
from rlm_mcp.store.pg import Database
from rlm_mcp.store.pg.migrations import LATEST, migrate
from tests.data.migrations.make_dumps import ALICE, CONTEXTS, PART, RUN_ID, UPLOADED
from tests.fixtures_e2e import cli_env
from tests.fixtures_store import make_settings
from tests.paths import REPO

pytestmark = pytest.mark.anyio

DUMP = REPO / "tests" / "data" / "migrations" / "postgres_0_2.sql"


async def _restore_0_2(url: str) -> str:
    """The 0.2 database in `url`, its uploads' times moved to now (an unfinished upload expires
    a day after its last chunk); returns the unfinished upload's id."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(DUMP.read_text().encode())  # the dump's own statements, ours
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("UPDATE rlm_uploads SET created_at = %s, updated_at = %s", (time.time(), time.time()))
        cur = await conn.execute("SELECT upload_id FROM rlm_uploads WHERE NOT done")
        row = await cur.fetchone()
        assert row is not None
        return str(row[0])


async def test_a_database_of_0_2_comes_up_at_the_latest_version_with_its_rows(tmp_path: Path, pg_url: str) -> None:
    partial = await _restore_0_2(pg_url)
    async with make_stores(make_settings(tmp_path, database_url=pg_url)) as stores:
        assert isinstance(stores.lifecycle, Database) and stores.lifecycle.schema_version == LATEST
        mine = await stores.contexts.list(owner=LOCAL_OWNER)
        alices = await stores.contexts.list(owner=ALICE)
        assert [i.name for i in mine] == ["local notes"]
        assert sorted(i.name for i in alices) == ["alice's", "uploaded"]
        got: dict[str, bytes] = {}
        for owner, infos in ((LOCAL_OWNER, mine), (ALICE, alices)):
            async with stores.contexts.in_use([i.context_id for i in infos], owner=owner) as used:
                got |= {i.name: stores.contexts.spec(i).path.read_bytes() for i in used}
        assert got == {**CONTEXTS, "uploaded": UPLOADED}
        done = await stores.uploads.put_chunk(
            data=b"upload", index=1, upload_id=partial, final=True, sha256=None, name=None, format=None, owner=ALICE
        )
        assert done.done and done.context is not None and done.context.bytes == len(PART + b"upload")
        summary = await stores.runs.read_summary(RUN_ID, owner=ALICE)
        assert summary.status == "completed" and summary.result is not None and summary.result.answer == "42"
        assert [e.type for e in await stores.runs.read_events(RUN_ID, owner=ALICE)] == ["turn_start"]
        assert [r.run_id for r in await stores.runs.list(owner=ALICE)] == [RUN_ID]


_SCHEMA_QUERIES = {
    "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default, is_generated, "
    "generation_expression FROM information_schema.columns WHERE table_schema = 'public'",
    "storage": "SELECT c.relname, a.attname, a.attstorage FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
    "WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE connamespace = 'public'::regnamespace",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "sequences": "SELECT sequence_name, data_type FROM information_schema.sequences WHERE sequence_schema = 'public'",
    "versions": "SELECT version FROM rlm_schema",
}


async def _schema(url: str) -> dict[str, set[tuple[Any, ...]]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return {
            name: {tuple(row) for row in await (await conn.execute(sql)).fetchall()}
            for name, sql in _SCHEMA_QUERIES.items()
        }


async def test_a_database_of_0_2_migrated_has_the_schema_of_a_new_one(pg_url: str, pg_migrated_url: str) -> None:
    """`pg_migrated_url` is a new database migrated by this release; the 0.2 database, migrated,
    has every column (type, default, storage), constraint, index and sequence it has."""
    await _restore_0_2(pg_url)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        assert await migrate(conn) == LATEST
    old, new = await _schema(pg_url), await _schema(pg_migrated_url)
    assert new["versions"] == {(v,) for v in range(1, LATEST + 1)}
    for name in _SCHEMA_QUERIES:
        assert old[name] == new[name], name


async def test_a_step_that_fails_leaves_neither_its_changes_nor_its_version(
    pg_migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step runs in one transaction with its `rlm_schema` row: a step (here a function step,
    as a `NNNN_what.py` file gives) that fails half way is rolled back whole, the advisory lock is
    given back, and the next start tries it again."""
    from rlm_mcp.store import migrations as runner

    shipped = runner.migrations("postgres")

    async def half_done(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute("CREATE TABLE rlm_half_done (x integer)")
        raise RuntimeError("the step failed")

    failing = runner.Migration(LATEST + 1, f"{LATEST + 1:04d}_half_done.py", function=half_done)
    monkeypatch.setattr(runner, "migrations", lambda dialect: (*shipped, failing))
    async with await psycopg.AsyncConnection.connect(pg_migrated_url, autocommit=True) as conn:
        with pytest.raises(RuntimeError, match="the step failed"):
            await migrate(conn)
        cur = await conn.execute(
            "SELECT (SELECT max(version) FROM rlm_schema), to_regclass('rlm_half_done') IS NULL, "
            "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
        )
        assert await cur.fetchone() == (LATEST, True, 0)
        monkeypatch.setattr(runner, "migrations", lambda dialect: (*shipped, replace(failing, function=_done)))
        assert await migrate(conn) == LATEST + 1


async def _done(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("CREATE TABLE rlm_half_done (x integer)")


async def test_a_step_the_schema_refuses_is_named_with_its_fix_not_as_an_outage(tmp_path: Path, pg_url: str) -> None:
    """A database whose schema holds what a pending step creates (a migration of an earlier release
    cut off half way, or a change by hand) was reported as "unreachable" (issue 41): the start
    now names the step, the version the schema stays at, and what to do."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        assert await migrate(conn, target=6) == 6
        await conn.execute("CREATE TABLE rlm_sessions (session_id text)")  # what step 7 creates
    db = Database(pg_url, replica=False)
    try:
        with pytest.raises(MigrationError) as caught:
            await db.prepare()
    finally:
        await db.close()
    text = str(caught.value)
    assert f"could not be migrated from schema version 6 to {LATEST}: step 7 (0007_sessions.sql)" in text
    assert 'relation "rlm_sessions" already exists' in text and "unreachable" not in text
    assert "drop or rename what 0007_sessions.sql" in (caught.value.fix or "")
    # `doctor` says the same before any start, from a rehearsal it rolls back.
    done = await anyio.run_process(
        [sys.executable, "-m", "rlm_mcp", "doctor"],
        env=cli_env(tmp_path, RLM_MCP_BASE_URL="http://127.0.0.1:9/v1", RLM_MCP_DATABASE_URL=pg_url),
        check=False,
    )
    rows = (done.stdout + done.stderr).decode(errors="replace").splitlines()
    schema = [row for row in rows if row.startswith("FAIL  schema")]
    assert len(schema) == 1 and "step 7 (0007_sessions.sql) was refused" in schema[0], rows
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT max(version) FROM rlm_schema), to_regclass('rlm_session_snapshots') IS NULL"
        )
        assert await cur.fetchone() == (6, True)  # neither the start nor doctor changed anything
