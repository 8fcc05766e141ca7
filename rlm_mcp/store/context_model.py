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

import enum
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rlm_mcp.ports import ContextFormat, ContextKind

__all__ = ["PIN_TTL_S", "ContextInfo", "HeldPins", "PinState", "context_id_for", "context_info", "well_formed_id"]

# Pins of another host (or, in team mode, of a replica still beating) cannot be checked by pid;
# they lapse after this long. On this host a pin also ends when its process is gone.
PIN_TTL_S = 24 * 3600


class PinState(enum.Enum):
    """Where one holder's pins are in their life (`HeldPins`)."""

    NONE = "none"  # none held: `in_use` takes them (and its exit comes back here)
    CLAIMED = "claimed"  # taken by a run's claim, `infos` as it read them; the claim's holder lets them go
    HANDED = "handed"  # claimed, then handed to the run (`RunManager.adopt`): its end lets them go
    HELD = "held"  # taken for `in_use`'s block (by it, or by the claim), in use
    REMOVED = "removed"  # removed by a write of their own (a final write): nothing left to remove


_TAKEN = (PinState.CLAIMED, PinState.HANDED, PinState.HELD)


@dataclass(eq=False)
class HeldPins:
    """One holder's pins (`Contexts.in_use(..., held=)`), for a write that removes them in its
    own statement: a team worker's final write of a run (`store.pg.run_log.PgRunLog.finish`),
    which ends the run and lets its pins go at once. One state (`PinState`) says where they are:
    NONE, HELD while `in_use`'s block runs and NONE again at its exit, which removes them unless
    that write did (REMOVED: the exit sends no statement of its own). Pins a run's claim took
    start CLAIMED (`claimed`, with `infos`: the contexts as that pin read them, which `in_use`
    takes instead of pinning again) and are HANDED to the run that executes it (`hand_over`)."""

    pin_id: str = field(default_factory=lambda: secrets.token_hex(8))
    # Pinned before `in_use` (a team worker's claim pins its runs' contexts): the contexts as that
    # pin read them; set exactly for claimed pins (`claimed`).
    infos: list[ContextInfo] | None = field(init=False, default=None)
    state: PinState = field(init=False, default=PinState.NONE)

    @classmethod
    def claimed(cls, pin_id: str, infos: list[ContextInfo]) -> HeldPins:
        """Pins a run's claim took (CLAIMED), with the contexts as that pin read them."""
        pins = cls(pin_id=pin_id)
        pins.infos = infos
        pins.state = PinState.CLAIMED
        return pins

    @property
    def to_release(self) -> str | None:
        """The pin id for the write to remove, while the pins are held; None otherwise."""
        return self.pin_id if self.state in _TAKEN else None

    @property
    def released(self) -> bool:
        """Whether a write of their own removed them (`mark_removed`)."""
        return self.state is PinState.REMOVED

    def mark_removed(self) -> None:
        """A write of their own removed them (`RunPins`): REMOVED, nothing left to remove."""
        self.state = PinState.REMOVED

    @property
    def handed_over(self) -> bool:
        """Whether the claim's holder is done with them: False only while they are claimed and not
        yet handed to a run (the holder lets them go if the run never starts)."""
        return self.state is not PinState.CLAIMED

    def hand_over(self) -> None:
        """Claimed pins handed to the run that holds them (`RunManager.adopt`): its end releases
        them from then on, whatever happens."""
        if self.state is not PinState.CLAIMED:
            raise ValueError(f"only claimed pins are handed to a run, not {self.state.value} ones")
        self.state = PinState.HANDED

    def claimed_infos(self) -> list[ContextInfo] | None:
        """The contexts as the claim's pin read them, while that pin is not yet in use (`in_use`
        takes them, HELD from then on); None: `in_use` pins them itself."""
        if self.state in (PinState.CLAIMED, PinState.HANDED):
            return self.infos
        return None


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
