"""Stored contexts, content-addressed: the rules every store follows, written once over an index
(`store.index`): SQLite and files in the data dir (`store.sqlite_index.ContextStore`, the
embedded default) or PostgreSQL (`store.pg.contexts.PgContextStore`, team mode).

Ids, character counts and `ContextInfo`: `context_model`.

Owners (see `rlm_mcp.owners`): the table `context_owners` says who stored which context, with
each owner's own name, source and times. Reads, lists, deletes and pins take the caller's owner
and see only that owner's rows, so the same bytes stored by two owners (one context row)
reveal nothing across them. `owner=EVERY_OWNER` means every owner: the operator's CLI only.
A delete removes the caller's ownership; the context row and its bytes go when no owner and no
pin is left (a row orphaned while pinned goes at the next eviction).

Protection from eviction, in every process sharing the index: contexts pinned by a live run
(the index judges which pins live), and contexts stored or used within `context_grace_s`
(their `last_used_at`), which covers the gap between storing a context and the run that names
it. Every time written or compared is the transaction's `now` (`store.index`: the database's
clock in team mode, so replicas with skewed clocks agree on ages). Which contexts an eviction removes: `eviction.plan_eviction`; what an owner's share
releases: `owner_caps.releases_in_share`.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.config import StoreSettings
from rlm_mcp.errors import BadArgumentError, UnknownIdError, context_too_large
from rlm_mcp.owners import EVERY_OWNER, Owner, OwnerScope
from rlm_mcp.ports import ContextFormat, ContextSpec
from rlm_mcp.store._ingest import CHUNK, Ingested, ingest, read_file_chunks
from rlm_mcp.store.context_model import (
    ContextInfo,
    HeldPins,
    PinState,
    context_id_for,
    context_info,
    well_formed_id,
)
from rlm_mcp.store.eviction import clean_stale_tmp, plan_eviction
from rlm_mcp.store.index import ContextIndex, ContextTx, Row
from rlm_mcp.store.owner_caps import releases_in_share, store_share

__all__ = ["Contexts", "unknown_context"]

log = logging.getLogger("rlm_mcp.store")


def unknown_context(context_id: str) -> UnknownIdError:
    return UnknownIdError("context", context_id)


class Contexts:
    """Stored contexts over `index`. Safe to use from every process sharing the index."""

    def __init__(self, settings: StoreSettings, index: ContextIndex) -> None:
        self.settings = settings
        self.index = index
        self.tmp_dir = index.tmp_dir
        self._sql = index.sql

    # --- writing -------------------------------------------------------------------------

    async def put_bytes(
        self, data: bytes, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo:
        if len(data) > self.settings.max_context_bytes:
            raise context_too_large(self.settings.max_context_bytes)
        chunks = (data[i : i + CHUNK] for i in range(0, len(data), CHUNK))
        return await self.put_chunks(chunks, name=name, format=format, source=source, owner=owner)

    async def put_file(
        self,
        path: Path,
        *,
        name: str,
        format: ContextFormat,
        source: dict[str, Any],
        consume: bool = False,
        expected_sha256: str | None = None,
        owner: Owner,
    ) -> ContextInfo:
        """Store a file's bytes, streaming. With consume=True the file (a temp file the caller
        owns, e.g. a loader's output) is moved into the store instead of copied when it lives
        on the same filesystem; the caller's later delete must tolerate it being gone."""
        path = Path(path)

        def scan() -> Ingested:
            self.index.prepare()
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise BadArgumentError(f"File '{path}' does not exist.", "Check the path and load it again.") from None
            if size > self.settings.max_context_bytes:
                raise context_too_large(self.settings.max_context_bytes)
            same_fs = consume and path.stat().st_dev == self.tmp_dir.stat().st_dev
            return ingest(
                read_file_chunks(path),
                tmp_dir=self.tmp_dir,
                format=format,
                max_bytes=self.settings.max_context_bytes,
                expected_sha256=expected_sha256,
                write=not same_fs,
                existing=path if same_fs else None,
            )

        ing = await anyio.to_thread.run_sync(scan)
        return await self._store(ing, name=name, format=format, source=source, owner=owner)

    async def put_chunks(
        self,
        chunks: Iterable[bytes],
        *,
        name: str,
        format: ContextFormat,
        source: dict[str, Any],
        expected_sha256: str | None = None,
        owner: Owner,
    ) -> ContextInfo:
        """Store bytes given as a (blocking) iterable of chunks, consumed in a worker thread."""

        def scan() -> Ingested:
            self.index.prepare()
            return ingest(
                chunks,
                tmp_dir=self.tmp_dir,
                format=format,
                max_bytes=self.settings.max_context_bytes,
                expected_sha256=expected_sha256,
            )

        ing = await anyio.to_thread.run_sync(scan)
        return await self._store(ing, name=name, format=format, source=source, owner=owner)

    async def _store(
        self, ing: Ingested, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo:
        try:
            info = await self._commit(ing, name=name, format=format, source=source, owner=owner)
            await self.index.adopt(ing)
        finally:
            await anyio.Path(ing.tmp_path).unlink(missing_ok=True)
        await self.evict(keep=[info.context_id], loader=owner)
        return info

    async def _commit(
        self, ing: Ingested, *, name: str, format: ContextFormat, source: dict[str, Any], owner: Owner
    ) -> ContextInfo:
        cid = context_id_for(ing.sha256, format)
        described = json.dumps(source)
        async with self.index.write() as tx:
            now = await tx.now()
            await self._make_room_in_share(tx, owner, ing, now)  # before the bytes: a refusal leaves nothing
            await tx.put_blob(ing, owner)
            context = (cid, ing.sha256, name, ing.bytes, format, ing.kind, ing.chars, now, now, described)
            await tx.execute(self._sql.upsert_context, context)
            await tx.execute(self._sql.upsert_owner, (cid, owner, name, described, now, now))
            row = await self._select(tx, cid, owner)
            assert row is not None  # written just above, in this transaction
        log.info("stored context %s (%d bytes, %s)", cid, ing.bytes, format)
        return context_info(row)

    async def _make_room_in_share(self, tx: ContextTx, owner: Owner, ing: Ingested, now: float) -> None:
        """Release `owner`'s least recently used contexts so the new one fits its share of the
        store (`owner_caps.release_for_share`), or refuse it. One owner's stores queue on a
        lock of that owner's, so two writers cannot both spend the same room."""
        if store_share(self.settings) is None:
            return
        await tx.lock_owner(owner)
        pins = await tx.live_pins(now)
        rows = await tx.all(self._sql.owner_contexts, (owner,))
        released = releases_in_share(
            self.settings, rows, pins, owner=owner, adding_sha256=ing.sha256, adding_bytes=ing.bytes, now=now
        )
        for r in released:  # as the owner's delete: the bytes go when nobody holds or runs on them
            await tx.execute(self._sql.delete_ownership, (r.context_id, owner))
            if not r.in_a_run and not await self._owned(tx, r.context_id):
                await self._drop(tx, r.context_id)
            await tx.release_blob(r.sha256)
        if released:
            ids = ", ".join(r.context_id for r in released)
            log.info("released %d context(s) of %s for its share: %s", len(released), owner, ids)

    # --- reading -------------------------------------------------------------------------

    def _selecting(self, context_id: str, owner: OwnerScope) -> tuple[str, tuple[str, ...]] | None:
        """The statement that reads the context as `owner` sees it; None for an id that cannot exist."""
        if not well_formed_id(context_id):
            return None
        if owner is EVERY_OWNER:
            return self._sql.context_row, (context_id,)
        return self._sql.owned_row, (context_id, owner)

    async def _select(self, tx: ContextTx, context_id: str, owner: OwnerScope) -> Row | None:
        selecting = self._selecting(context_id, owner)
        return None if selecting is None else await tx.one(*selecting)

    async def get(self, context_id: str, *, owner: OwnerScope) -> ContextInfo:
        """The context as `owner` sees it; NotFoundError when that owner has none by this id."""
        async with self.index.read() as tx:
            row = await self._select(tx, context_id, owner)
        if row is None:
            raise unknown_context(context_id)
        return context_info(row)

    async def list(self, *, owner: OwnerScope) -> builtins.list[ContextInfo]:
        async with self.index.read() as tx:
            if owner is EVERY_OWNER:
                rows = await tx.all(self._sql.list_all)
            else:
                rows = await tx.all(self._sql.list_owned, (owner,))
        return [context_info(r) for r in rows]

    def spec(self, info: ContextInfo) -> ContextSpec:
        return ContextSpec(
            path=self.index.local_path(info.sha256),
            format=info.format,
            kind=info.kind,
            chars=info.chars,
            bytes=info.bytes,
            name=info.name,
            context_id=info.context_id,
        )

    # --- deleting ------------------------------------------------------------------------

    async def delete(self, context_id: str, *, owner: OwnerScope) -> bool:
        """False when `owner` has no context by this id. A context a live run of the same owner
        is using cannot be deleted (runs of other owners keep only the bytes alive, unseen)."""
        async with self.index.write() as tx:
            row = await self._select(tx, context_id, owner)
            if row is None:
                return False
            await tx.lock_context(context_id)
            pins = await tx.live_pins(await tx.now())
            if any(cid == context_id and (owner is EVERY_OWNER or pin_owner == owner) for cid, pin_owner in pins):
                raise BadArgumentError(
                    f"Context '{context_id}' is in use by a running run.",
                    "Wait for the run to finish (or cancel it with rlm_cancel), then delete it.",
                )
            if owner is EVERY_OWNER:
                await tx.execute(self._sql.delete_ownerships, (context_id,))
            else:
                await tx.execute(self._sql.delete_ownership, (context_id, owner))
            if context_id not in {cid for cid, _ in pins} and not await self._owned(tx, context_id):
                await self._drop(tx, context_id)
            await tx.release_blob(row["sha256"])  # else the caller's hold on the bytes goes, the others' stay
        log.info("deleted context %s%s", context_id, "" if owner is EVERY_OWNER else f" of {owner}")
        return True

    async def _owned(self, tx: ContextTx, context_id: str) -> bool:
        return await tx.one(self._sql.owned, (context_id,)) is not None

    async def _drop(self, tx: ContextTx, context_id: str) -> None:
        await tx.execute(self._sql.delete_ownerships, (context_id,))
        await tx.execute(self._sql.delete_context, (context_id,))

    # --- pins and eviction ---------------------------------------------------------------

    def in_use(
        self, context_ids: Sequence[str], *, owner: Owner, held: HeldPins | None = None
    ) -> AbstractAsyncContextManager[builtins.list[ContextInfo]]:
        """Resolve `owner`'s ids (NotFoundError), mark them used, pin them for the block's
        lifetime and make sure their bytes are at `spec`'s path on this host. `held`: the pins'
        id and state, when another write may remove them first (`HeldPins`).

        Pins are rows in the shared index, so eviction in another process skips them too. A pin
        whose process died is ignored (the index judges: `store.pins`, `store.pg.contexts`)."""
        return self._in_use(builtins.list(context_ids), owner, held if held is not None else HeldPins())

    @asynccontextmanager
    async def _in_use(
        self, context_ids: builtins.list[str], owner: Owner, held: HeldPins
    ) -> AsyncIterator[builtins.list[ContextInfo]]:
        infos = held.claimed_infos()  # pinned by the run's claim
        if infos is None:
            if held.state is not PinState.NONE:
                raise RuntimeError(f"pins {held.pin_id} are {held.state.value}: a holder's pins are used once")
            infos = await self._pin(context_ids, held.pin_id, owner)
        held.state = PinState.HELD
        try:
            await self.index.make_local(infos)
            yield infos
        finally:
            # Shielded: a cancelled run must still release its pins (unless its final write did).
            if held.state is not PinState.REMOVED:
                with anyio.CancelScope(shield=True):
                    await self._unpin(held.pin_id)
                held.state = PinState.NONE

    async def release(self, held: HeldPins) -> None:
        """Remove pins taken for `in_use` that it never entered (a claimed run that did not start)."""
        if held.to_release is not None:
            with anyio.CancelScope(shield=True):
                await self._unpin(held.pin_id)
            held.state = PinState.NONE

    async def _unpin(self, pin_id: str) -> None:
        """Remove the pins `_pin` added (PostgreSQL's store: one statement of its own)."""
        async with self.index.write() as tx:
            await tx.execute(self._sql.remove_pin, (pin_id,))

    async def _pin(self, context_ids: builtins.list[str], pin_id: str, owner: Owner) -> builtins.list[ContextInfo]:
        # The embedded store does the same in one worker-thread hop (`store.sqlite_index`): keep both alike.
        infos = []
        async with self.index.write() as tx:
            now = await tx.now()
            for cid in context_ids:
                row = await self._select(tx, cid, owner)
                if row is None or not await tx.blob_intact(row):
                    raise unknown_context(cid)  # the transaction rolls back: no pin is left behind
                await tx.execute(self._sql.touch_context, (now, cid))
                await tx.execute(self._sql.touch_ownership, (now, cid, owner))
                infos.append(context_info(row).model_copy(update={"last_used_at": now}))
            await tx.add_pins(pin_id, context_ids, owner, now)
        return infos

    async def evict(self, *, keep: Sequence[str] = (), loader: Owner | None = None) -> builtins.list[str]:
        """Evict what `eviction.plan_eviction` names: unpinned contexts no owner holds any more,
        those past store_max_age_days, then least recently used ones until the bytes fit
        store_max_bytes; never one stored or used within context_grace_s, nor one in `keep` (a
        put protects what it just stored, even when it alone exceeds the cap). With `loader`
        (who just stored), that owner's own contexts go first. Returns the evicted ids."""
        if not await self.index.present():
            return []
        async with self.index.write() as tx:
            now = await tx.now()
            await tx.lock_eviction()
            pinned = {cid for cid, _ in await tx.live_pins(now)}
            rows = await tx.all(self._sql.eviction_rows)
            owners: dict[str, set[str]] = defaultdict(set)
            for o in await tx.all(self._sql.all_ownerships):
                owners[o["context_id"]].add(o["owner"])
            planned = plan_eviction(
                rows, owners, settings=self.settings, loader=loader, pinned=pinned, keep=set(keep), now=now
            )
            for e in planned:
                await self._drop(tx, e.context_id)
                await tx.release_blob(e.sha256)
        await anyio.to_thread.run_sync(clean_stale_tmp, self.tmp_dir, self.index.clock())  # the host's files
        evicted = [e.context_id for e in planned]
        if evicted:
            log.info("evicted %d context(s): %s", len(evicted), ", ".join(evicted))
        return evicted
