"""What each tool call means, independent of MCP: the one object the server layer talks to.

It owns the long-lived parts (stores, LM client, sandbox manager, sessions, runs), which the
assembly (rlm_mcp/assembly/) builds for this process's role and passes in, and connects to
Docker and the LM endpoint lazily, so the MCP handshake never waits for either.

Every call that touches a context or a run takes the caller's `owner` (rlm_mcp.owners), a
required keyword with no default: another owner's context or run is "unknown". The server binds
the owner of each MCP request once, through `service.caller.Caller` (which imports this module,
never the reverse); the CLI passes `LOCAL_OWNER`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Literal

import anyio

from rlm_mcp.config import Settings, Transport
from rlm_mcp.engine import RLMEngine, RunResult
from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.events import LoggedEvent
from rlm_mcp.observability import tracing
from rlm_mcp.owners import Owner, OwnerScope
from rlm_mcp.ports import ContextFormat
from rlm_mcp.ports.runs import RunRecord, RunRequest
from rlm_mcp.service.arguments import check_text, check_texts
from rlm_mcp.service.backends import RunBackend
from rlm_mcp.service.limits import RESULT_WAIT_MAX_S, RunOverrides
from rlm_mcp.service.parts import ServiceParts
from rlm_mcp.service.profile import choose_profile
from rlm_mcp.service.progress import ProgressValues, describe
from rlm_mcp.service.queue.front import QueueFront
from rlm_mcp.service.runs import ActiveRun, RunManager, unique_ids, wait_with_heartbeat
from rlm_mcp.service.sessions import SAVING, KeptSession
from rlm_mcp.service.views import RunSnapshot, with_session_usage
from rlm_mcp.store import ContextInfo, UploadState

logger = logging.getLogger("rlm_mcp.service")

ProgressReport = Callable[[float, float | None, str], Awaitable[None]]
Mode = Transport  # which transport this service answers (the owner rules differ)
# How an upload chunk's `data` string is encoded on the wire.
ChunkEncoding = Literal["text", "base64"]
_LM_CHECK_TTL_S = 60.0


class RlmService:
    def __init__(self, settings: Settings, parts: ServiceParts, *, mode: Mode = "stdio") -> None:
        """`parts`: the stores, LM client, sandboxes, sessions and run backend this process's role
        uses, built by the assembly (`rlm_mcp.assembly.build_service`); the service closes them."""
        self.settings = settings
        self.mode = mode
        self.stores = parts.stores
        self.contexts = self.stores.contexts
        self.uploads = self.stores.uploads
        self.records = self.stores.runs
        self.lm = parts.lm
        self.sandboxes = parts.sandboxes
        self.loader = parts.loader
        self._engine: RLMEngine | None = None
        self._engine_lock = anyio.Lock(fast_acquire=True)
        self._lm_checked_at = float("-inf")
        self._runs: RunBackend | None = None
        self._open_runs = parts.open_runs
        self.sessions = parts.sessions
        self.team_sessions = parts.team_sessions  # team mode: sessions in the database
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> RlmService:
        await self._stack.__aenter__()
        try:
            await self._stack.enter_async_context(self.stores)  # closed last: runs record into it
            await self._stack.enter_async_context(self.sandboxes)
            self._runs = await self._open_runs(self._stack, self.engine)
            # Closed before the runs: a session's REPL goes back to the sandboxes it came from.
            await self._stack.enter_async_context(self.sessions)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        # No enclosing shield here: the stack holds task groups, whose scopes must unwind in
        # order. Each part shields its own cleanup (runs record `cancelled`, sandboxes are removed).
        try:
            await self._stack.aclose()  # runs first, then sandboxes
        finally:
            with anyio.CancelScope(shield=True):
                await self.lm.aclose()

    async def engine(self) -> RLMEngine:
        # Built at the first run, not at start-up: choosing the profile may spawn a subprocess
        # (and fetch the reference once), and a bad profile should be a clear tool error.
        async with self._engine_lock:
            if self._engine is None:
                choice = await anyio.to_thread.run_sync(choose_profile, self.settings)
                if choice.fix:
                    logger.warning("prompt profile %s (%s). %s", choice.profile.name, choice.detail, choice.fix)
                else:
                    logger.info("prompt profile %s (%s)", choice.profile.name, choice.detail)
                self._engine = RLMEngine(self.settings, self.lm, self.sandboxes.open, profile=choice.profile)
        return self._engine

    @property
    def runs(self) -> RunBackend:
        if self._runs is None:
            raise RuntimeError("RlmService used outside `async with`")
        return self._runs

    # --- contexts --------------------------------------------------------------------------

    async def load_context(
        self,
        *,
        text: str | None = None,
        path: str | None = None,
        glob: str | None = None,
        url: str | None = None,
        name: str | None = None,
        format: ContextFormat = "text",
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        owner: Owner,
    ) -> ContextInfo:
        check_text("text", text, nul_ok=True)  # a body: stored as bytes
        for argument, value in (("path", path), ("glob", glob), ("url", url), ("name", name)):
            check_text(argument, value)
        check_texts("include", include)
        check_texts("exclude", exclude)
        return await self.loader.load(
            text=text,
            path=path,
            glob=glob,
            url=url,
            name=name,
            format=format,
            include=include,
            exclude=exclude,
            owner=owner,
        )

    async def upload_chunk(
        self,
        *,
        data: str,
        index: int,
        upload_id: str | None,
        final: bool,
        encoding: ChunkEncoding,
        sha256: str | None,
        name: str | None,
        format: ContextFormat | None,
        owner: Owner,
    ) -> UploadState:
        for argument, value in (("upload_id", upload_id), ("name", name), ("sha256", sha256)):
            check_text(argument, value)
        if encoding == "base64":
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise BadArgumentError(
                    f"Chunk {index} is not valid base64 ({exc}).", "Send standard base64, or encoding='text'."
                ) from exc
        else:
            check_text("data", data, nul_ok=True)  # a body: stored as bytes
            raw = data.encode("utf-8")
        return await self.uploads.put_chunk(
            data=raw,
            index=index,
            upload_id=upload_id,
            final=final,
            sha256=sha256,
            name=name,
            format=format,
            owner=owner,
        )

    async def list_contexts(self, *, owner: Owner) -> list[ContextInfo]:
        return await self.contexts.list(owner=owner)

    async def context(self, context_id: str, *, owner: Owner) -> ContextInfo:
        check_text("context_id", context_id)
        return await self.contexts.get(context_id, owner=owner)

    async def delete_context(self, context_id: str, *, owner: Owner) -> bool:
        check_text("context_id", context_id)
        await self.contexts.get(context_id, owner=owner)  # NotFoundError with the fix for unknown ids
        return await self.contexts.delete(context_id, owner=owner)

    # --- runs ------------------------------------------------------------------------------

    async def start_run(
        self,
        query: str,
        context_id: str | Sequence[str] | None,
        overrides: RunOverrides,
        *,
        owner: Owner,
        keep_session: bool = False,
        session_id: str | None = None,
    ) -> ActiveRun:
        """What can be checked before a run is accepted fails here, as an RlmMcpError; what
        fails later but before the run started is the run's `not_started`.

        `keep_session`: the run opens a kept session (its REPL stays for follow-ups); `session_id`:
        the run continues that session (its context ids, if any, become the next context_i)."""
        if not isinstance(query, str) or not query.strip():
            raise BadArgumentError("The query is empty.", "Pass the question to answer about the context as `query`.")
        check_text("query", query)
        check_text("session_id", session_id)
        if isinstance(context_id, str):
            check_text("context_id", context_id)
        elif context_id is not None:
            check_texts("context_id", context_id)
        ids = unique_ids(context_id or [])
        runs = self.runs
        # Team mode: the session is in the database (service/team_sessions.py), for any replica.
        team = self.team_sessions if isinstance(runs, QueueFront) else None
        if team is not None and session_id:
            await team.find(session_id, owner=owner, free=True)  # unknown, ended or busy: said first
        session = await self.sessions.find(session_id, owner=owner) if session_id and team is None else None
        if not ids and session is None and not (team is not None and session_id):
            raise BadArgumentError(
                "No context id given.", "Load a context with rlm_load_context and pass its context_id."
            )
        if (keep_session or session_id) and not isinstance(runs, RunManager) and team is None:
            raise BadArgumentError(
                "Kept sessions need the run backend of this server, which has none for them.",
                "Ask without keep_session/session_id: each run then starts from a fresh sandbox.",
            )
        if session is not None:
            self.sessions.check_idle(session)
        engine = await self.engine() if runs.local else None
        infos = [await self.contexts.get(cid, owner=owner) for cid in ids]
        specs = [self.contexts.spec(i) for i in infos]
        self.sandboxes.check_fits([*(session.repl.contexts if session is not None else []), *specs])
        if runs.local:  # a team-mode front runs nothing: its workers check their own Docker
            await self.sandboxes.ensure_ready()
            if keep_session or session is not None:
                await self.sandboxes.check_snapshots()  # an image without dill cannot keep one
        await self._check_lm()
        if session is None and keep_session and team is None:
            session = self.sessions.open(owner)
        request = RunRequest(
            query=query,
            context_ids=ids,
            limits=overrides.limits(self.settings),
            owner=owner,
            model=self.settings.model,
            session_id=session.session_id if session is not None else (session_id or None) if team else None,
            trace_context=tracing.carrier(),  # the MCP call's span: the run's span is its child anywhere
        )
        if team is not None and (keep_session or session_id):
            assert isinstance(runs, QueueFront)
            return await team.start(runs, request)
        if session is None:
            return await runs.start(request, engine)
        assert isinstance(runs, RunManager)
        return await self._start_in_session(runs, request, engine, session)

    async def _start_in_session(
        self, runs: RunManager, request: RunRequest, engine: RLMEngine | None, session: KeptSession
    ) -> ActiveRun:
        """Start a kept session's run: one at a time per session, its contexts pinned for the
        session's life, the session told when the run has ended."""
        self.sessions.claim(session, "starting")  # no await since check_idle: two follow-ups cannot both pass
        run: ActiveRun | None = None
        try:
            await self.sessions.pin(session, request.context_ids)

            async def ended(done: ActiveRun) -> None:
                usage = done.result.usage if done.result is not None else None
                await self.sessions.finished(session, done.run_id, started=done.not_started is None, usage=usage)

            run = await runs.start(request, engine, repl=session.repl, on_end=ended)
            if session.running == "starting":
                session.running = run.run_id
            return run
        finally:
            if run is None:
                await self.sessions.finished(session, "starting", started=False)

    async def complete(
        self,
        query: str,
        context_id: str | Sequence[str],
        overrides: RunOverrides,
        report: ProgressReport,
        *,
        owner: Owner,
    ) -> RunResult:
        """`complete_in_session` without a session: the run's result."""
        result, _ = await self.complete_in_session(query, context_id, overrides, report, owner=owner)
        return result

    async def complete_in_session(
        self,
        query: str,
        context_id: str | Sequence[str] | None,
        overrides: RunOverrides,
        report: ProgressReport,
        *,
        owner: Owner,
        keep_session: bool = False,
        session_id: str | None = None,
    ) -> tuple[RunResult, str | None]:
        """Start a run and wait for its result (and its session id, for a kept session),
        reporting progress. The one place a run's failure picks its channel: one that never
        started raises (a tool error), any other is the structured result."""
        run = await self.start_run(
            query, context_id, overrides, owner=owner, keep_session=keep_session, session_id=session_id
        )
        values = ProgressValues()  # MCP: each progress value must exceed the previous one
        try:

            async def on_progress(event: str | None) -> None:
                p = run.progress
                await report(values.next(p.iterations), float(p.max_iterations), describe(p))

            await report(values.next(0), float(run.progress.max_iterations), f"run {run.run_id} started")
            result = await wait_with_heartbeat(run, on_progress)
        finally:
            # The caller went away (cancel, timeout): the run must not outlive its call.
            if not run.done.is_set():
                with anyio.CancelScope(shield=True):
                    await self.runs.cancel(run.run_id)
        if run.not_started is not None:
            raise run.not_started
        return result, run.request.session_id

    # --- kept sessions ---------------------------------------------------------------------

    async def list_sessions(self, *, owner: OwnerScope) -> list[dict[str, object]]:
        """Live sessions, then those stored in the data dir (taken back on their next follow-up);
        in team mode, the open sessions in the database. Each with the usage of its runs."""
        return [await self._with_usage(d, owner) for d in await self._sessions_of(owner)]

    async def _sessions_of(self, owner: OwnerScope) -> list[dict[str, object]]:
        if self.team_sessions is not None:
            return await self.team_sessions.list(owner=owner)
        return [s.describe() for s in self.sessions.list(owner=owner)] + await self.sessions.stored(owner=owner)

    async def session(self, session_id: str, *, owner: Owner) -> dict[str, object]:
        check_text("session_id", session_id)
        if self.team_sessions is not None:
            described = await self.team_sessions.describe(session_id, owner=owner)
        else:
            described = (await self.sessions.find(session_id, owner=owner)).describe()
        return await self._with_usage(described, owner)

    async def close_session(self, session_id: str, *, owner: Owner) -> dict[str, object]:
        check_text("session_id", session_id)
        if self.team_sessions is not None:
            described = await self.team_sessions.close(session_id, owner=owner)
        else:
            described = (await self.sessions.close(session_id, owner=owner)).describe()
        return await self._with_usage(described, owner)

    async def session_state(self, session_id: str, *, owner: OwnerScope) -> dict[str, object] | None:
        """What the viewer shows of a session beside its runs: `state` (running, saving, live,
        stored, ended) and its size and age, read without taking back a stored session; None when this
        process knows nothing of it. The caller has checked that `owner` sees the session's runs
        (why an ended session ended is kept without a way to ask whose it was)."""
        for described in await self._sessions_of(owner):  # the viewer sums the usage from the records it reads
            if described.get("session_id") == session_id:
                running = described.get("running")
                state = "saving" if running == SAVING else "running" if running else "live"
                state = "stored" if described.get("stored") else state
                return {**described, "state": state}
        why = self.sessions.why_ended(session_id)
        return {"session_id": session_id, "state": "ended", "why": why} if why is not None else None

    async def _with_usage(self, described: dict[str, object], owner: OwnerScope) -> dict[str, object]:
        return await with_session_usage(described, lambda run_id: self.run_record(run_id, owner=owner))

    async def status(self, run_id: str, *, owner: Owner) -> RunSnapshot:
        check_text("run_id", run_id)
        run = await self.runs.find(run_id, owner=owner)
        if run is not None:
            return run.snapshot()
        record = await self.records.read_summary(run_id, owner=owner)  # NotFoundError for unknown ids
        return RunSnapshot.from_record(record)

    async def result(self, run_id: str, wait_s: float = 0.0, *, owner: Owner) -> RunResult | RunSnapshot:
        """The result when the run has ended (waiting up to `wait_s`), else its status."""
        check_text("run_id", run_id)
        run = await self.runs.find(run_id, owner=owner)
        if run is not None:
            if wait_s > 0:
                with anyio.move_on_after(min(wait_s, RESULT_WAIT_MAX_S)):
                    await run.done.wait()
            return run.result if run.result is not None else run.snapshot()
        record = await self.records.read_summary(run_id, owner=owner)
        return record.result if record.result is not None else RunSnapshot.from_record(record)

    async def cancel(self, run_id: str, *, owner: Owner) -> RunSnapshot:
        check_text("run_id", run_id)
        run = await self.runs.find(run_id, owner=owner)
        if run is None:
            # Finished long ago, or by another server: cancelling an ended run changes nothing.
            return await self.status(run_id, owner=owner)  # unknown id -> NotFoundError
        if run.result is None:
            await self.runs.cancel(run_id)
        return run.snapshot()

    async def run_record(self, run_id: str, *, owner: OwnerScope) -> RunRecord:
        """The run's record, with the live state while it runs."""
        check_text("run_id", run_id)
        record = await self.records.read_summary(run_id, owner=owner)  # NotFoundError for unknown ids
        run = await self.runs.find(run_id, owner=owner)
        if run is not None and not run.done.is_set():
            return record.with_live(run.record().live())
        return record

    async def run_events(self, run_id: str, *, owner: Owner) -> list[LoggedEvent]:
        check_text("run_id", run_id)
        return await self.records.read_events(run_id, owner=owner)

    async def full_answer(self, run_id: str, *, owner: Owner) -> str:
        check_text("run_id", run_id)
        run = await self.runs.find(run_id, owner=owner)
        result = run.result if run is not None else None
        if result is None:
            result = (await self.records.read_summary(run_id, owner=owner)).result
            if result is None:
                raise NotFoundError(f"Run {run_id} has no answer yet.", "Wait for it with rlm_result.")
        return result.answer or ""

    async def _check_lm(self) -> None:
        """Fail before the run when the endpoint is down or lacks the model (cached briefly)."""
        now = time.monotonic()
        if now - self._lm_checked_at < _LM_CHECK_TTL_S:
            return
        await self.lm.check_model()
        self._lm_checked_at = now
