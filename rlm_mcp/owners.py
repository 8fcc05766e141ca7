"""Who owns contexts and runs (docs/security.md).

Every stored context and every run belongs to an owner, a short opaque string typed `Owner`:
- stdio (and the CLI's `run`) serve one user, `LOCAL_OWNER`;
- over HTTP without tokens (loopback only) every client is that same one user;
- over HTTP with tokens each token is its own owner (`access.owner_of_token`): what one
  token stored or started, another token cannot see, use, cancel or delete ("not found").

Every store entry point that reads or writes owned data takes the owner as a required keyword
argument (no default): a forgotten owner is a type error, never a silent read as the local user
or as everyone. The service's tool-level operations take it once, when the `Caller` that holds
them is made (`service.caller.Caller(service, owner)`). Writes take an `Owner`; reads take an `OwnerScope`,
which is an `Owner` or `EVERY_OWNER` (the operator's CLI and local viewer only), spelled out
at each call that means it.

The owner is read from the MCP request in one place (`server.app`) and passed down; the store
keeps ownership in a table of its own, so identical bytes stored by two owners share one blob
without either learning that the other has it.
"""

from __future__ import annotations

import enum
from typing import Final, NewType, TypeAlias

Owner = NewType("Owner", str)
"""One owner. A str at run time; mypy refuses a plain str where an Owner is expected."""

LOCAL_OWNER: Final = Owner("local")


class Everyone(enum.Enum):
    """The operator's view: every owner's contexts and runs (CLI, local viewer)."""

    EVERY_OWNER = "every owner"


EVERY_OWNER: Final = Everyone.EVERY_OWNER

OwnerScope: TypeAlias = Owner | Everyone
"""Whose data a read may see: one owner, or `EVERY_OWNER`."""


def sees(scope: OwnerScope, owner: str) -> bool:
    """Whether `scope` may see data that `owner` owns."""
    return scope is EVERY_OWNER or scope == owner
