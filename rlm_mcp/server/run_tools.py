"""The parameters `rlm_complete` and `rlm_start` share, declared once.

Both tools take `query`, `context_id` and one parameter per field of `service.limits.RunOverrides`
(the same fields `rlm-mcp run` and `rlm-mcp eval` take as flags). `run_tool` gives a function
`(ctx, query, context_ids, overrides)` that flat signature, so the SDK derives the same JSON schema
for both tools from one declaration, and a new override reaches both without editing either.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar, get_type_hints

from mcp.server.mcpserver import Context
from pydantic import Field

from rlm_mcp.service.limits import RunOverrides

R = TypeVar("R")

Query = Annotated[str, Field(description="The question to answer about the context.")]
ContextIds = Annotated[
    str | list[str],
    Field(description="A context_id from rlm_load_context, or a list of them (context_0, context_1, ...)."),
]

RunToolBody = Callable[[Context, str, "str | list[str]", RunOverrides], Awaitable[R]]


def _parameters() -> list[inspect.Parameter]:
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    limits = get_type_hints(RunOverrides, include_extras=True)  # Annotated[int | None, Field(ge=.., le=..)]
    return [
        inspect.Parameter("query", keyword, annotation=Query),
        inspect.Parameter("context_id", keyword, annotation=ContextIds),
        inspect.Parameter("ctx", keyword, annotation=Context),
        *(
            inspect.Parameter(name, keyword, default=None, annotation=limits[name])
            for name in RunOverrides.model_fields
        ),
    ]


def run_tool(body: RunToolBody[R]) -> Callable[..., Awaitable[R]]:
    """A tool function named and documented like `body`, whose parameters are the shared list."""
    parameters = _parameters()
    returns = inspect.signature(body, eval_str=True).return_annotation

    async def tool(query: str, context_id: str | list[str], ctx: Context, **limits: Any) -> R:
        return await body(ctx, query, context_id, RunOverrides(**limits))

    tool.__name__ = tool.__qualname__ = body.__name__
    tool.__doc__ = body.__doc__
    tool.__module__ = body.__module__
    tool.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
    tool.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    return tool
