"""What a stored context is, in every store (SQLite and files; PostgreSQL): `ContextInfo`, its
id, a stored row as its owner sees it, and how long a pin of another host lives.

Ids: `ctx_` + the first 24 hex digits of the sha256 of the bytes. The same bytes stored as
JSON get the suffix `_json` (`ctx_<24 hex>_json`), because a JSON context is a different value
in the sandbox (a list or dict, not a str); both ids share one blob. 24 hex digits = 96 bits:
collisions are out of reach, and the id stays short enough to read and type.

Character counts (`chars`): the number of Unicode code points of the UTF-8 text; for JSON, of
the document's text as stored (not of any value inside it).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rlm_mcp.ports import ContextFormat, ContextKind

__all__ = ["PIN_TTL_S", "ContextInfo", "HeldPins", "context_id_for", "context_info", "well_formed_id"]

# Pins of another host (or, in team mode, of a replica still beating) cannot be checked by pid;
# they lapse after this long. On this host a pin also ends when its process is gone.
PIN_TTL_S = 24 * 3600


@dataclass(eq=False)
class HeldPins:
    """One holder's pins (`Contexts.in_use(..., held=)`), for a write that removes them in its
    own statement: a team worker's final write of a run (`store.pg.run_log.PgRunLog.finish`),
    which ends the run and lets its pins go at once; or taken by another: its claim. `taken`: the pins exist (set by `in_use`);
    `released`: that write removed them (set by its caller once it succeeded), so `in_use`'s
    exit sends no statement of its own. Otherwise (no such write, or it failed) the exit
    removes them as always."""

    pin_id: str = field(default_factory=lambda: secrets.token_hex(8))
    taken: bool = False
    released: bool = False
    # Pinned before `in_use` (a team worker's claim pins its runs' contexts, `taken` then): the
    # contexts as that pin read them, which `in_use` takes instead of pinning again.
    infos: list[ContextInfo] | None = None
    # Handed to the run that holds them (`RunManager.adopt`): its end releases them from then on.
    handed_over: bool = False

    @property
    def to_release(self) -> str | None:
        """The pin id for the write to remove, while the pins are held; None otherwise."""
        return self.pin_id if self.taken and not self.released else None


class ContextInfo(BaseModel):
    context_id: str
    name: str
    bytes: int
    sha256: str
    format: ContextFormat
    kind: ContextKind
    chars: int
    created_at: float
    last_used_at: float
    source: dict[str, Any]


def context_id_for(sha256: str, format: ContextFormat) -> str:
    return f"ctx_{sha256[:24]}" + ("_json" if format == "json" else "")


def well_formed_id(context_id: str) -> bool:
    """Whether an id could name a context at all: ids are printable ASCII, and a lone surrogate or a
    NUL cannot even be sent to a database driver. Anything else is simply an unknown id, in every store."""
    return context_id.isascii() and context_id.isprintable()


def context_info(row: Any) -> ContextInfo:
    """A stored row (SQLite's or PostgreSQL's, both indexed by column name) as the owner sees it."""
    return ContextInfo(
        context_id=row["context_id"],
        name=row["name"],
        bytes=row["bytes"],
        sha256=row["sha256"],
        format=row["format"],
        kind=row["kind"],
        chars=row["chars"],
        created_at=row["created_at"],
        last_used_at=row["last_used_at"],
        source=json.loads(row["source"]),
    )
