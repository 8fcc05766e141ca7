"""The SQLite index's migrations (rlm_mcp/store/migrations/sqlite/): an index written by rlm-mcp
0.2 comes up at the latest version with its rows, a new index has the schema 0.2 made, a newer
index is refused, and processes opening an old index together migrate it once.

SQLite only: these are the file store's own index files (tests/postgres/test_migrations_pg.py
is the same for PostgreSQL)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.store import _db
from rlm_mcp.store.migrations import Dialect, Migration, SchemaError, latest, migrations, pending, read_folder
from rlm_mcp.store.sqlite_index import ContextStore
from tests.data.migrations.make_dumps import ALICE, CONTEXTS, PART, UPLOADED
from tests.paths import REPO

DUMP = REPO / "tests" / "data" / "migrations" / "sqlite_0_2.sql"


def _schema(conn: sqlite3.Connection) -> set[tuple[str, str, str, str | None]]:
    return {tuple(row) for row in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")}


def _schema_of_0_2() -> set[tuple[str, str, str, str | None]]:
    """0.2's schema and what the steps after it add (0003: the webhook outbox)."""
    later = REPO / "rlm_mcp" / "store" / "migrations" / "sqlite" / "0003_webhook_outbox.sql"
    with sqlite3.connect(":memory:") as conn:
        conn.executescript(DUMP.read_text())
        conn.executescript(later.read_text())
        return _schema(conn)


def _index_of_0_2(settings: Settings) -> Path:
    """The 0.2 index in `settings`' data dir, with the files it points at (blobs, an upload's
    part) and its times moved to now (an unfinished upload expires a day after its last chunk)."""
    store = ContextStore(settings.store)
    store._prepare()
    with sqlite3.connect(store.db_path) as conn:
        conn.executescript(DUMP.read_text())
        conn.execute("UPDATE uploads SET created_at = ?, updated_at = ?", (time.time(), time.time()))
        shas = {row[0]: row[1] for row in conn.execute("SELECT name, sha256 FROM contexts")}
        (partial,) = conn.execute("SELECT upload_id FROM uploads WHERE NOT done").fetchone()
    for name, data in {**CONTEXTS, "uploaded": UPLOADED}.items():
        store.blob_path(shas[name]).parent.mkdir(parents=True, exist_ok=True)
        store.blob_path(shas[name]).write_bytes(data)
    part = Path(settings.store.data_dir) / "uploads" / partial / "00000000.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(PART)
    return store.db_path


@pytest.mark.anyio
async def test_an_index_of_0_2_comes_up_at_the_latest_version_with_its_rows(settings: Settings) -> None:
    index = _index_of_0_2(settings)
    async with make_stores(settings) as stores:
        mine = await stores.contexts.list(owner=LOCAL_OWNER)
        alices = await stores.contexts.list(owner=ALICE)
        assert [i.name for i in mine] == ["local notes"]
        assert sorted(i.name for i in alices) == ["alice's", "uploaded"]
        got: dict[str, bytes] = {}
        for owner, infos in ((LOCAL_OWNER, mine), (ALICE, alices)):
            async with stores.contexts.in_use([i.context_id for i in infos], owner=owner) as used:
                got |= {i.name: stores.contexts.spec(i).path.read_bytes() for i in used}
        assert got == {**CONTEXTS, "uploaded": UPLOADED}
        with sqlite3.connect(index) as conn:
            (upload_id,) = conn.execute("SELECT upload_id FROM uploads WHERE NOT done").fetchone()
        done = await stores.uploads.put_chunk(
            data=b"upload", index=1, upload_id=upload_id, final=True, sha256=None, name=None, format=None,
            owner=ALICE,
        )  # fmt: skip
        assert done.done and done.context is not None and done.context.bytes == len(PART + b"upload")
    with sqlite3.connect(index) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == latest("sqlite")
        assert _schema(conn) == _schema_of_0_2()  # 0.2's schema and the steps after it


