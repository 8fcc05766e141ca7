"""A run's event stream (`viewer/stream.py`) over a real loopback HTTP server, against both
stores: every event once and in order, resumed after a dropped connection with nothing lost or
repeated, the run's end, another owner's run answered as an unknown one, the per-owner bound,
heartbeats and the idle close; in team mode a requeued run's restart is an event.

`consume` is the snippet docs/events-and-webhooks.md shows (run from the page): plain httpx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from rlm_mcp.access import HostPolicy, owner_of_token
from rlm_mcp.assembly import make_stores
from rlm_mcp.config import EventSettings, Settings
from rlm_mcp.events import LimitsRecord, RunEnd, RunStart, TurnStart
from rlm_mcp.store.ports import RunStorePort
from rlm_mcp.testing.servers import free_port
from rlm_mcp.usage import Usage
from rlm_mcp.viewer.auth import ViewerAuth
from rlm_mcp.viewer.routes import build_viewer
from tests.doc_snippets import snippet
from tests.fixtures_store import final, summary

pytestmark = pytest.mark.anyio

ALICE, BOB = "alice-stream-token", "bob-stream-token"
OWNER_ALICE = owner_of_token(ALICE)
FAST = EventSettings(event_stream_poll_s=0.05, event_stream_heartbeat_s=0.2, event_streams_per_owner=2)


# -- the snippet (docs/events-and-webhooks.md) ---------------------------------------------------
consume = snippet("events-and-webhooks.md", "consume")["consume"]


async def read(
    url: str, token: str, last_event_id: str | None = None, stop_after: int | None = None
) -> list[tuple[str | None, str, dict[str, Any]]]:
    """The page's `consume`, until the stream ends or `stop_after` messages (then the connection
    is dropped: the generator is closed, and its connection with it)."""
    got: list[tuple[str | None, str, dict[str, Any]]] = []
    async with aclosing(consume(url, token, last_event_id)) as messages:
        async for message in messages:
            got.append(message)
            if stop_after is not None and len(got) >= stop_after:
                break
    return got


# -- the server ------------------------------------------------------------------------------------
@asynccontextmanager
async def viewer_server(
    records: RunStorePort, settings: EventSettings = FAST, *, followed: list[str] | None = None
) -> AsyncIterator[str]:
    """`followed`: the runs whose stream said it follows them (`build_viewer(follow=...)`)."""
    port = free_port()
    auth = ViewerAuth(tokens=[ALICE, BOB], policy=HostPolicy("127.0.0.1", port, [], []))

    async def follow(run_id: str) -> None:
        if followed is not None:
            followed.append(run_id)

    app = build_viewer(records, auth, events=settings, follow=follow)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        while not server.started:
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}/runs/api/runs"
        finally:
            server.should_exit = True


def _limits() -> LimitsRecord:
    return LimitsRecord(max_iterations=5, max_depth=1, timeout_s=60, token_budget=None, max_errors=3)


def _start(run_id: str) -> RunStart:
    return RunStart(
        run_id=run_id, depth=0, query="q", contexts=[], limits=_limits(), model="m", sub_model="m", prompt_profile="p"
    )


def _end(run_id: str) -> RunEnd:
    return RunEnd(run_id=run_id, status="completed", reason=None, iterations=3, usage=Usage(), duration_s=1, depth=0)


async def test_a_stream_resumes_after_a_dropped_connection_with_nothing_lost_or_repeated(
    store_settings: Callable[..., Settings],
) -> None:
    stores = make_stores(store_settings(), replica=True)
    async with stores:
        run_id = "run_stream000001"
        log = await stores.runs.create(summary(run_id, owner=OWNER_ALICE, status="running"))
        await log.open()
        await log.append(_start(run_id))
        for i in range(1, 4):
            await log.append(TurnStart(run_id=run_id, iteration=i, max_iterations=5, depth=0))
        followed: list[str] = []
        async with viewer_server(stores.runs, followed=followed) as base:
            url = f"{base}/{run_id}/events"
            first = await read(url, ALICE, stop_after=2)  # the connection drops here
            assert [m[1] for m in first] == ["run_start", "turn_start"]
            assert followed == [run_id]  # the stream follows the run's progress (team mode: every turn)
            # The run goes on while nobody listens, and ends.
            await log.append(TurnStart(run_id=run_id, iteration=4, max_iterations=5, depth=0))
            await log.append(_end(run_id))
            await log.write_summary(
                final(run_id).model_copy(update={"request": summary(run_id, owner=OWNER_ALICE).request})
            )
            await log.aclose()
            rest = await read(url, ALICE, last_event_id=first[-1][0])
            events = first + rest
            assert [m[1] for m in events] == ["run_start"] + ["turn_start"] * 4 + ["run_end", "end"]
            assert [m[2].get("iteration") for m in events if m[1] == "turn_start"] == [1, 2, 3, 4]
            ids = [m[0] for m in events]
            assert len(set(ids)) == len(ids) and ids[-1] == "end"
            assert events[-1][2] == {"run_id": run_id, "status": "completed"}
            # A reconnection after the end is told there is nothing more (204: EventSource stops).
            assert await read(url, ALICE, last_event_id="end") == []
            # Another owner's run answers exactly as an unknown run does.
            async with httpx.AsyncClient() as client:
                theirs = await client.get(url, headers={"Authorization": f"Bearer {BOB}"})
                unknown = await client.get(f"{base}/run_nobody/events", headers={"Authorization": f"Bearer {ALICE}"})
                anonymous = await client.get(url)
            assert (
                (theirs.status_code, theirs.json())
                == (unknown.status_code, unknown.json())
                == (
                    404,
                    {"error": "Unknown run id."},
                )
            )
            assert anonymous.status_code == 401
            assert set(followed) == {run_id}  # an unknown or another owner's run is never followed


async def test_streams_are_bounded_per_owner_kept_alive_and_closed_when_idle(
    store_settings: Callable[..., Settings],
) -> None:
    stores = make_stores(store_settings(), replica=True)
    async with stores:
        run_id = "run_stream000002"
        log = await stores.runs.create(summary(run_id, owner=OWNER_ALICE, status="running"))
        await log.append(_start(run_id))
        idle = FAST.model_copy(update={"event_stream_idle_s": 0.6})
        async with viewer_server(stores.runs, idle) as base, httpx.AsyncClient(timeout=30) as client:
            url = f"{base}/{run_id}/events"
            headers = {"Authorization": f"Bearer {ALICE}"}
            async with (
                client.stream("GET", url, headers=headers) as one,
                client.stream("GET", url, headers=headers) as two,
            ):
                third = await client.get(url, headers=headers)
                assert third.status_code == 429 and third.headers["retry-after"] == "5"
                lines = [line async for line in one.aiter_lines()]  # until the idle close
                assert [line async for line in two.aiter_lines()]  # closed by the server too
            assert lines[0] == "id: 0-0" if stores.kind != "postgresql" else lines[0].startswith("id: 0-")
            assert ": keep-alive" in lines  # heartbeats while nothing happened
            # Both streams closed: the owner may open another.
            again = await read(url, ALICE, stop_after=1)
            assert again[0][1] == "run_start"
        await log.aclose()


async def test_a_requeued_runs_restart_is_an_event_and_ids_carry_the_attempt(
    pg_migrated_url: str, tmp_path: Path
) -> None:
    """Team mode: a worker claims the run (attempt 1), writes, and is lost; the next claim
    (attempt 2) goes on. The stream names each event `attempt-seq` and says `restart` between;
    a client that resumes from the restart's id gets the new attempt's events once."""
    from rlm_mcp.store.pg.runs import PgRunStore
    from rlm_mcp.testing.settings import make_settings

    stores = make_stores(make_settings(tmp_path, database_url=pg_migrated_url), replica=True)
    async with stores:
        runs = stores.runs
        assert isinstance(runs, PgRunStore)
        run_id = "run_stream000003"
        await (await runs.create(summary(run_id, owner=OWNER_ALICE, status="running"))).aclose()

        async def claim(attempt: int) -> None:  # what the queue's claim does to the row (beneath the port)
            async with stores.lifecycle.connection() as conn:  # type: ignore[attr-defined]
                await conn.execute(
                    "UPDATE rlm_runs SET state = 'running', attempt = %s WHERE run_id = %s",
                    (attempt, run_id),
                )

        await claim(1)
        first = await runs.reopen(run_id, attempt=1)
        await first.append(_start(run_id))
        await first.append(TurnStart(run_id=run_id, iteration=1, max_iterations=5, depth=0))
        await claim(2)  # requeued and claimed again: attempt 1's worker writes nothing more
        await first.append(TurnStart(run_id=run_id, iteration=99, max_iterations=5, depth=0))
        second = await runs.reopen(run_id, attempt=2)
        await second.append(_start(run_id))
        async with viewer_server(runs) as base:
            url = f"{base}/{run_id}/events"
            before = await read(url, ALICE, stop_after=3)
            assert [(m[0], m[1]) for m in before] == [("1-0", "run_start"), ("1-1", "turn_start"), ("2-r", "restart")]
            await second.append(_end(run_id))
            await second.write_summary(
                final(run_id).model_copy(update={"request": summary(run_id, owner=OWNER_ALICE).request})
            )
            after = await read(url, ALICE, last_event_id="2-r")
            assert [(m[0], m[1]) for m in after] == [("2-2", "run_start"), ("2-3", "run_end"), ("end", "end")]
            whole = [m[1] for m in await read(url, ALICE)]
            assert whole == ["run_start", "turn_start", "restart", "run_start", "run_end", "end"]
