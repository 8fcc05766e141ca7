"""A team front's remembered contexts (`service.run_contexts.KnownContexts`): each owner's own
reads only, by owner and id; an unknown id is read again every time (never remembered), and the
least recently used entry goes first past the cap. The enqueue's check that a remembered context
is still its owner's is in tests/postgres/test_team_start.py."""

from __future__ import annotations

from typing import Any, cast

import pytest

from rlm_mcp.errors import UnknownIdError
from rlm_mcp.owners import Owner, OwnerScope
from rlm_mcp.service.run_contexts import KnownContexts
from rlm_mcp.store import ContextInfo
from rlm_mcp.store.contexts import unknown_context
from rlm_mcp.store.ports import ContextStorePort

pytestmark = pytest.mark.anyio

ALICE, BOB = Owner("alice"), Owner("bob")


def info(context_id: str) -> ContextInfo:
    return ContextInfo(
        context_id=context_id, name="n", bytes=10, sha256="s" * 64, format="text", kind="str", chars=10,
        created_at=0.0, last_used_at=0.0, source={},
    )  # fmt: skip


class Store:
    """The store's `get`: `held` maps (owner, id) to its context; each read is counted."""

    def __init__(self, held: set[tuple[str, str]]) -> None:
        self.held = held
        self.reads: list[tuple[str, str]] = []

    async def get(self, context_id: str, *, owner: OwnerScope) -> ContextInfo:
        self.reads.append((str(owner), context_id))
        if (str(owner), context_id) not in self.held:
            raise unknown_context(context_id)
        return info(context_id)


def known(store: Store, **kwargs: Any) -> KnownContexts:
    return KnownContexts(cast(ContextStorePort, store), **kwargs)


async def test_an_owners_context_is_read_once_and_another_owner_reads_its_own() -> None:
    store = Store({("alice", "ctx_a"), ("alice", "ctx_b")})
    contexts = known(store)
    assert [i.context_id for i in await contexts.get(["ctx_a", "ctx_b"], owner=ALICE)] == ["ctx_a", "ctx_b"]
    assert [i.context_id for i in await contexts.get(["ctx_b", "ctx_a"], owner=ALICE)] == ["ctx_b", "ctx_a"]
    assert store.reads == [("alice", "ctx_a"), ("alice", "ctx_b")]  # the second start read nothing
    with pytest.raises(UnknownIdError):  # alice's context, as bob: his own read, refused
        await contexts.get(["ctx_a"], owner=BOB)
    with pytest.raises(UnknownIdError):  # and again: nothing was remembered for him
        await contexts.get(["ctx_a"], owner=BOB)
    assert store.reads[2:] == [("bob", "ctx_a"), ("bob", "ctx_a")]


async def test_the_least_recently_used_entry_goes_first_past_the_cap() -> None:
    store = Store({("alice", f"ctx_{n}") for n in range(3)})
    contexts = known(store, kept=2)
    await contexts.get(["ctx_0", "ctx_1"], owner=ALICE)
    await contexts.get(["ctx_0"], owner=ALICE)  # used again: ctx_1 is now the oldest
    await contexts.get(["ctx_2"], owner=ALICE)  # over the cap: ctx_1 goes
    store.reads.clear()
    await contexts.get(["ctx_0", "ctx_2", "ctx_1"], owner=ALICE)
    assert store.reads == [("alice", "ctx_1")]
