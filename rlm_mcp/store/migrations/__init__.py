"""Schema migrations: numbered files per dialect, applied in order, each in its own transaction.

Each dialect has a folder here, `sqlite/` and `postgres/`, holding files named `NNNN_what.sql`
(version `NNNN`, from 0001 up without a gap). A migration is plain SQL; one that must look at
the database first (which columns a table has) may be `NNNN_what.py` with one function,
`migrate(conn)`: called with the `sqlite3.Connection` in SQLite, awaited with the psycopg
`AsyncConnection` in PostgreSQL, inside the transaction that records its version. Adding a
migration is adding one file; a file once released is never edited (databases already hold it).

This module is the dialect-neutral part: it finds the files (package data, read through
`importlib.resources`, so an installed wheel has them), checks their numbering, and says which
are pending for a database at a given version, refusing a database newer than this release
knows. Each store applies the plan its own way, serialized between processes: SQLite under
`BEGIN IMMEDIATE` with the version in `PRAGMA user_version` (`store/_db.py`), PostgreSQL under
an advisory lock with the version in `rlm_schema` (`store/pg/migrations.py`).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Literal

from rlm_mcp.errors import RlmMcpError

Dialect = Literal["sqlite", "postgres"]

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.(sql|py)$")


class SchemaError(RlmMcpError):
    """The database's schema is newer than this version of rlm-mcp knows."""


class MigrationError(RlmMcpError):
    """A migration step the database refused: its schema is not what the step expects."""


def step_refused(dialect: Dialect, step: Migration, current: int, where: str, detail: str) -> MigrationError:
    """The one phrasing of a step the database refused (a table it creates already exists, a
    column it reads is missing): not an outage, and not fixed by starting again. The step was
    rolled back whole (each runs in one transaction with its version), so the schema is still
    `current`; what the step met was left by a migration cut off half way in an earlier release,
    or made by hand."""
    return MigrationError(
        f"The {where} could not be migrated from schema version {current} to {latest(dialect)}: step "
        f"{step.version} ({step.name}) was refused ({detail}), so nothing of it was applied. The schema "
        "holds something that step does not expect: a migration cut off half way, or a change made by hand.",
        f"Make the database match schema version {current} (drop or rename what {step.name} of rlm-mcp's "
        f"store/migrations/{dialect}/ creates; or restore a backup taken before), then start again; "
        "`rlm-mcp doctor` shows the schema version.",
    )


@dataclass(frozen=True)
class Migration:
    version: int
    name: str  # the file's name, for messages
    sql: str | None = None  # a .sql file's statements
    function: Callable[[Any], Any] | None = None  # a .py file's `migrate(conn)`


@functools.cache
def migrations(dialect: Dialect) -> tuple[Migration, ...]:
    """The dialect's migrations in order."""
    package = f"{__name__}.{dialect}"
    return read_folder(resources.files(package), package)


def read_folder(folder: Traversable, package: str) -> tuple[Migration, ...]:
    """The migrations of one folder (`package`, to import its .py steps from). A misnamed file
    or a gap in the numbers is a bug of this package, raised as such, so no release ships one."""
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match is None:
            if entry.name.endswith((".sql", ".py")) and entry.name != "__init__.py":
                raise ValueError(f"migration file {package}.{entry.name} is not named NNNN_what.sql or .py")
            continue
        if match[3] == "sql":
            found.append(Migration(int(match[1]), entry.name, sql=entry.read_text(encoding="utf-8")))
        else:
            module = importlib.import_module(f"{package}.{entry.name[:-3]}")
            found.append(Migration(int(match[1]), entry.name, function=module.migrate))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise ValueError(f"{package}: migrations are not numbered 1..N without a gap: {[m.name for m in found]}")
    return tuple(found)


def latest(dialect: Dialect) -> int:
    return len(migrations(dialect))


def pending(dialect: Dialect, current: int, *, where: str, fix: str, target: int | None = None) -> list[Migration]:
    """The migrations a database at version `current` still needs (up to `target`, default the
    latest). A database newer than the latest was written by a newer rlm-mcp: it is refused
    (`where` names it, `fix` says what to do) rather than written in a shape that code does not expect."""
    newest = latest(dialect)
    if current > newest:
        raise SchemaError(f"The {where} is version {current}, newer than this rlm-mcp knows (version {newest}).", fix)
    stop = newest if target is None else target
    return [m for m in migrations(dialect) if current < m.version <= stop]


__all__ = [
    "Dialect",
    "Migration",
    "MigrationError",
    "SchemaError",
    "latest",
    "migrations",
    "pending",
    "read_folder",
    "step_refused",
]
