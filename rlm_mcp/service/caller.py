"""`RlmService` as one owner sees it.

The server builds one `Caller` per MCP request from the owner the HTTP guard recorded (the
local user over stdio), so every tool and resource reaches contexts and runs through exactly
one place that names the owner; nothing in the server layer passes an owner by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlm_mcp.engine import RunResult
from rlm_mcp.events import LoggedEvent
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.service.service import ChunkEncoding, ProgressReport, RlmService
from rlm_mcp.service.views import RunSnapshot
from rlm_mcp.store import ContextInfo, UploadState

if TYPE_CHECKING:
    from rlm_mcp.service.runs import ActiveRun


class Caller:
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
        return await self.service.load_context(
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
        return await self.service.upload_chunk(
            data=data,
            index=index,
            upload_id=upload_id,
            final=final,
            encoding=encoding,
            sha256=sha256,
            name=name,
            format=format,
            owner=self.owner,
        )

    async def list_contexts(self) -> list[ContextInfo]:
        return await self.service.list_contexts(owner=self.owner)

    async def context(self, context_id: str) -> ContextInfo:
        return await self.service.context(context_id, owner=self.owner)

    async def delete_context(self, context_id: str) -> bool:
        return await self.service.delete_context(context_id, owner=self.owner)

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
        return await self.service.start_run(
            query, context_id, overrides, owner=self.owner, keep_session=keep_session, session_id=session_id
        )

    async def complete(
        self, query: str, context_id: str | Sequence[str], overrides: RunOverrides, report: ProgressReport
    ) -> RunResult:
        return await self.service.complete(query, context_id, overrides, report, owner=self.owner)

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
        return await self.service.complete_in_session(
            query, context_id, overrides, report, owner=self.owner, keep_session=keep_session, session_id=session_id
        )

    # --- kept sessions ---------------------------------------------------------------------
    async def list_sessions(self) -> list[dict[str, object]]:
        return await self.service.list_sessions(owner=self.owner)

    async def session(self, session_id: str) -> dict[str, object]:
        return await self.service.session(session_id, owner=self.owner)

    async def close_session(self, session_id: str) -> dict[str, object]:
        return await self.service.close_session(session_id, owner=self.owner)

    async def status(self, run_id: str) -> RunSnapshot:
        return await self.service.status(run_id, owner=self.owner)

    async def result(self, run_id: str, wait_s: float = 0.0) -> RunResult | RunSnapshot:
        return await self.service.result(run_id, wait_s, owner=self.owner)

    async def cancel(self, run_id: str) -> RunSnapshot:
        return await self.service.cancel(run_id, owner=self.owner)

    async def run_record(self, run_id: str) -> RunRecord:
        return await self.service.run_record(run_id, owner=self.owner)

    async def run_events(self, run_id: str) -> list[LoggedEvent]:
        return await self.service.run_events(run_id, owner=self.owner)

    async def full_answer(self, run_id: str) -> str:
        return await self.service.full_answer(run_id, owner=self.owner)