def test_a_new_index_has_the_schema_0_2_made(tmp_path: Path) -> None:
    with _db.connect(tmp_path / "index.sqlite3") as conn:
        assert _schema(conn) == _schema_of_0_2()
        assert conn.execute("PRAGMA user_version").fetchone()[0] == latest("sqlite")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_index_newer_than_this_release_is_refused_naming_both_versions(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite3"
    with sqlite3.connect(index) as conn:
        conn.execute(f"PRAGMA user_version = {latest('sqlite') + 1}")
    with pytest.raises(SchemaError) as caught, _db.connect(index):
        pass
    message = str(caught.value)
    assert f"index {index} is version {latest('sqlite') + 1}" in message
    assert f"(version {latest('sqlite')})" in message and "RLM_MCP_DATA_DIR" in message and "\n" not in message


def test_the_plan_starts_after_the_applied_version_and_stops_at_the_target() -> None:
    def plan(dialect: Dialect, current: int, target: int | None = None) -> list[int]:
        return [m.version for m in pending(dialect, current, where="index x", fix="f", target=target)]

    assert plan("sqlite", 0) == list(range(1, latest("sqlite") + 1))
    assert plan("sqlite", latest("sqlite")) == []
    assert plan("postgres", 1, target=3) == [2, 3]
    dialects: tuple[Dialect, ...] = ("sqlite", "postgres")
    for dialect in dialects:
        steps = migrations(dialect)
        assert [m.version for m in steps] == list(range(1, len(steps) + 1))
        assert all((m.sql is None) != (m.function is None) for m in steps)


# A process opening the index, with one step more than the shipped ones that fails when it runs
# twice (a plain ADD COLUMN, as most future steps will be). It marks the moment it has read the
# index's version (before it asks for the write lock), so the test can hold the lock until every
# process has read it.
_OPEN = """
import os
import sys
from pathlib import Path

from rlm_mcp.store import _db
from rlm_mcp.store import migrations as m

shipped = m.migrations("sqlite")
extra = m.Migration(len(shipped) + 1, "9999_twice_fails.sql", sql="ALTER TABLE pins ADD COLUMN extra TEXT")
m.migrations = lambda dialect: (*shipped, extra)
index, marks = Path(sys.argv[1]), Path(sys.argv[2])
first_read = _db._pending


def marking(*args):
    steps = first_read(*args)
    (marks / str(os.getpid())).touch()  # one name per process: two counting at once would collide
    _db._pending = first_read
    return steps


_db._pending = marking
with _db.connect(index) as conn:
    print(conn.execute("PRAGMA user_version").fetchone()[0])
"""


def test_processes_opening_an_index_of_0_1_together_migrate_it_once(tmp_path: Path) -> None:
    """0.1's index (no owners), opened by four processes that have all read its version while
    another held the write lock: each applies a step only after reading the version again under
    the write lock, so every step runs once (the extra one would fail a second time: "duplicate
    column") and the index ends with its rows migrated once."""
    index, marks = tmp_path / "index.sqlite3", tmp_path / "marks"
    marks.mkdir()
    holder = sqlite3.connect(index, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute(
        "CREATE TABLE contexts (context_id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, name TEXT NOT NULL, "
        "bytes INTEGER NOT NULL, format TEXT NOT NULL, kind TEXT NOT NULL, chars INTEGER NOT NULL, "
        "created_at REAL NOT NULL, last_used_at REAL NOT NULL, source TEXT NOT NULL)"
    )
    holder.execute(
        "CREATE TABLE pins (pin_id TEXT NOT NULL, context_id TEXT NOT NULL, host TEXT NOT NULL, "
        "pid INTEGER NOT NULL, proc_start TEXT, expires_at REAL NOT NULL)"
    )
    holder.execute("INSERT INTO contexts VALUES ('ctx_old', 'ab', 'old', 3, 'text', 'str', 3, 1, 1, '{}')")
    holder.execute("BEGIN IMMEDIATE")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN, str(index), str(marks)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for _ in range(4)
    ]
    try:
        # Below the busy timeout (30 s): the processes waiting on this lock never give up first.
        deadline = time.monotonic() + 25
        while len(list(marks.iterdir())) < 4 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.01)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    outcomes = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, [err.decode() for _, err in outcomes]
    assert {out.decode().strip() for out, _ in outcomes} == {str(latest("sqlite") + 1)}
    with sqlite3.connect(index) as conn:
        assert conn.execute("SELECT context_id, owner, name FROM context_owners").fetchall() == [
            ("ctx_old", LOCAL_OWNER, "old")
        ]
        assert {"owner", "extra"} <= {row[1] for row in conn.execute("PRAGMA table_info(pins)")}


def test_a_step_that_fails_leaves_neither_its_changes_nor_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step runs in one transaction with the version it records: a step (here a function
    step, as a `NNNN_what.py` file gives) that fails half way is rolled back whole, and the next
    start tries it again."""
    from rlm_mcp.store import migrations as runner

    shipped = migrations("sqlite")

    def half_done(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("the step failed")

    failing = Migration(len(shipped) + 1, f"{len(shipped) + 1:04d}_half_done.py", function=half_done)
    monkeypatch.setattr(runner, "migrations", lambda dialect: (*shipped, failing))
    index = tmp_path / "index.sqlite3"
    with pytest.raises(RuntimeError, match="the step failed"), _db.connect(index):
        pass
    with sqlite3.connect(index) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(shipped)  # the shipped steps stay
        assert {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}.isdisjoint({"half_done"})


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["0001_a.sql", "0003_c.sql"], "not numbered 1..N without a gap"),
        (["0001_a.sql", "0001_b.sql"], "not numbered 1..N without a gap"),
        (["0001_a.sql", "2_b.sql"], "is not named NNNN_what.sql or .py"),
    ],
)
def test_a_folder_with_a_gap_or_a_misnamed_file_is_refused(tmp_path: Path, names: list[str], problem: str) -> None:
    for name in names:
        (tmp_path / name).write_text("SELECT 1;")
    with pytest.raises(ValueError, match=problem):
        read_folder(tmp_path, "somewhere")
    (tmp_path / "README.md").write_text("notes")  # other files are no steps
    for name in names[1:]:
        (tmp_path / name).unlink()
    assert [m.name for m in read_folder(tmp_path, "somewhere")] == names[:1]
