"""How a worker writes the end of a run it executed, whatever happened to the database meanwhile.

Three ends, each fenced by the run's attempt (never written over another attempt's run, never
over a final record):

- `hand_back`: at shutdown, a run that had no LM reply yet goes back to the queue for another
  worker (if this fails, the sweepers queue it again once this worker's lease ends);
- `end_unrecorded`: a run stopped because its first answered LM call could not be recorded is
  queued again (once) or ends `error`;
- `ensure_final`: the run's final record, retried through a database outage until it lands.

The last two retry for up to FINAL_WRITE_S, and only while the database is out of reach
(`StoreUnreachableError`): a write it refused for what it holds would be refused again every
second, the run `running` for good and its slot held. Then `ensure_final` records the run
`error` instead, saying why (`service/unrecordable.py`), and `end_unrecorded` gives up at once
(its record holds no answer: a refusal there is a bug, logged). The worker (`worker.py`) picks
which applies.
"""

from __future__ import annotations

import logging

import anyio

from rlm_mcp.errors import StoreUnreachableError
from rlm_mcp.ports.queue import RunQueuePort
from rlm_mcp.ports.runs import Notice, NoticeKind, RunPhase, RunRecord, WorkerRef
from rlm_mcp.service.active_run import ActiveRun
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.service.unrecordable import unrecordable

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
    with anyio.move_on_after(FINAL_WRITE_S):
        while True:
            try:
                if fresh:
                    notice = Notice(kind=NoticeKind.REQUEUED_UNRECORDED, worker=worker)
                    await queue.requeue(run.run_id, attempt, requeued(run, notice))
                else:
                    stopped = Notice(kind=NoticeKind.STOPPED_UNRECORDED, worker=worker)
                    ended = run.record().ended("error", stopped.render(), notice=stopped)
                    await queue.finish(run.run_id, ended, attempt=attempt)
                return
            except StoreUnreachableError as exc:  # PostgreSQL still away: try again
                log.info("could not record the stop of run %s yet: %s", run.run_id, exc)
                await anyio.sleep(RETRY_S)
            except Exception:  # refused for what it holds: it would be refused again
                log.exception("the database refused the stop of run %s; not retried", run.run_id)
                return


async def ensure_final(queue: RunQueuePort, run: ActiveRun, run_log: QueueRunLog, attempt: int) -> None:
    """The run's final record, whatever happened to the database meanwhile: `RunManager`
    writes it once (with the staged events and the wake-up) and only logs a failure; then
    it (and any event still staged) is written here again until it lands (fenced: never
    over another attempt, never over a final record), and announced. A record the database
    refuses for what it holds is replaced by the run ended `error`, saying why."""
    if run_log.final_written:  # by `RunManager`, announced with it: the usual case
        return
    summary = run.record()
    refused = False
    with anyio.move_on_after(FINAL_WRITE_S):
        while True:
            try:
                if not refused:  # after a refusal, only the record: the staged events may be what it was about
                    await run_log.flush()
                await queue.finish(run.run_id, summary, attempt=attempt)
                return
            except StoreUnreachableError as exc:  # PostgreSQL restarting: try again
                log.info("could not record the end of run %s yet: %s", run.run_id, exc)
                await anyio.sleep(RETRY_S)
            except Exception as exc:
                if refused:
                    log.exception("the database refused the error record of run %s too; not retried", run.run_id)
                    return
                log.error("the database refused the final record of run %s; recording it `error`: %s", run.run_id, exc)
                refused = True
                summary = unrecordable(summary, exc)
    log.error("the end of run %s could not be recorded within %.0f s", run.run_id, FINAL_WRITE_S)
