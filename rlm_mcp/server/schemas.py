"""Structured tool results: these field names are the contract clients rely on (docs/tools.md, "Tools and resources")."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rlm_mcp.engine import RunResult
from rlm_mcp.service.views import RunSnapshot
from rlm_mcp.store import ContextInfo, UploadState


class ContextHandle(BaseModel):
    context_id: str
    name: str
    bytes: int
    sha256: str
    format: str
    kind: str = Field(description="Python type of `context` in the sandbox: str, list or dict.")
    chars: int
    source: dict[str, Any] = Field(
        default_factory=dict, description="Where it came from; for folders, what was taken and skipped."
    )

    @classmethod
    def of(cls, info: ContextInfo) -> ContextHandle:
        return cls.model_validate(info.model_dump())  # the public subset of the stored fields


class ContextList(BaseModel):
    contexts: list[ContextHandle]


class Deleted(BaseModel):
    context_id: str
    deleted: bool


class UploadProgress(BaseModel):
    upload_id: str
    next_index: int = Field(description="The index of the chunk to send next.")
    bytes_received: int
    done: bool
    context: ContextHandle | None = Field(None, description="The stored context, once the final chunk arrived.")

    @classmethod
    def of(cls, state: UploadState) -> UploadProgress:
        return cls(
            upload_id=state.upload_id,
            next_index=state.next_index,
            bytes_received=state.bytes_received,
            done=state.done,
            context=ContextHandle.of(state.context) if state.context is not None else None,
        )


class RunOutcome(BaseModel):
    """The structured result of a run (docs/tools.md, "The answer"), or its status while it runs."""

    status: str = Field(
        description="queued | running | completed | max_iterations | timeout | budget_exceeded | error | cancelled"
    )
    run_id: str
    answer: str | None = None
    reason: str | None = None
    iterations: int = 0
    sub_calls: int = 0
    usage: dict[str, Any] = Field(default_factory=dict)
    duration_s: float | None = None
    answer_chars: int = 0
    answer_truncated: bool = False
    answer_resource: str | None = Field(default=None, description="The full answer, when it was cut here.")
    session_id: str | None = Field(
        default=None, description="The kept session this run belongs to: pass it to ask a follow-up."
    )

    @classmethod
    def pending(cls, snapshot: RunSnapshot) -> RunOutcome:
        """A run that has not ended yet: its status, no answer."""
        return cls(
            status=snapshot.status,
            run_id=snapshot.run_id,
            iterations=snapshot.iterations or 0,
            sub_calls=snapshot.sub_calls or 0,
            usage=snapshot.usage.to_dict() if snapshot.usage is not None else {},
        )

    @classmethod
    def of(cls, result: RunResult, *, max_chars: int, session_id: str | None = None) -> RunOutcome:
        answer = result.answer
        chars = len(answer) if answer is not None else 0
        truncated = answer is not None and chars > max_chars
        uri = f"rlm://runs/{result.run_id}/answer"
        if truncated:
            assert answer is not None
            answer = answer[:max_chars] + f"\n... [answer cut at {max_chars} of {chars} characters; read {uri}]"
        return cls(
            status=result.status,
            run_id=result.run_id,
            answer=answer,
            reason=result.reason,
            iterations=result.iterations,
            sub_calls=result.sub_calls,
            usage=result.usage.to_dict(),
            duration_s=result.duration_s,
            answer_chars=chars,
            answer_truncated=truncated,
            answer_resource=uri if truncated else None,
            session_id=session_id,
        )


class RunStarted(BaseModel):
    run_id: str
    status: str
    session_id: str | None = None


class SessionList(BaseModel):
    sessions: list[dict[str, Any]]


class SessionClosed(BaseModel):
    session_id: str
    closed: bool
    runs: list[str]
