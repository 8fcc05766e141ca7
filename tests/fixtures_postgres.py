"""A private PostgreSQL cluster for the tests marked `postgres` (team mode).

One cluster per test session: `initdb` and `postgres` from Debian's `postgresql` package
(`/usr/lib/postgresql/<version>/bin`; `.ci/run` installs it), data and socket in a temp folder,
listening on a free loopback port, password authentication (so the tests can check the password
never leaks). Both refuse to run as root: as root they run as `nobody` through `runuser`, in a
temp folder `nobody` owns
(`initdb` under `runuser`; the server started by `Popen(user=...)` so a signal reaches it). Each test gets a database of its own (`pg_url`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.store.factory import Stores
from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.settings import make_settings

PASSWORD = "pw-" + secrets.token_hex(8)
USER = "rlm"


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not found:
        pytest.fail(
            "PostgreSQL's server binaries are missing (/usr/lib/postgresql/<version>/bin/initdb). "
            "Install them (Debian: apt-get install postgresql), or deselect these tests with -m 'not postgres'."
        )
    return found[-1].parent


class Cluster:
    """`data`: where the data directory goes (a small disk, say; default: in the cluster's temp
    folder), `initdb_args`: more arguments to initdb (e.g. `-X` to keep the WAL elsewhere)."""

    def __init__(self, *, data: Path | None = None, initdb_args: Sequence[str] = ()) -> None:
        self.bin = _bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="rlm-pg-"))
        self.data = data if data is not None else self.dir / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.dir, "nobody", "nogroup")
        os.chmod(self.dir, 0o700)
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD)
        if self._as_root:
            shutil.chown(pwfile, "nobody", "nogroup")
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "-A",
                "scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--no-sync",
                *initdb_args,
            ],
        )
        pwfile.unlink()

    def _cmd(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "nobody", "--", *argv] if self._as_root else argv

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(self._cmd(argv), cwd=self.dir, capture_output=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.decode(errors='replace')[-2000:]}")

    def url(self, dbname: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        argv = [
            str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.dir),
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off", "-c", "max_connections=200",
        ]  # fmt: skip
        log = open(self.dir / "postgres.log", "ab")  # noqa: SIM115 - the server writes it until stop()
        # Started as nobody by Popen itself (not under runuser), so stop()'s signal reaches postgres.
        as_nobody: dict[str, object] = (
            {"user": "nobody", "group": "nogroup", "extra_groups": []} if self._as_root else {}
        )
        self.proc = subprocess.Popen(argv, cwd=self.dir, stdout=log, stderr=log, **as_nobody)  # type: ignore[call-overload]
        log.close()
        # pg_isready answers at once (no retry): poll it, as wait_until does, with a generous deadline.
        deadline = time.monotonic() + 120
        while True:
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True
            )
            if ready.returncode == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self.dir / "postgres.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"postgres did not start: {log_text}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: disconnects clients
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def sql(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(statement.encode())

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def fresh_database(cluster: Cluster, template: str | None = None) -> Iterator[str]:
    """A new database of the session's cluster (a copy of `template`, if given), dropped after."""
    if cluster.proc is None:
        cluster.start()  # a test that stopped the cluster failed before starting it again
    name = "t_" + secrets.token_hex(6)
    cluster.sql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        yield cluster.url(name)
    finally:
        if cluster.proc is not None:
            cluster.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh, empty database of the session's cluster."""
    yield from fresh_database(pg_cluster)


TEMPLATE = "rlm_template"


@pytest.fixture(scope="session")
def pg_template(pg_cluster: Cluster) -> str:
    """A database holding the current schema, migrated once per session; the tests over both
    stores get copies of it (`CREATE DATABASE ... TEMPLATE`), cheaper than migrating each one.
    The migrations themselves are tested on empty databases (`pg_url`, tests/postgres/test_store_pg.py)."""
    import anyio
    import psycopg

    from rlm_mcp.store.pg.migrations import migrate

    if pg_cluster.proc is None:
        pg_cluster.start()  # a test that stopped the cluster failed before starting it again
    pg_cluster.sql(f"CREATE DATABASE {TEMPLATE}")

    async def apply() -> None:
        async with await psycopg.AsyncConnection.connect(pg_cluster.url(TEMPLATE), autocommit=True) as conn:
            await migrate(conn)

    anyio.run(apply)
    return TEMPLATE


@pytest.fixture
def pg_migrated_url(pg_cluster: Cluster, pg_template: str) -> Iterator[str]:
    """A fresh database of the session's cluster with the current schema (no rows)."""
    yield from fresh_database(pg_cluster, pg_template)


# The three stores of bytes; a module of tests on stored bytes opts in to the third by setting
# BLOBS_IN_A_BUCKET = True (conftest's pytest_generate_tests): the others (run records, login
# codes) hold no bytes, and a bucket would only add a SeaweedFS round to their time.
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
STORES_OF_BYTES = [*STORES, pytest.param("bucket", marks=pytest.mark.postgres)]


@pytest.fixture  # parametrized by conftest's pytest_generate_tests: STORES, or STORES_OF_BYTES
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Settings]:
    """Settings for each store: the embedded SQLite one, PostgreSQL (a fresh database with the
    current schema) with the bytes in its rows, and, in modules that set BLOBS_IN_A_BUCKET, the
    same with the bytes in a bucket (a fresh prefix on the session's SeaweedFS:
    `fixtures_bucket`). Call it with overrides; `data_dir` may be given to act as a second replica."""
    url = request.getfixturevalue("pg_migrated_url") if request.param != "sqlite" else None
    blob_url = request.getfixturevalue("bucket_url") if request.param == "bucket" else None

    def make(**overrides: object) -> Settings:
        if url is not None:
            overrides.setdefault("database_url", url)
        if blob_url is not None:
            overrides.setdefault("blob_url", blob_url)
        return make_settings(tmp_path, **overrides)

    return make


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """RLM_MCP_DATABASE_URL for each store: None (SQLite and files) and a fresh PostgreSQL
    database with the current schema."""
    return str(request.getfixturevalue("pg_migrated_url")) if request.param == "postgres" else None


async def has_bytes(stores: Stores, sha256: str) -> bool:
    """Whether the store still holds a blob (SQLite: its file; PostgreSQL: its row; with a
    bucket: its row, and then an object in the bucket; none once the row went)."""
    if stores.kind == "sqlite":
        from rlm_mcp.store.sqlite_index import ContextStore

        assert isinstance(stores.contexts, ContextStore)
        return stores.contexts.blob_path(sha256).exists()
    from rlm_mcp.store.pg import Database
    from rlm_mcp.store.pg.bucket_blobs import BucketBlobs

    assert isinstance(stores.lifecycle, Database)
    async with stores.lifecycle.connection() as conn:
        cur = await conn.execute("SELECT 1 FROM rlm_blobs WHERE sha256 = %s", (sha256,))
        row = await cur.fetchone() is not None
    bucket = getattr(getattr(stores.contexts, "rows", None), "blobs", None)
    if isinstance(bucket, BucketBlobs):
        objects = [k for k in await bucket.bucket.keys("c") if sha256 in k]
        assert bool(objects) == row, f"row {'present' if row else 'gone'} but objects {objects}"
    return row
