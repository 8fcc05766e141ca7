"""The parameters `rlm_complete` and `rlm_start` share, declared once.

Both tools take `query`, `context_id`, `keep_session`, `session_id`, `webhook_url` and one parameter per field of `service.limits.RunOverrides`
(the same fields `rlm-mcp run` and `rlm-mcp eval` take as flags). `run_tool` gives a function
`(ctx, query, context_ids, overrides)` that flat signature, so the SDK derives the same JSON schema
for both tools from one declaration, and a new override reaches both without editing either.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, get_type_hints

from mcp.server.mcpserver import Context
from pydantic import Field

from rlm_mcp.service.limits import RunOverrides

R = TypeVar("R")

Query = Annotated[str, Field(description="The question to answer about the context.")]
ContextIds = Annotated[
    str | list[str] | None,
    Field(
        description="A context_id from rlm_load_context, or a list of them (context_0, context_1, ...). "
        "In a kept session's follow-up they become the next context_i; omit to add none."
    ),
]
KeepSession = Annotated[
    bool,
    Field(
        description="Keep the REPL after this run for follow-up questions: the result carries a session_id. "
        "Use it when you expect to ask more about the same context: variables the model built "
        "(splits, indexes, counts) are reused instead of recomputed."
    ),
]
SessionId = Annotated[
    str,
    Field(
        description="Continue this kept session: every variable of its earlier runs is there, earlier "
        "conversations are `history_0`, `history_1`, ... (`history` = history_0)."
    ),
]

WebhookUrl = Annotated[
    str,
    Field(
        description="Deliver the run's end (a signed, thin JSON: event type and run_id) to this URL; only "
        "URLs on your token's allow-list are accepted."
    ),
]


@dataclass(frozen=True)
class SessionArgs:
    """What a run tool was told about kept sessions (and where to call back at the run's end)."""

    keep_session: bool = False
    session_id: str | None = None
    webhook_url: str | None = None


RunToolBody = Callable[[Context, str, "str | list[str] | None", RunOverrides, SessionArgs], Awaitable[R]]


def _parameters() -> list[inspect.Parameter]:
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    limits = get_type_hints(RunOverrides, include_extras=True)  # Annotated[int | None, Field(ge=.., le=..)]
    return [
        inspect.Parameter("query", keyword, annotation=Query),
        inspect.Parameter("ctx", keyword, annotation=Context),
        inspect.Parameter("context_id", keyword, default=None, annotation=ContextIds),
        inspect.Parameter("keep_session", keyword, default=False, annotation=KeepSession),
        inspect.Parameter("session_id", keyword, default="", annotation=SessionId),
        inspect.Parameter("webhook_url", keyword, default="", annotation=WebhookUrl),
        *(
            inspect.Parameter(name, keyword, default=None, annotation=limits[name])
            for name in RunOverrides.model_fields
        ),
    ]


def run_tool(body: RunToolBody[R]) -> Callable[..., Awaitable[R]]:
    """A tool function named and documented like `body`, whose parameters are the shared list."""
    parameters = _parameters()
    returns = inspect.signature(body, eval_str=True).return_annotation

    async def tool(
        query: str,
        ctx: Context,
        context_id: str | list[str] | None = None,
        keep_session: bool = False,
        session_id: str = "",
        webhook_url: str = "",
        **limits: Any,
    ) -> R:
        session = SessionArgs(keep_session=keep_session, session_id=session_id or None, webhook_url=webhook_url or None)
        return await body(ctx, query, context_id, RunOverrides(**limits), session)

    tool.__name__ = tool.__qualname__ = body.__name__
    tool.__doc__ = body.__doc__
    tool.__module__ = body.__module__
    tool.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
    tool.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    return tool
