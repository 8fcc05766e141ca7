"""A run's start on a team front, over a real PostgreSQL (`PgRunQueue.enqueue`, the schema's
`rlm_enqueue`): one statement per start (no BEGIN, advisory lock or COMMIT of its own), no read of
the contexts its owner started runs on before (`service.run_contexts`), and the same refusals as
before: an unknown context, another owner's, one deleted since the front read it, and the waiting
bounds under concurrent starts. A front with no worker: every accepted run stays queued; no
sandbox, so no Docker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from rlm_mcp.assembly import build_service, make_stores
from rlm_mcp.config import Settings
from rlm_mcp.errors import BusyError, UnknownIdError
from rlm_mcp.owners import Owner
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.service.service import RlmService
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_queue_team import summary
from tests.fixtures_surface import ANSWER_NOW, make_settings

pytestmark = pytest.mark.anyio

ALICE, BOB = Owner("alice"), Owner("bob")


def folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@asynccontextmanager
async def front(tmp_path: Path, url: str, **overrides: Any) -> AsyncIterator[RlmService]:
    """One in-process front (no worker: nothing is claimed), its LM a scripted server."""
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        settings = make_settings(
            folder(tmp_path), lm.base_url, pool_size=0, database_url=url, role="front", **overrides
        )
        async with build_service(settings, mode="http") as service:
            yield service


class Sent:
    """The statements this process sends while it is entered (every `AsyncConnection.execute`,
    pipelined or not), as text."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts: list[str] = []
        self._monkeypatch = monkeypatch
        self._on = False
        execute = psycopg.AsyncConnection.execute

        async def counted(conn: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if self._on:
                self.texts.append(query.decode() if isinstance(query, bytes) else str(query))
            return await execute(conn, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted)

    def __enter__(self) -> Sent:
        self.texts.clear()
        self._on = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._on = False

    def naming(self, word: str) -> list[str]:
        return [t for t in self.texts if word.lower() in t.lower()]


def queued(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT run_id FROM rlm_runs WHERE state = 'queued'").fetchall()]


async def test_a_start_sends_one_statement_and_reads_a_known_context_no_more(
    tmp_path: Path, pg_migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    async with front(tmp_path, pg_migrated_url) as service:
        alice = Caller(service, ALICE)
        cid = (await alice.load_context(text="front start haystack")).context_id
        with sent:
            first = await alice.start_run("q1", cid, RunOverrides())
        assert len(sent.naming("rlm_contexts")) == 1  # the first start reads its context
        assert len(sent.naming("rlm_enqueue")) == 1
        with sent:
            second = await alice.start_run("q2", cid, RunOverrides())
        # The second start: its context is known here, and the enqueue is one statement.
        assert sent.naming("rlm_contexts") == [] and len(sent.naming("rlm_enqueue")) == 1, sent.texts
        assert sent.naming("advisory") == [] and sent.naming("BEGIN") == [] and sent.naming("COMMIT") == []
        assert sorted(queued(pg_migrated_url)) == sorted([first.run_id, second.run_id])


async def test_an_unknown_a_foreign_or_a_deleted_context_is_refused_at_start(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    async with front(tmp_path, pg_migrated_url) as service:
        alice, bob = Caller(service, ALICE), Caller(service, BOB)
        cid = (await alice.load_context(text="alice's own haystack")).context_id
        with pytest.raises(UnknownIdError) as never:
            await alice.start_run("q", "ctx_000000000000000000000000", RunOverrides())
        with pytest.raises(UnknownIdError) as foreign:  # alice's context, as bob: unknown to him
            await bob.start_run("q", cid, RunOverrides())
        assert str(foreign.value) == str(never.value).replace("ctx_000000000000000000000000", cid)
        await alice.start_run("q", cid, RunOverrides())  # known here from now on
        assert await alice.delete_context(cid)
        with pytest.raises(UnknownIdError) as deleted:  # refused by the enqueue's own check
            await alice.start_run("q", cid, RunOverrides())
        assert str(deleted.value) == str(foreign.value)
        assert len(queued(pg_migrated_url)) == 1  # nothing written by the refused starts


@asynccontextmanager
async def two_queues(tmp_path: Path, url: str, **overrides: Any) -> AsyncIterator[tuple[PgRunQueue, PgRunQueue]]:
    """Two replicas' queues on one database (their own pools)."""
    one = Settings(database_url=url, data_dir=tmp_path / "a", **overrides)
    other = Settings(database_url=url, data_dir=tmp_path / "b", **overrides)
    async with make_stores(one) as a, make_stores(other) as b:
        assert isinstance(a.lifecycle, Database) and isinstance(b.lifecycle, Database)
        yield PgRunQueue(queue_rules(one.queue), a.lifecycle), PgRunQueue(queue_rules(other.queue), b.lifecycle)


async def test_the_enqueue_checks_the_owners_contexts_before_it_counts(tmp_path: Path, pg_url: str) -> None:
    """A run naming a context its owner lacks writes nothing and takes no place, even when the
    queue is full (the context's error, not the bound's); a run naming none is counted."""
    async with two_queues(tmp_path, pg_url, run_max_queued_per_owner=1) as (queue, _):
        with pytest.raises(UnknownIdError, match="ctx_nobody"):
            await queue.enqueue(summary("run_ctx0000000000001", "alice", context_ids=["ctx_nobody"]), 1)
        assert await queue.queued_counts("alice") == (0, 0)
        await queue.enqueue(summary("run_ctx0000000000002", "alice"), 1)
        with pytest.raises(UnknownIdError, match="ctx_nobody"):  # the bound is reached: still the context's error
            await queue.enqueue(summary("run_ctx0000000000003", "alice", context_ids=["ctx_nobody"]), 1)
        with pytest.raises(BusyError, match="You already have 1 run"):
            await queue.enqueue(summary("run_ctx0000000000004", "alice"), 1)
        assert await queue.queued_counts("alice") == (1, 1)


async def test_the_waiting_bounds_hold_under_concurrent_starts_naming_contexts(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    """48 starts at once on two fronts, bounds 20 per owner and 30 in all, two owners each with
    a context of its own (bob's starts name alice's context half the time: refused, never
    counted): exactly the bounds are queued, every other start refused with its own error."""
    overrides = {"run_max_queued_per_owner": 20, "run_max_queued": 30}
    async with (
        front(tmp_path / "a", pg_migrated_url, **overrides) as a,
        front(tmp_path / "b", pg_migrated_url, **overrides) as b,
    ):
        fronts = [a, b]
        ctx = {
            ALICE: (await Caller(a, ALICE).load_context(text="alice's haystack")).context_id,
            BOB: (await Caller(b, BOB).load_context(text="bob's haystack")).context_id,
        }
        accepted: dict[str, int] = {ALICE: 0, BOB: 0}
        busy: list[str] = []
        unknown = 0

        async def start(i: int) -> None:
            nonlocal unknown
            owner = ALICE if i % 2 == 0 else BOB
            cid = ctx[ALICE] if owner == BOB and i % 4 == 1 else ctx[owner]
            try:
                await Caller(fronts[i % 3 % 2], owner).start_run(f"q{i}", cid, RunOverrides())
                accepted[owner] += 1
            except BusyError as refused:
                busy.append(str(refused))
            except UnknownIdError:
                assert owner == BOB and cid == ctx[ALICE]
                unknown += 1

        with anyio.fail_after(300):  # generous: a loaded 2-core machine
            async with anyio.create_task_group() as tg:
                for i in range(48):
                    tg.start_soon(start, i)
        assert unknown == 12  # every start of bob's naming alice's context, whatever the bounds
        # 36 starts name their owner's context (alice's 24, bob's 12): 30 queued in all, alice's at
        # most 20, whichever came first; the other 6 refused with the bound they met.
        assert sum(accepted.values()) == 30 and accepted[ALICE] <= 20, accepted
        assert len(busy) == 6 and len(queued(pg_migrated_url)) == 30
        assert all("You already have 20 runs waiting" in t or "queue is full: 30 runs waiting" in t for t in busy), busy
