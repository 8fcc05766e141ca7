"""What PostgreSQL's refusals mean for rlm-mcp, phrased once: the cause in the database's own
terms (no password, no URL) and the fix.

- Unreachable (the connection failed): `DatabaseUnavailableError`.
- Out of a resource, SQLSTATE class 53 (53100 disk full, 53200 out of memory, others such as
  too many connections): `DatabaseResourceError`, which names the database server's disk or
  memory and what its volume must hold. The context store's bytes live in the database, so a
  full disk there is what a too-large `RLM_MCP_STORE_MAX_BYTES` looks like; the health route
  reports it (`Database.fault`) instead of answering 200 while every write fails.
- Set up so rlm-mcp cannot work: a database not encoded in UTF8 (SQL_ASCII takes any byte and
  every later call would fail on text), or a role that may not create tables while the schema
  still has to be created or migrated (PostgreSQL 15 grants CREATE on schema public only to the
  database owner): `DatabaseSetupError`, one line with the SQL that fixes it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from rlm_mcp.database_url import redact
from rlm_mcp.errors import RlmMcpError, StoreUnreachableError
from rlm_mcp.store.pg.connect import Connection

__all__ = [
    "DatabaseResourceError",
    "DatabaseSetupError",
    "DatabaseUnavailableError",
    "encoding_problem",
    "grants_error",
    "may_create_tables",
    "privilege_error",
    "resource_error",
    "setup_rows",
]

# What the database's volume must hold, said wherever its disk is the cause.
VOLUME = (
    "the database's volume must hold every stored context, a copy per owner holding it (each owner's share, "
    "RLM_MCP_STORE_MAX_BYTES_PER_OWNER, bounds its own), the unfinished uploads, the run logs and headroom for WAL"
)


class DatabaseUnavailableError(StoreUnreachableError):
    """PostgreSQL cannot be reached or refused the connection."""


class DatabaseResourceError(DatabaseUnavailableError):
    """PostgreSQL refused a statement for lack of disk, memory or another resource (class 53)."""

    def __init__(self, cause: str, fix: str, condition: str) -> None:
        super().__init__(cause, fix)
        self.condition = condition  # "disk full", "out of memory", "out of resources": the health route says it


class DatabaseSetupError(RlmMcpError):
    """The database is set up so that rlm-mcp cannot work in it (encoding, privileges)."""


def resource_error(exc: BaseException, where: str, url: str) -> DatabaseResourceError | None:
    """The error a class-53 refusal is, or None for any other failure."""
    state = getattr(exc, "sqlstate", None) or ""
    if not state.startswith("53"):
        return None
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    detail = redact(first, url)
    if state == "53100":
        return DatabaseResourceError(
            f"The database {where} is out of disk space (SQLSTATE 53100: {detail}).",
            f"Free or grow the disk of PostgreSQL's data directory: {VOLUME}. Or lower RLM_MCP_STORE_MAX_BYTES "
            "and delete contexts nobody needs (`rlm-mcp contexts delete`).",
            "disk full",
        )
    if state == "53200":
        return DatabaseResourceError(
            f"The database {where} is out of memory (SQLSTATE 53200: {detail}).",
            "Give the PostgreSQL server more memory, or lower its work_mem or max_connections.",
            "out of memory",
        )
    return DatabaseResourceError(
        f"The database {where} is out of a resource (SQLSTATE {state}: {detail}).",
        "Raise that limit on the PostgreSQL server (max_connections, for SQLSTATE 53300) or run fewer replicas.",
        "out of resources",
    )


async def encoding_problem(conn: psycopg.AsyncConnection[Any], where: str) -> DatabaseSetupError | None:
    """A database not encoded in UTF8, as an error with the fix (None when it is UTF8)."""
    cur = await conn.execute("SELECT current_setting('server_encoding'), current_database()")
    row = await cur.fetchone()
    encoding, dbname = _pair(row)
    if encoding.upper() in ("UTF8", "UTF-8"):
        return None
    return DatabaseSetupError(
        f"The database {where} is encoded in {encoding}; rlm-mcp needs UTF8 (run logs and names are Unicode text).",
        f"Create a UTF8 database and point RLM_MCP_DATABASE_URL at it: CREATE DATABASE {dbname}_utf8 "
        "ENCODING 'UTF8' TEMPLATE template0;",
    )


async def may_create_tables(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, str, str]:
    """Whether the connected role may create tables in its schema: (allowed, role, schema)."""
    cur = await conn.execute(
        "SELECT current_user, COALESCE(current_schema(), 'public'), "
        "COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false)"
    )
    row = await cur.fetchone()
    role, schema = _pair(row)
    values = list(row.values()) if isinstance(row, dict) else list(row or ())
    return bool(values[2]), role, schema


def privilege_error(where: str, role: str, schema: str) -> DatabaseSetupError:
    return DatabaseSetupError(
        f"The role {role} may not create tables in schema {schema} of the database {where}, so rlm-mcp cannot "
        "create or migrate its tables there.",
        f"As the database's owner or a superuser run: GRANT CREATE ON SCHEMA {schema} TO {role}; (PostgreSQL 15 "
        "grants it to the database owner only), or start one replica once as a role that may; then start again.",
    )


def grants_error(where: str, role: str, schema: str) -> DatabaseSetupError:
    return DatabaseSetupError(
        f"The role {role} may not read or write rlm-mcp's tables in schema {schema} of the database {where}.",
        f"As the tables' owner run: GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}; "
        f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};",
    )


def _pair(row: Any) -> tuple[str, str]:
    """Two text values; a SQL_ASCII database sends text as bytes."""
    values = list(row.values()) if isinstance(row, dict) else list(row or ())
    return tuple(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in values[:2])  # type: ignore[return-value]


async def setup_rows(url: str, where: str, *, pending: bool) -> list[tuple[str, bool, str, str]]:
    """`doctor`'s rows (name, ok, detail, fix) for the database's encoding and, while migrations
    are pending (`pending`), whether the role may create the tables. Changes nothing."""
    async with await Connection.connect(url, autocommit=True, connect_timeout=10) as conn:
        rows: list[tuple[str, bool, str, str]] = []
        problem = await encoding_problem(conn, where)
        if problem is None:
            rows.append(("database encoding", True, "UTF8", ""))
        else:
            rows.append(("database encoding", False, problem.cause, problem.fix or ""))
        allowed, role, schema = await may_create_tables(conn)
        if allowed:
            rows.append(("database privileges", True, f"{role} may create tables in schema {schema}", ""))
        elif pending:
            err = privilege_error(where, role, schema)
            rows.append(("database privileges", False, err.cause, err.fix or ""))
        else:
            detail = f"{role} may not create tables in schema {schema}: enough while the schema is current"
            fix = "Upgrades that add tables need a role that may: run the first start of a new version as one."
            rows.append(("database privileges", True, detail, fix))
        return rows
