"""A worker's publisher of one run's live summary and log (`QueueWorker` runs one per run it executes).

On each progress event and phase change, the run's live summary with the events staged since the
last flush, in one fenced statement (`QueueRunLog.publish`), at most every
RLM_MCP_LIVE_SUMMARY_INTERVAL_S for a run a front follows and every
RLM_MCP_LIVE_SUMMARY_UNFOLLOWED_INTERVAL_S for the others (`follows.FollowedRuns`); the staged
events alone at least every RLM_MCP_QUEUE_POLL_S. A write that matches nothing stops the run
(`stop`); the run's end and its first answered LM call are written elsewhere, never coalesced.

Only the summaries of a run followed turn by turn are announced (the NOTIFY that wakes its
fronts, or the local lane's in-process hand-over), and an unfollowed run's first one (it says a
worker runs it: the front's no-worker notice ends); the others are written to the row alone, for
those who read it (a front's `find`: `rlm_status`, `rlm_result`, the viewer), so a front whose
callers only wait for the result is not woken for mirror updates nobody looks at.

The coalesced writes wait for the process's ticks of their period (`rlm_mcp.ticks`), not for an
instant of their own: the runs whose writes come due in the same period write at the same tick,
and the process's log writer (`store.pg.log_writer`) takes them in one statement. A live summary
waits for the first tick at least half an interval after the last one (once on the ticks, one
per interval, as before); staged events for the first tick after the last write (within a poll
interval, as before).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from math import inf

import anyio

from rlm_mcp.config import QueueSettings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue.final_writes import RETRY_S
from rlm_mcp.service.queue.follows import FollowedRuns
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.ticks import next_tick, until_tick

log = logging.getLogger("rlm_mcp.queue")

DUE_S = 0.0001  # a wait this short is over: the tick has come (the loop's timers run that early)


async def publish_until_done(
    run: ActiveRun,
    run_log: QueueRunLog,
    settings: QueueSettings,
    follows: FollowedRuns,
    *,
    stopped: Mapping[str, str],
    stop: Callable[[str, str], None],
) -> None:
    """Publish the run's live summary, with the events staged since the last flush, on each
    progress event and phase change, once per RLM_MCP_LIVE_SUMMARY_INTERVAL_S for a run a
    front follows, per RLM_MCP_LIVE_SUMMARY_UNFOLLOWED_INTERVAL_S for the others (the latest
    state after a burst, at the process's ticks of that period; an unfollowed run's first one
    too, a followed run's first one at once); write staged events every poll interval anyway."""
    seen, phase = -1, None
    poll = settings.queue_poll_s
    published_at = -inf
    announced = False  # the run's first live summary is announced, followed or not
    # A run nobody follows publishes its first live summary at its interval's tick too (a run that
    # ends before it publishes none: its final record carries everything); a followed one at once.
    # Its staged events are still written within a poll interval of its adoption.
    adopted_at = written_at = anyio.current_time()
    interval = follows.interval(run.run_id)
    first_at = next_tick(interval, adopted_at) if interval > 0 else -inf
    while not run.done.is_set():
        if run.run_id in stopped:
            await run.done.wait()
            return
        # Progress events notify; a phase change (waiting on the model, running code) does
        # not, so it is looked at every poll interval.
        if run.seq != seen or run.progress.phase != phase:
            # Coalesce: each publish is a statement, a NOTIFY and every follower's wake-up, and a
            # fast run makes several progress events per turn. The states in between are
            # superseded by the one read after the wait; the run's end does not wait (its final
            # record is written by `QueueWorker._execute` once `done` is set), nor does its first answered
            # LM call (`QueueRunLog.append` writes that one at once). The interval is read each
            # time: a follow may arrive mid-run.
            now = anyio.current_time()
            first = -inf if follows.followed(run.run_id) else first_at
            wait = next_publish_at(published_at, follows.interval(run.run_id), first=first) - now
            if wait > DUE_S:
                # However slow the interval, staged events are written every poll interval.
                due = next_tick(poll, written_at) - now if run_log.staged else wait
                if due <= DUE_S:
                    await _flush(run_log)
                    written_at = anyio.current_time()
                    continue
                with follows.waiting(run.run_id, min(wait, due)):
                    await run.done.wait()
                continue
            seen, phase = run.seq, run.progress.phase
            summary = run.record()
            announce = not announced or follows.followed(run.run_id)
            try:
                published = await run_log.publish(summary, announce=announce)
                published_at = written_at = anyio.current_time()
                announced = announced or announce
                if not published and run.result is None:
                    stop(run.run_id, "the run is no longer this worker's (another attempt, or it ended)")
            except RlmMcpError as exc:  # the database is restarting: the next event retries
                log.info("could not publish run %s: %s", run.run_id, exc)
                seen, phase = -1, None
                await anyio.sleep(RETRY_S)
                continue
        elif run_log.staged:  # events between progress events (a long cell's `cell_start`)
            await _flush(run_log)
            written_at = anyio.current_time()
        await run.wait_change(until_tick(poll), since=seen)


def next_publish_at(published_at: float, interval: float, *, first: float = -inf) -> float:
    """When the next live summary may be published: the first tick of `interval` at least half an
    interval after the last one; the first one at `first` (at once by default), any with no
    interval at once."""
    if interval <= 0:
        return -inf
    if published_at == -inf:
        return first
    return next_tick(interval, published_at + interval / 2)


async def _flush(run_log: QueueRunLog) -> None:
    """Write the staged events alone; after a failure (the database restarting) the next
    publish or poll writes them."""
    try:
        await run_log.flush()
    except RlmMcpError as exc:
        log.info("could not write the events of run %s: %s", run_log.run_id, exc)
        await anyio.sleep(RETRY_S)
