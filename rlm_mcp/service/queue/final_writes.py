"""How a worker writes the end of a run it executed, whatever happened to the database meanwhile.

Three ends, each fenced by the run's attempt (never written over another attempt's run, never
over a final record):

- `hand_back`: at shutdown, a run that had no LM reply yet goes back to the queue for another
  worker (if this fails, the sweepers queue it again once this worker's lease ends);
- `end_unrecorded`: a run stopped because its first answered LM call could not be recorded is
  queued again (once) or ends `error`;
- `ensure_final`: the run's final record, retried through a database outage until it lands.

The last two retry for up to FINAL_WRITE_S; the worker (`worker.py`) picks which applies.
"""

from __future__ import annotations

import logging

import anyio

from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import Notice, NoticeKind, RunPhase, RunRecord, WorkerRef
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue.runlog import QueueRunLog

log = logging.getLogger("rlm_mcp.queue")

RETRY_S = 1.0  # after a database error, before the next try
FINAL_WRITE_S = 600.0  # how long a run's final record is retried through a database outage


def requeued(run: ActiveRun, notice: Notice) -> RunRecord:
    """The run's record as it goes back to the queue."""
    return run.record().model_copy(
        update={"result": None, "not_started": None, "status": "queued", "phase": RunPhase.QUEUED, "notice": notice}
    )


async def hand_back(queue: RunQueuePort, run: ActiveRun, run_log: QueueRunLog, attempt: int, worker: WorkerRef) -> None:
    """Queue the run again for another worker; if this fails, the sweepers queue it again
    once this worker's lease ends."""
    summary = requeued(run, Notice(kind=NoticeKind.REQUEUED_WORKER_SHUTDOWN, worker=worker))
    try:
        await run_log.flush()  # the events staged before the log was detached
        if await queue.requeue(run.run_id, attempt, summary):
            log.info("run %s handed back to the queue", run.run_id)
    except Exception as exc:
        log.info("could not hand run %s back (the sweepers will): %s", run.run_id, exc)


async def end_unrecorded(queue: RunQueuePort, run: ActiveRun, attempt: int, worker: WorkerRef, *, fresh: bool) -> None:
    """A run stopped because its first answered LM call could not be recorded: queued again
    (once, as after a lost worker: no answer was recorded) or ended `error`, retried until
    the database answers (fenced, so never over another attempt)."""
    why = "its first answered LM call could not be recorded (the database was unreachable)"
    with anyio.move_on_after(FINAL_WRITE_S):
        while True:
            try:
                if fresh:
                    notice = Notice.of_text(f"{why}; it was queued again")
                    await queue.requeue(run.run_id, attempt, requeued(run, notice))
                else:
                    reason = f"The run was stopped on {worker.render()}: {why}. Start it again with rlm_start."
                    await queue.finish(run.run_id, run.record().ended("error", reason), attempt=attempt)
                return
            except Exception as exc:  # PostgreSQL still away: try again
                log.info("could not record the stop of run %s yet: %s", run.run_id, exc)
                await anyio.sleep(RETRY_S)


async def ensure_final(queue: RunQueuePort, run: ActiveRun, run_log: QueueRunLog, attempt: int) -> None:
    """The run's final record, whatever happened to the database meanwhile: `RunManager`
    writes it once (with the staged events and the wake-up) and only logs a failure; then
    it (and any event still staged) is written here again until it lands (fenced: never
    over another attempt, never over a final record), and announced."""
    if run_log.final_written:  # by `RunManager`, announced with it: the usual case
        return
    summary = run.record()
    with anyio.move_on_after(FINAL_WRITE_S):
        while True:
            try:
                await run_log.flush()
                await queue.finish(run.run_id, summary, attempt=attempt)
                return
            except Exception as exc:  # PostgreSQL restarting: try again
                log.info("could not record the end of run %s yet: %s", run.run_id, exc)
                await anyio.sleep(RETRY_S)
    log.error("the end of run %s could not be recorded within %.0f s", run.run_id, FINAL_WRITE_S)
