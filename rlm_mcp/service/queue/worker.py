"""The worker's side of the run queue: claim a queued run, execute it here, report as it goes.

Claims go through Procrastinate's `JobManager` (`fetch_job`: one job row locked, marked `doing`
and named with this worker's id, so no two workers take one run), driven by this small loop
rather than Procrastinate's own `Worker`, for three reasons found in its source (3.10):
- its worker stops at the first database error of any side task (heartbeat, listener) and then
  waits for its running jobs before it unregisters, so a PostgreSQL restart would silence the
  heartbeat of a worker that is still running runs, and the sweepers would declare them lost;
- it cannot make a claim wait for free sandbox slots, which only the run's `max_depth` tells;
- it cancels a job's asyncio task on abort, where a run must be cancelled through its own
  scope so that it records `cancelled` and its sandbox is removed (`RunManager`).

The gate (a worker claims a run only when it can start it: a free run slot and the sandbox slots
the run's max_depth may need): a claim waits for a free run slot (RLM_MCP_MAX_RUNS) and at least
one free sandbox slot; right after the claim the run's own need (`max_depth` sandboxes, the
no-deadlock rule of `sandbox/slots.py`) is checked against the slots free now, and a run that
does not fit is given back to the queue at once (`retry_job`, still `todo`, any worker may take
it) and this worker waits one poll interval before it claims again. The library cannot know the
need before the claim (it is in the run's record), so the gate sits around it, not inside it.

Spreading: woken for a newly queued run while already running some, a worker waits SPREAD_S per
run it runs before claiming, so an idler worker takes it first; a backlog is claimed at once.

A run's child RLMs (`rlm_query`) run inside the root run's engine here, never through the queue.

Stopping (SIGTERM): runs that have had no LM reply yet are handed back to the queue (once, as
the sweepers would after a crash) with their log detached, so another worker starts them from
scratch; the others end `cancelled`, naming this worker.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable

import anyio
import procrastinate
import psycopg
from procrastinate.jobs import Job, Status

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.queue import records
from rlm_mcp.service.queue.app import QUEUE
from rlm_mcp.service.queue.front import request_of
from rlm_mcp.service.queue.runlog import QueueRunLog
from rlm_mcp.service.runs import ActiveRun, RunManager, run_summary
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.runs import PgRunStore

log = logging.getLogger("rlm_mcp.queue")

RETRY_S = 1.0  # after a database error, before the next try
SPREAD_S = 0.05  # per run already executing here, before claiming a newly queued one
FINAL_WRITE_S = 600.0  # how long a run's final record is retried through a database outage


class QueueWorker:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        run_store: PgRunStore,
        app: procrastinate.App,
        runs: RunManager,
        sandboxes: SandboxManager,
        engine: Callable[[], Awaitable[RLMEngine]],
    ) -> None:
        self._settings = settings
        self._db = db
        self._run_store = run_store
        self._app = app
        self._runs = runs
        self._sandboxes = sandboxes
        self._engine = engine
        self._slots = anyio.Semaphore(settings.max_runs)
        self._new_job = anyio.Event()
        self._running: dict[int, ActiveRun] = {}  # by job id
        self._logs: dict[int, QueueRunLog] = {}  # by job id
        self._fresh: set[int] = set()  # jobs whose run was never queued again (may be, once)
        self._handing_back: set[int] = set()  # jobs given back to the queue at shutdown
        self._tg: anyio.abc.TaskGroup | None = None
        self.worker_id: int | None = None

    @property
    def name(self) -> str:
        return f"worker {self.worker_id} (host {socket.gethostname()}, pid {os.getpid()})"

    async def __aenter__(self) -> QueueWorker:
        await self._register()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for task in (self._heartbeat, self._listen, self._poll_aborts, self._claim_forever):
            self._tg.start_soon(task)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        tg, self._tg = self._tg, None
        self._runs.shutdown_reason = f"the {self.name} running it shut down; start it again with rlm_start"
        # Runs that have had no LM reply yet go back to the queue (once) instead of ending:
        # another worker starts them from scratch and nothing was spent.
        for job_id, run in list(self._running.items()):
            if job_id in self._fresh and run.progress.usage.total.calls == 0 and job_id in self._logs:
                self._logs[job_id].detach()
                self._handing_back.add(job_id)
        tg.cancel_scope.cancel()  # each run records `cancelled` and its job ends `aborted`
        await tg.__aexit__(None, None, None)
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                if self.worker_id is not None:
                    await self._app.job_manager.unregister_worker(self.worker_id)
            except Exception as exc:  # the sweepers will find it stalled
                log.info("could not unregister %s: %s", self.name, exc)

    async def _register(self) -> None:
        self.worker_id = await self._app.job_manager.register_worker()
        await records.register_worker(self._db, self.worker_id, self._sandboxes.owner_id)
        # Said now: a shutdown's cancellation may reach a run before `__aexit__` runs.
        self._runs.shutdown_reason = f"the {self.name} running it shut down; start it again with rlm_start"
        log.info("queue %s registered", self.name)

    # --- liveness -------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        interval = max(0.2, min(10.0, self._settings.worker_lease_s / 3))
        while True:
            await anyio.sleep(interval)
            try:
                async with self._db.connection() as conn:
                    cur = await conn.execute(
                        "UPDATE procrastinate_workers SET last_heartbeat = now() WHERE id = %s RETURNING id",
                        (self.worker_id,),
                    )
                    beat = await cur.fetchone() is not None
                if not beat:  # silent past its lease (a long outage) and pruned: start afresh
                    log.warning("%s was declared lost by the other workers; registering again", self.name)
                    await self._register()
            except Exception as exc:  # PostgreSQL restarting: keep trying
                log.info("queue heartbeat failed: %s", exc)

    async def _listen(self) -> None:
        async def on_note(*, channel: str, notification: dict[str, object]) -> None:
            if notification.get("type") == "job_inserted":
                self._new_job.set()
            elif notification.get("type") == "abort_job_requested":
                job_id = notification.get("job_id")
                if isinstance(job_id, int):
                    self._abort(job_id)

        while True:
            try:
                await self._app.job_manager.listen_for_jobs(on_notification=on_note, queues=[QUEUE])  # type: ignore[arg-type]
            except Exception as exc:  # cannot connect yet: try again
                log.info("queue listener failed: %s", exc)
            self._new_job.set()  # notifications may have been lost meanwhile
            await anyio.sleep(RETRY_S)

    async def _poll_aborts(self) -> None:
        """NOTIFY is lost across reconnects: the abort requests are polled as well."""
        while True:
            await anyio.sleep(self._settings.queue_poll_s)
            if not self._running:
                continue
            try:
                for job_id in await self._app.job_manager.list_jobs_to_abort_async(queue=QUEUE):
                    self._abort(job_id)
            except Exception as exc:
                log.info("could not list the runs to cancel: %s", exc)

    def _abort(self, job_id: int) -> None:
        run = self._running.get(job_id)
        if run is not None and run.scope is not None:
            run.scope.cancel()  # the run records `cancelled`, its sandbox is removed

    # --- claims ---------------------------------------------------------------------------

    async def _claim_forever(self) -> None:
        assert self._tg is not None
        waited = False
        while True:
            await self._slots.acquire()
            self._new_job = anyio.Event()  # before the fetch: a job queued during it wakes us
            try:
                if waited and self._running:
                    # Woken for a new job while busy: leave it a moment to an idler worker, so
                    # runs spread over the workers (draining a backlog is never delayed).
                    await anyio.sleep(SPREAD_S * len(self._running))
                job = await self._claim()
            except BaseException:
                self._slots.release()
                raise
            waited = job is None
            if job is None:
                self._slots.release()
                with anyio.move_on_after(self._settings.queue_poll_s):
                    await self._new_job.wait()
                continue
            self._tg.start_soon(self._process, job)

    async def _claim(self) -> Job | None:
        while self._sandboxes.free_slots < 1:  # noqa: ASYNC110 (SandboxSlots has no event to wait on)
            await anyio.sleep(0.1)  # a sandbox closes within a run's lifetime: cheap to look
        try:
            assert self.worker_id is not None
            return await self._app.job_manager.fetch_job(queues=[QUEUE], worker_id=self.worker_id)
        except Exception as exc:
            log.info("could not claim a run: %s", exc)
            await anyio.sleep(RETRY_S)
            return None

    async def _process(self, job: Job) -> None:
        assert job.id is not None
        status = Status.ABORTED  # unless the run ends by itself: this worker's shutdown cancels it
        try:
            status = await self._execute(job)
        except Exception:
            log.exception("queued job %s failed", job.id)
            status = Status.FAILED
        finally:
            self._running.pop(job.id, None)
            self._logs.pop(job.id, None)
            self._fresh.discard(job.id)
            if job.id in self._handing_back:
                status = Status.TODO
            self._slots.release()
            if status is not Status.TODO:
                with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_S):
                    await self._finish_job(job, status)

    async def _finish_job(self, job: Job, status: Status) -> None:
        while True:
            try:
                await self._app.job_manager.finish_job(job, status=status, delete_job=False)
                return
            except Exception as exc:
                if not isinstance(exc.__cause__, psycopg.OperationalError):
                    log.info("job %s was ended elsewhere: %s", job.id, exc)  # no longer `doing`
                    return
                log.info("could not finish job %s yet: %s", job.id, exc)  # the database is away
                await anyio.sleep(RETRY_S)

    async def _execute(self, job: Job) -> Status:
        """Run the job's run here; the job's final status (TODO: given back to the queue)."""
        run_id = str(job.task_kwargs["run_id"])
        assert self.worker_id is not None and job.id is not None
        row = await records.claim(self._db, run_id, self.worker_id)
        if row is None:  # cancelled (or ended) while it was queued
            return Status.SUCCEEDED
        request = request_of(row.summary)
        need = min(request.limits.max_depth, self._sandboxes.max_slots)
        if self._sandboxes.free_slots < need:
            await self._app.job_manager.retry_job(job)  # `todo` again: any worker may take it
            await anyio.sleep(self._settings.queue_poll_s)
            return Status.TODO
        engine = await self._engine()
        job_id = job.id
        run: ActiveRun | None = None

        def hand_back() -> bool:
            """At the run's end: a run ended by this process's shutdown before any LM reply goes
            back to the queue (decided here too, as the shutdown's cancellation may reach the
            run before `__aexit__` does)."""
            if run is None or not run.shut_down or job_id not in self._fresh or run.progress.usage.total.calls:
                return False
            self._handing_back.add(job_id)
            return True

        run_log = QueueRunLog(await self._run_store.reopen(run_id), hand_back=hand_back)
        self._logs[job.id] = run_log
        if row.requeues == 0:
            self._fresh.add(job.id)
        run = await self._runs.adopt(run_id, request, engine, run_log)
        run.notice = f"running on {self.name}"
        self._running[job.id] = run
        try:
            await self._report_until_done(run, run_log)
        finally:
            with anyio.CancelScope(shield=True):
                if not run.done.is_set():  # this worker is shutting down
                    if run.scope is not None:
                        run.scope.cancel()
                    await run.done.wait()
                if job.id in self._handing_back:
                    await self._hand_back(job, run, run_log)
                else:
                    await self._ensure_final(run, run_log)
        assert run.result is not None
        return Status.ABORTED if run.result.status == "cancelled" else Status.SUCCEEDED

    async def _hand_back(self, job: Job, run: ActiveRun, run_log: QueueRunLog) -> None:
        """Queue the run again (`todo`) for another worker; if this fails, the job is left
        `doing` with this worker unregistered, and the sweepers queue it again themselves."""
        summary = {k: v for k, v in run_summary(self._settings, run).items() if k not in ("result", "not_started")}
        summary.update(
            status="queued",
            phase="queued",
            notice=f"the {self.name} shut down before the run had an LM reply; it was queued again",
        )
        try:
            await run_log.flush()  # the events staged before the log was detached
            await self._app.job_manager.retry_job(job)
            await records.requeue(self._db, run.run_id, summary)
            log.info("run %s handed back to the queue", run.run_id)
        except Exception as exc:
            log.info("could not hand run %s back (the sweepers will): %s", run.run_id, exc)

    async def _ensure_final(self, run: ActiveRun, run_log: QueueRunLog) -> None:
        """The run's final record, whatever happened to the database meanwhile: `RunManager`
        writes it once (with the staged events and the NOTIFY) and only logs a failure; then
        it (and any event still staged) is written here again until it lands (final writes
        never overwrite one), and announced."""
        if run_log.final_written:  # by `RunManager`, announced with it: the usual case
            return
        summary = run_summary(self._settings, run)
        with anyio.move_on_after(FINAL_WRITE_S):
            while True:
                try:
                    await run_log.flush()
                    await records.finish(self._db, run.run_id, summary)
                    return
                except Exception as exc:  # PostgreSQL restarting: try again
                    log.info("could not record the end of run %s yet: %s", run.run_id, exc)
                    await anyio.sleep(RETRY_S)
        log.error("the end of run %s could not be recorded within %.0f s", run.run_id, FINAL_WRITE_S)

    async def _report_until_done(self, run: ActiveRun, run_log: QueueRunLog) -> None:
        """Publish the run's live summary, with the events staged since the last flush, on each
        progress event and phase change; write staged events every poll interval anyway."""
        seen, phase = -1, None
        while not run.done.is_set():
            # Progress events notify; a phase change (waiting on the model, running code) does
            # not, so it is looked at every poll interval.
            if run.seq != seen or run.progress.phase != phase:
                seen, phase = run.seq, run.progress.phase
                summary = run_summary(self._settings, run)
                summary.update(phase=str(run.progress.phase), last_event=run.last_event)
                lm_called = run.progress.usage.total.calls > 0  # an LM call recorded (its reply came)
                try:
                    published = await run_log.publish(summary, lm_called=lm_called)
                    if not published and run.result is None:
                        # Ended elsewhere: this worker was declared lost (a long database outage
                        # silenced its heartbeat) and the run's status says so. Stop working on it.
                        log.warning("run %s was ended by another process; stopping it here", run.run_id)
                        if run.scope is not None:
                            run.scope.cancel()
                except RlmMcpError as exc:  # the database is restarting: the next event retries
                    log.info("could not publish run %s: %s", run.run_id, exc)
                    seen, phase = -1, None
                    await anyio.sleep(RETRY_S)
                    continue
            elif run_log.staged:  # events between progress events (a long cell's `cell_start`)
                try:
                    await run_log.flush()
                except RlmMcpError as exc:
                    log.info("could not write the events of run %s: %s", run.run_id, exc)
            await run.wait_change(self._settings.queue_poll_s, since=seen)
