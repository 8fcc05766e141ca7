"""Makes the databases of rlm-mcp 0.2 that tests/unit/test_migrations_sqlite.py and
tests/postgres/test_migrations_pg.py migrate: `sqlite_0_2.sql` (an SQLite index) and
`postgres_0_2.sql` (a PostgreSQL database at schema version 6, `pg_dump --inserts`).

Run it once with the release's own code, never with a later one (its stores would write the
later schema): `git worktree add /tmp/v02 82f2786 && cp tests/data/migrations/make_dumps.py
/tmp/v02/ && cd /tmp/v02 && uv sync --extra test -q && uv run python make_dumps.py OUT_DIR`.
The rows: two contexts of two owners (the blobs' bytes are `CONTEXTS` below), a finished
upload and one in progress (its first chunk is `PART`), and, in PostgreSQL, a finished run with
one event. The tests write the files the SQLite index points at (blobs, the upload's part) from
the same constants.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

from rlm_mcp.assembly import make_stores
from rlm_mcp.events import TurnStart
from rlm_mcp.owners import LOCAL_OWNER, Owner
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_postgres import PASSWORD, Cluster, fresh_database
from tests.fixtures_store import run_record

ALICE = Owner("token-alice")
CONTEXTS = {"local notes": b"notes of the local user", "alice's": b"alice's document"}
UPLOADED = b"an upload, whole"
PART = b"half of an "
RUN_ID = "run_0123456789ab"


async def _fill(settings_dir: Path, database_url: str | None) -> None:
    settings = make_settings(settings_dir, database_url=database_url)
    async with make_stores(settings) as stores:
        for (name, data), owner in zip(CONTEXTS.items(), (LOCAL_OWNER, ALICE), strict=True):
            await stores.contexts.put_bytes(data, name=name, format="text", source={"kind": "inline"}, owner=owner)
        await stores.uploads.put_chunk(
            data=UPLOADED, index=0, upload_id=None, final=True, sha256=None, name="uploaded", format="text",
            owner=ALICE,
        )  # fmt: skip
        await stores.uploads.put_chunk(
            data=PART, index=0, upload_id=None, final=False, sha256=None, name="partial", format="text",
            owner=ALICE,
        )  # fmt: skip
        if database_url is not None:
            log = await stores.runs.create(
                run_record(RUN_ID, {"query": "q", "owner": ALICE, "result": {"status": "completed", "answer": "42"}})
            )
            await log.append(TurnStart(run_id=RUN_ID, iteration=1, max_iterations=3, depth=0))
            await log.aclose()


def _sqlite(out: Path, work: Path) -> None:
    (work / "sqlite").mkdir()
    anyio.run(_fill, work / "sqlite", None)
    (index,) = (work / "sqlite" / "data").rglob("index.sqlite3")
    with sqlite3.connect(index) as conn:
        lines = list(conn.iterdump())
    (out / "sqlite_0_2.sql").write_text(
        "-- An SQLite index written by rlm-mcp 0.2 (82f2786): tests/data/migrations/make_dumps.py\n"
        + "\n".join(lines)
        + "\n"
    )


def _postgres(out: Path, work: Path) -> None:
    cluster = Cluster()
    try:
        cluster.start()
        for url in fresh_database(cluster):
            (work / "pg").mkdir()
            anyio.run(_fill, work / "pg", url)
            dump = subprocess.run(
                [str(cluster.bin / "pg_dump"), "--inserts", "--no-owner", "--no-privileges", url],
                capture_output=True, check=True, env={**os.environ, "PGPASSWORD": PASSWORD},
            ).stdout.decode()  # fmt: skip
            # psql's meta-commands (\restrict) are for psql; the tests send the dump over a driver.
            dump = re.sub(r"^\\.*\n", "", dump, flags=re.MULTILINE)
            (out / "postgres_0_2.sql").write_text(
                "-- A PostgreSQL database written by rlm-mcp 0.2 (82f2786), schema version 6:\n"
                "-- tests/data/migrations/make_dumps.py\n" + dump
            )
    finally:
        cluster.close()


if __name__ == "__main__":
    target = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        _sqlite(target, Path(tmp))
        _postgres(target, Path(tmp))
