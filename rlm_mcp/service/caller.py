"""The service as one owner sees it: every tool-level operation, with its owner bound once.

`RlmService` is the process's side (its parts, their lifecycle, the engine, the owner-free
helpers); `Caller(service, owner)` is the API one owner sees: loading and uploading contexts,
starting, following and cancelling runs, kept sessions. The owner is given once, when the
`Caller` is made, and every store and run-backend call below passes it, so no operation can
forget it or take another's. The server makes one `Caller` per MCP request from the owner the
HTTP guard recorded (the local user over stdio); the CLI, eval and the benchmarks make one for
`LOCAL_OWNER`. Nothing in the server layer passes an owner by hand.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Literal, cast

import anyio

from rlm_mcp.engine import RunResult
from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.events import LoggedEvent
from rlm_mcp.observability import tracing
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.ports.runs import RunRecord, RunRequest
from rlm_mcp.service.active_run import ActiveRun, wait_with_heartbeat
from rlm_mcp.service.arguments import check_text, check_texts, unique_ids
from rlm_mcp.service.context_holders import held_by_idle_session
from rlm_mcp.service.limits import RESULT_WAIT_MAX_S, RunOverrides
from rlm_mcp.service.progress import ProgressValues, describe
from rlm_mcp.service.runs import RunManager
from rlm_mcp.service.service import RlmService
from rlm_mcp.service.views import RunSnapshot, with_session_usage
from rlm_mcp.store import ContextInfo, UploadState

if TYPE_CHECKING:
    from rlm_mcp.service.queue.front import QueueFront  # team mode only: it needs the team extra

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
        except BadArgumentError as refused:  # pinned: by an idle kept session, say so (not "a running run")
            raise (await held_by_idle_session(self.service, context_id, self.owner)) or refused from None

    # --- runs ------------------------------------------------------------------------------

    async def start_run(
        self,
        query: str,
        context_id: str | Sequence[str] | None,
        overrides: RunOverrides,
        *,
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
        runs = self.service.runs
        # Team mode: the session is in the database (service/team_sessions.py), for any replica.
        team = self.service.team_sessions if not runs.local else None
        if team is not None and session_id:
            await team.find(session_id, owner=self.owner, free=True)  # unknown, ended or busy: said first
        session = (
            await self.service.sessions.find(session_id, owner=self.owner) if session_id and team is None else None
        )
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
            self.service.sessions.check_idle(session)
        engine = await self.service.engine() if runs.local else None
        infos = [await self.service.contexts.get(cid, owner=self.owner) for cid in ids]
        specs = [self.service.contexts.spec(i) for i in infos]
        self.service.sandboxes.check_fits([*(session.repl.contexts if session is not None else []), *specs])
        if runs.local:  # a team-mode front runs nothing: its workers check their own Docker
            await self.service.sandboxes.ensure_ready()
            if keep_session or session is not None:
                await self.service.sandboxes.check_snapshots()  # an image without dill cannot keep one
        await self.service.check_lm()
        if session is None and keep_session and team is None:
            session = self.service.sessions.open(self.owner)
        request = RunRequest(
            query=query,
            context_ids=ids,
            limits=overrides.limits(self.service.settings),
            owner=self.owner,
            model=self.service.settings.model,
            session_id=session.session_id if session is not None else (session_id or None) if team else None,
            trace_context=tracing.carrier(),  # the MCP call's span: the run's span is its child anywhere
        )
        if team is not None and (keep_session or session_id):
            return await team.start(cast("QueueFront", runs), request)
        if session is None:
            return await runs.start(request, engine)
        assert isinstance(runs, RunManager)
        return await self.service.start_in_session(runs, request, engine, session)

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
    ) -> tuple[RunResult, str | None]:
        """Start a run and wait for its result (and its session id, for a kept session),
        reporting progress. The one place a run's failure picks its channel: one that never
        started raises (a tool error), any other is the structured result."""
        run = await self.start_run(query, context_id, overrides, keep_session=keep_session, session_id=session_id)
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
                    await self.service.runs.cancel(run.run_id)
        if run.not_started is not None:
            raise run.not_started
        return result, run.request.session_id

    # --- kept sessions ---------------------------------------------------------------------

    async def list_sessions(self) -> list[dict[str, object]]:
        """Live sessions, then those stored in the data dir (taken back on their next follow-up);
        in team mode, the open sessions in the database. Each with the usage of its runs."""
        return [await self._with_usage(d) for d in await self.service.sessions_of(self.owner)]

    async def session(self, session_id: str) -> dict[str, object]:
        check_text("session_id", session_id)
        if self.service.team_sessions is not None:
            described = await self.service.team_sessions.describe(session_id, owner=self.owner)
        else:
            described = (await self.service.sessions.find(session_id, owner=self.owner)).describe()
        return await self._with_usage(described)

    async def close_session(self, session_id: str) -> dict[str, object]:
        check_text("session_id", session_id)
        if self.service.team_sessions is not None:
            described = await self.service.team_sessions.close(session_id, owner=self.owner)
        else:
            described = (await self.service.sessions.close(session_id, owner=self.owner)).describe()
        return await self._with_usage(described)

    async def _with_usage(self, described: dict[str, object]) -> dict[str, object]:
        return await with_session_usage(described, self.run_record)

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
