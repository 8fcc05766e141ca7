"""The service as one owner sees it: every tool-level operation, with its owner bound once.

`RlmService` is the process's side (its parts, their lifecycle, the engine, the owner-free
helpers); `Caller(service, owner)` is the API one owner sees: loading and uploading contexts,
starting, following and cancelling runs, kept sessions. The owner is given once, when the
`Caller` is made, and every store and run-backend call below passes it, so no operation can
forget it or take another's. The server makes one `Caller` per MCP request from the owner the
HTTP guard recorded (the local user over stdio); the CLI, eval and the benchmarks make one for
`LOCAL_OWNER`. Nothing in the server layer passes an owner by hand.

Runs go through the service's run backend and kept sessions through its session backend
(`ports/sessions.py`), whichever the assembly chose for this role: nothing here asks which.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import anyio

from rlm_mcp.engine import RunResult
from rlm_mcp.errors import BadArgumentError, ContextTooLargeError, NotFoundError
from rlm_mcp.events import LoggedEvent
from rlm_mcp.observability import tracing
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.ports.runs import RunRecord, RunRequest
from rlm_mcp.ports.sessions import SessionView
from rlm_mcp.service.active_run import ActiveRun, wait_with_heartbeat
from rlm_mcp.service.arguments import check_query, check_text, check_texts, checked_context_ids
from rlm_mcp.service.context_holders import held_by_idle_session
from rlm_mcp.service.limits import RESULT_WAIT_MAX_S, RunOverrides
from rlm_mcp.service.progress import ProgressValues, describe
from rlm_mcp.service.service import RlmService
from rlm_mcp.service.views import RunSnapshot, with_session_usage
from rlm_mcp.store import ContextInfo, UploadState

ProgressReport = Callable[[float, float | None, str], Awaitable[None]]
# How an upload chunk's `data` string is encoded on the wire.
ChunkEncoding = Literal["text", "base64"]


class Caller:
    """`service` as `owner` sees it. Cheap to make (two references): one per request."""

    def __init__(self, service: RlmService, owner: Owner) -> None:
        self.service = service
        self.owner = owner

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
    ) -> ContextInfo:
        check_text("text", text, nul_ok=True)  # a body: stored as bytes
        for argument, value in (("path", path), ("glob", glob), ("url", url), ("name", name)):
            check_text(argument, value)
        check_texts("include", include)
        check_texts("exclude", exclude)
        with self._context_limit_named():
            return await self.service.loader.load(
                text=text,
                path=path,
                glob=glob,
                url=url,
                name=name,
                format=format,
                include=include,
                exclude=exclude,
                owner=self.owner,
            )

    @contextmanager
    def _context_limit_named(self) -> Iterator[None]:
        """A context over the limit names the setting to change: RLM_MCP_SANDBOX_MEMORY when the
        limit follows it (the default), else RLM_MCP_MAX_CONTEXT_BYTES."""
        try:
            yield
        except ContextTooLargeError as exc:
            settings = self.service.settings
            if not settings.context_limit_follows_memory:
                raise
            raise exc.following_memory(settings.sandbox_memory) from None

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
        with self._context_limit_named():
            return await self.service.uploads.put_chunk(
                data=raw,
                index=index,
                upload_id=upload_id,
                final=final,
                sha256=sha256,
                name=name,
                format=format,
                owner=self.owner,
            )

    async def list_contexts(self) -> list[ContextInfo]:
        return await self.service.contexts.list(owner=self.owner)

    async def context(self, context_id: str) -> ContextInfo:
        check_text("context_id", context_id)
        return await self.service.contexts.get(context_id, owner=self.owner)

    async def delete_context(self, context_id: str) -> bool:
        check_text("context_id", context_id)
        await self.service.contexts.get(context_id, owner=self.owner)  # NotFoundError with the fix for unknown ids
        try:
            return await self.service.contexts.delete(context_id, owner=self.owner)
        except BadArgumentError as refused:
            pinned = refused
        # A run that has just answered lets go of its contexts a moment later: not "a running run".
        if await self.service.runs.let_go(context_id, owner=self.owner):
            try:
                return await self.service.contexts.delete(context_id, owner=self.owner)
            except BadArgumentError as refused:
                pinned = refused
        # Pinned by an idle kept session: say so (not "a running run").
        raise (await held_by_idle_session(self.service, context_id, self.owner)) or pinned

    # --- runs ------------------------------------------------------------------------------

    async def start_run(
        self,
        query: str,
        context_id: str | Sequence[str] | None,
        overrides: RunOverrides,
        *,
        keep_session: bool = False,
        session_id: str | None = None,
        webhook_url: str | None = None,
    ) -> ActiveRun:
        """What can be checked before a run is accepted fails here, as an RlmMcpError; what
        fails later but before the run started is the run's `not_started`.

        `keep_session`: the run opens a kept session (its REPL stays for follow-ups); `session_id`:
        the run continues that session (its context ids, if any, become the next context_i);
        `webhook_url`: where the run's end is delivered (on the owner's allow-list)."""
        check_query(query)
        check_text("session_id", session_id)
        if webhook_url:
            check_text("webhook_url", webhook_url)
            self.service.webhooks.check(self.owner, webhook_url)
        ids = checked_context_ids(context_id)
        service, sessions = self.service, self.service.sessions
        follow_up = await sessions.find(session_id, owner=self.owner) if session_id else None  # why not, first
        if not ids and follow_up is None:
            raise BadArgumentError(
                "No context id given.", "Load a context with rlm_load_context and pass its context_id."
            )
        engine = await service.engine_for_runs()
        infos = await service.run_contexts(ids, owner=self.owner)
        specs = [service.contexts.spec(i) for i in infos]
        service.sandboxes.check_fits([*(follow_up.bound if follow_up is not None else ()), *specs])
        await service.check_ready_to_run()
        kept = keep_session or follow_up is not None
        if kept:
            await sessions.check_can_keep()
        await service.check_lm()
        request = RunRequest(
            query=query,
            context_ids=ids,
            limits=overrides.limits(service.settings.loop),
            owner=self.owner,
            model=service.settings.model,
            session_id=follow_up.session_id if follow_up is not None else None,  # a new one: its backend names it
            trace_context=tracing.carrier(),  # the MCP call's span: the run's span is its child anywhere
            webhook_url=webhook_url or None,
        )
        if kept:  # claimed there: a session ended since `find` is refused, saying why
            return await sessions.start(request, engine)
        return await service.runs.start(request, engine, contexts=specs)

    async def complete(
        self,
        query: str,
        context_id: str | Sequence[str],
        overrides: RunOverrides,
        report: ProgressReport,
    ) -> RunResult:
        """`complete_in_session` without a session: the run's result."""
        result, _ = await self.complete_in_session(query, context_id, overrides, report)
        return result

    async def complete_in_session(
        self,
        query: str,
        context_id: str | Sequence[str] | None,
        overrides: RunOverrides,
        report: ProgressReport,
        *,
        keep_session: bool = False,
        session_id: str | None = None,
        webhook_url: str | None = None,
        follow_progress: bool = True,
    ) -> tuple[RunResult, str | None]:
        """Start a run and wait for its result (and its session id, for a kept session),
        reporting progress. The one place a run's failure picks its channel: one that never
        started raises (a tool error), any other is the structured result. `follow_progress`:
        the caller sees the progress (an MCP progress token), said through `follow_progress`."""
        run = await self.start_run(
            query, context_id, overrides, keep_session=keep_session, session_id=session_id, webhook_url=webhook_url
        )
        values = ProgressValues()  # MCP: each progress value must exceed the previous one
        try:
            # Inside the `try`: a caller gone meanwhile still cancels the run. A run already over
            # (a fast one, while its start waited for its record) has no progress left to follow.
            if follow_progress and not run.done.is_set():
                await self.service.runs.follow_progress(run.run_id)
            named = 0  # the last turn a notification has named

            async def name_turns(upto: int) -> None:
                """Every turn is named once (docs/long-runs.md), even one that began and ended
                while the previous notification was being sent, or before the run's end woke
                the waiter: its details are gone by now, its number is not."""
                nonlocal named
                most = run.progress.max_iterations
                for missed in range(named + 1, upto + 1):
                    await report(values.next(missed), float(most), f"turn {missed}/{most}")
                named = max(named, upto)

            async def on_progress(event: str | None) -> None:
                nonlocal named
                p = run.progress
                turn = min(p.iterations, p.max_iterations)
                await name_turns(turn - 1)
                named = max(named, turn)
                await report(values.next(p.iterations), float(p.max_iterations), describe(p))

            await report(values.next(0), float(run.progress.max_iterations), f"run {run.run_id} started")
            result = await wait_with_heartbeat(run, on_progress)
            await name_turns(min(run.progress.iterations, run.progress.max_iterations))
        finally:
            # The caller went away (cancel, timeout): the run must not outlive its call.
            if not run.done.is_set():
                with anyio.CancelScope(shield=True):
                    await self.service.runs.cancel(run.run_id)
        if run.not_started is not None:
            raise run.not_started
        return result, run.request.session_id

    # --- kept sessions ---------------------------------------------------------------------

    async def list_sessions(self) -> list[dict[str, object]]:
        """Live sessions, then those stored in the data dir (taken back on their next follow-up);
        in team mode, the open sessions in the database. Each with the usage of its runs."""
        return [await self._with_usage(v) for v in await self.service.sessions_of(self.owner)]

    async def session(self, session_id: str) -> dict[str, object]:
        check_text("session_id", session_id)
        return await self._with_usage(await self.service.sessions.describe(session_id, owner=self.owner))

    async def close_session(self, session_id: str) -> dict[str, object]:
        check_text("session_id", session_id)
        return await self._with_usage(await self.service.sessions.close(session_id, owner=self.owner))

    async def _with_usage(self, view: SessionView) -> dict[str, object]:
        return await with_session_usage(view.to_dict(), self.run_record)

    async def status(self, run_id: str) -> RunSnapshot:
        check_text("run_id", run_id)
        run = await self.service.runs.find(run_id, owner=self.owner)
        if run is not None:
            return run.snapshot()
        record = await self.service.records.read_summary(run_id, owner=self.owner)  # NotFoundError for unknown ids
        return RunSnapshot.from_record(record)

    async def result(self, run_id: str, wait_s: float = 0.0) -> RunResult | RunSnapshot:
        """The result when the run has ended (waiting up to `wait_s`), else its status."""
        check_text("run_id", run_id)
        run = await self.service.runs.find(run_id, owner=self.owner)
        if run is not None:
            if wait_s > 0:
                with anyio.move_on_after(min(wait_s, RESULT_WAIT_MAX_S)):
                    await run.done.wait()
            return run.result if run.result is not None else run.snapshot()
        record = await self.service.records.read_summary(run_id, owner=self.owner)
        return record.result if record.result is not None else RunSnapshot.from_record(record)

    async def cancel(self, run_id: str) -> RunSnapshot:
        check_text("run_id", run_id)
        run = await self.service.runs.find(run_id, owner=self.owner)
        if run is None:
            # Finished long ago, or by another server: cancelling an ended run changes nothing.
            return await self.status(run_id)  # unknown id -> NotFoundError
        if run.result is None:
            await self.service.runs.cancel(run_id)
        return run.snapshot()

    async def run_record(self, run_id: str) -> RunRecord:
        """The run's record, with the live state while it runs."""
        check_text("run_id", run_id)
        record = await self.service.records.read_summary(run_id, owner=self.owner)  # NotFoundError for unknown ids
        run = await self.service.runs.find(run_id, owner=self.owner)
        if run is not None and not run.done.is_set():
            return record.with_live(run.record().live())
        return record

    async def run_events(self, run_id: str) -> list[LoggedEvent]:
        check_text("run_id", run_id)
        return await self.service.records.read_events(run_id, owner=self.owner)

    async def full_answer(self, run_id: str) -> str:
        check_text("run_id", run_id)
        run = await self.service.runs.find(run_id, owner=self.owner)
        result = run.result if run is not None else None
        if result is None:
            result = (await self.service.records.read_summary(run_id, owner=self.owner)).result
            if result is None:
                raise NotFoundError(f"Run {run_id} has no answer yet.", "Wait for it with rlm_result.")
        return result.answer or ""
