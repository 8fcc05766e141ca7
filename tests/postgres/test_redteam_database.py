"""The team database's edges (reliability and security round four), against real PostgreSQL:

- a `RLM_MCP_DATABASE_URL` whose password holds a space or a stray `%` is refused by the
  settings, never with libpq's parse error (which quotes the password): `serve` and `doctor`;
- a database not encoded in UTF8 (SQL_ASCII) is refused at open and by `doctor`, with the fix;
- a role that may not create tables gets one line with the fix from `serve` (no traceback) and a
  failing `doctor` row while migrations are pending, and may serve a schema already current;
- a database whose disk is full (its data directory on a small tmpfs) makes loads fail with an
  error naming the database's disk and the fix, and `/healthz` answer 503 "disk full".
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.owners import Owner
from rlm_mcp.server.health import health_endpoint, store_readiness
from rlm_mcp.store.pg import Database
from rlm_mcp.store.pg.faults import DatabaseResourceError, DatabaseSetupError
from rlm_mcp.testing.servers import free_port
from tests.fixtures_e2e import cli_env
from tests.fixtures_postgres import PASSWORD, Cluster, fresh_database
from tests.fixtures_store import make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def _cli(tmp_path: Path, *argv: str, **env: str) -> tuple[int, str]:
    done = await anyio.run_process(
        [sys.executable, "-m", "rlm_mcp", *argv],
        env=cli_env(tmp_path, RLM_MCP_BASE_URL="http://127.0.0.1:9/v1", **env),
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


# --- the URL -----------------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["pa ss-7f3a9", "pa%ss-7f3a9", "pass-7f3a9%"])
async def test_a_password_holding_a_space_or_a_stray_percent_never_shows(
    tmp_path: Path, pg_cluster: Cluster, secret: str
) -> None:
    url = pg_cluster.url(password=secret)
    for argv in (("serve", "--role", "front", "--transport", "http", "--port", str(free_port())), ("doctor",)):
        code, out = await _cli(tmp_path, *argv, RLM_MCP_DATABASE_URL=url)
        assert code == 2, out
        assert "RLM_MCP_DATABASE_URL" in out and "percent-encode" in out, out
        for part in (secret, secret.replace(" ", "%20"), "7f3a9", "ss-"):
            assert part not in out, (argv, out)
        assert "Traceback" not in out


async def test_positive_control_the_encoded_password_connects(tmp_path: Path, pg_cluster: Cluster) -> None:
    """The same kind of password percent-encoded is accepted and reaches the database; a wrong
    one is refused by PostgreSQL, and that message does not quote it either."""
    right = pg_cluster.url(password=PASSWORD)
    assert make_settings(tmp_path, database_url=right).team.database_url is not None
    wrong = pg_cluster.url(password="wr%20ong%25-7f3a9")
    db = Database(wrong, replica=False)
    with pytest.raises(RlmMcpError) as caught:
        await db.open()
    text = str(caught.value)
    assert "password authentication failed" in text and "7f3a9" not in text and "wr ong" not in text


# --- the database's encoding and the role's privileges -----------------------------------


@pytest.fixture
def sql_ascii_url(pg_cluster: Cluster) -> Iterator[str]:
    name = "t_ascii_" + secrets.token_hex(4)
    pg_cluster.sql(f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    try:
        yield pg_cluster.url(name)
    finally:
        pg_cluster.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_a_sql_ascii_database_is_refused_with_the_fix(tmp_path: Path, sql_ascii_url: str) -> None:
    db = Database(sql_ascii_url, replica=False)
    with pytest.raises(DatabaseSetupError) as caught:
        await db.open()
    assert "encoded in SQL_ASCII; rlm-mcp needs UTF8" in caught.value.cause
    assert "ENCODING 'UTF8' TEMPLATE template0" in (caught.value.fix or "")
    code, out = await _cli(tmp_path, "doctor", RLM_MCP_DATABASE_URL=sql_ascii_url)
    assert code == 1
    assert any(line.startswith("FAIL  database encoding") for line in out.splitlines()), out
    assert PASSWORD not in out


async def test_positive_control_a_utf8_database_passes_doctors_rows(tmp_path: Path, pg_url: str) -> None:
    code, out = await _cli(tmp_path, "doctor", RLM_MCP_DATABASE_URL=pg_url)
    rows = out.splitlines()
    assert any(line.startswith("ok    database encoding") and "UTF8" in line for line in rows), out
    assert any(line.startswith("ok    database privileges") for line in rows), out


@pytest.fixture
def weak_role(pg_cluster: Cluster) -> Iterator[tuple[str, str]]:
    """A login role that may connect but not create tables (PostgreSQL 15's default for a role
    that does not own the database), and a fresh database: (its URL as that role, as the owner)."""
    role, password = "weak_" + secrets.token_hex(4), "weak-" + secrets.token_hex(6)
    pg_cluster.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        for url in fresh_database(pg_cluster):
            yield url.replace(f"rlm:{PASSWORD}@", f"{role}:{password}@"), url
    finally:
        pg_cluster.sql(f"DROP ROLE IF EXISTS {role}")


async def test_a_role_that_may_not_create_tables_gets_one_line_with_the_fix(
    tmp_path: Path, weak_role: tuple[str, str]
) -> None:
    weak_url, owner_url = weak_role
    role = weak_url.split("://")[1].split(":")[0]
    port = free_port()
    code, out = await _cli(
        tmp_path, "serve", "--role", "front", "--transport", "http", "--port", str(port), RLM_MCP_DATABASE_URL=weak_url
    )
    assert code == 1, out
    assert "Traceback" not in out, out
    assert f"The role {role} may not create tables in schema public" in out
    assert f"GRANT CREATE ON SCHEMA public TO {role};" in out
    code, out = await _cli(tmp_path, "doctor", RLM_MCP_DATABASE_URL=weak_url)
    assert code == 1
    assert any(line.startswith("FAIL  database privileges") for line in out.splitlines()), out
    # Once the owner migrated the schema, the role is told it needs grants on the tables...
    await Database(owner_url, replica=False).prepare()
    with pytest.raises(DatabaseSetupError, match="may not read or write rlm-mcp's tables") as caught:
        await Database(weak_url, replica=False).prepare()
    assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};" in (caught.value.fix or "")
    # ... and with them (positive control) it may serve the current schema without CREATE.
    import psycopg

    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        await conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}".encode())
        await conn.execute(f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}".encode())
    await Database(weak_url, replica=False).prepare()
    code, out = await _cli(tmp_path, "doctor", RLM_MCP_DATABASE_URL=weak_url)
    assert any(line.startswith("ok    database privileges") and "may not create" in line for line in out.splitlines())


# --- a full disk -------------------------------------------------------------------------


@pytest.fixture
def small_disk_cluster() -> Iterator[Cluster]:
    """A cluster whose data directory sits on a 48 MiB tmpfs (its WAL elsewhere, so the data
    files fill first, as when a store's bytes outgrow the volume)."""
    if os.geteuid() != 0:
        pytest.fail("mounting the small tmpfs needs root (the CI runs the suite as root)")
    mount = Path(tempfile.mkdtemp(prefix="rlm-pg-disk-"))
    wal = Path(tempfile.mkdtemp(prefix="rlm-pg-wal-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        for path in (mount, wal):
            shutil.chown(path, "nobody", "nogroup")
        cluster = Cluster(data=mount / "data", initdb_args=["-X", str(wal)])
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.close()
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)
        shutil.rmtree(wal, ignore_errors=True)


async def test_a_full_database_disk_is_named_with_the_fix_and_healthz_says_so(
    tmp_path: Path, small_disk_cluster: Cluster
) -> None:
    url = small_disk_cluster.url()
    settings = make_settings(tmp_path, database_url=url, store_max_bytes=1 << 40)
    health = health_endpoint(store_readiness(stores := make_stores(settings, replica=True)), role="front", cache_s=0)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=health), base_url="http://replica")
    async with stores, client:
        ok = await client.get("/healthz")
        assert ok.status_code == 200 and ok.json()["database"] == "reachable"  # positive control
        failure: DatabaseResourceError | None = None
        for i in range(64):  # 4 MiB each: at most 256 MiB, far past the 48 MiB disk
            try:
                await stores.contexts.put_bytes(
                    secrets.token_hex(2 << 20).encode(), name=f"c{i}", format="text", source={}, owner=Owner("token-a")
                )
            except DatabaseResourceError as exc:
                failure = exc
                break
        assert failure is not None, "the disk never filled"
        assert "is out of disk space (SQLSTATE 53100" in failure.cause
        assert "unreachable" not in failure.cause
        assert "RLM_MCP_STORE_MAX_BYTES" in (failure.fix or "") and "WAL" in (failure.fix or "")
        assert PASSWORD not in str(failure)
        full = await client.get("/healthz")
        assert full.status_code == 503
        assert full.json() == {
            "status": "unavailable",
            "version": full.json()["version"],
            "role": "front",
            "database": "disk full",
        }
