"""The context tools: store a context (whole or in chunks), list them, delete one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from rlm_mcp.ports import ContextFormat
from rlm_mcp.server.schemas import ContextHandle, ContextList, Deleted, UploadProgress
from rlm_mcp.server.tool_calls import READ, STORE, tool_call, with_heartbeat
from rlm_mcp.service.caller import Caller, ChunkEncoding
from rlm_mcp.service.service import RlmService


def add_context_tools(mcp: MCPServer[RlmService], svc: Callable[[Context], Caller]) -> None:
    @mcp.tool(annotations=STORE)
    async def rlm_load_context(
        ctx: Context,
        text: Annotated[str, Field(description="The context itself (small contexts only).")] = "",
        path: Annotated[str, Field(description="A file or folder under the allowed roots.")] = "",
        glob: Annotated[str, Field(description="An absolute glob pattern, e.g. /repo/**/*.py.")] = "",
        url: Annotated[str, Field(description="An http(s) URL to fetch.")] = "",
        name: Annotated[str, Field(description="A label shown in rlm_list_contexts.")] = "",
        format: Annotated[ContextFormat, Field(description="json: the sandbox sees a list/dict.")] = "text",
        include: Annotated[list[str] | None, Field(description="Folder/glob: only paths matching these.")] = None,
        exclude: Annotated[list[str] | None, Field(description="Folder/glob: skip paths matching these.")] = None,
    ) -> ContextHandle:
        """Store a large context once and get a context_id handle (same bytes, same id)."""
        source = path or glob or url or "text"
        work = svc(ctx).load_context(
            text=text or None,
            path=path or None,
            glob=glob or None,
            url=url or None,
            name=name or None,
            format=format,
            include=include,
            exclude=exclude,
        )
        info = await tool_call(with_heartbeat(ctx, f"loading {source[:120]}", work))
        return ContextHandle.of(info)

    @mcp.tool(annotations=STORE)
    async def rlm_upload_context(
        ctx: Context,
        data: Annotated[str, Field(description="This chunk: at most 1 MiB once decoded.")],
        index: Annotated[int, Field(ge=0, description="0 for the first chunk, then 1, 2, ...")],
        upload_id: Annotated[str, Field(description="From the answer to chunk 0; omit on chunk 0.")] = "",
        final: Annotated[bool, Field(description="True on the last chunk: the context is stored.")] = False,
        encoding: Annotated[ChunkEncoding, Field(description="How `data` is encoded.")] = "text",
        sha256: Annotated[str, Field(description="Hex SHA-256 of the whole upload, checked at the end.")] = "",
        name: Annotated[str, Field(description="A label for the context.")] = "",
        format: Annotated[ContextFormat | None, Field(description="text (default) or json.")] = None,
    ) -> UploadProgress:
        """Upload a context in chunks (resumable); the final chunk returns the context handle."""
        state = await tool_call(
            svc(ctx).upload_chunk(
                data=data,
                index=index,
                upload_id=upload_id or None,
                final=final,
                encoding=encoding,
                sha256=sha256 or None,
                name=name or None,
                format=format,
            )
        )
        return UploadProgress.of(state)

    @mcp.tool(annotations=READ)
    async def rlm_list_contexts(ctx: Context) -> ContextList:
        """List stored contexts."""
        infos = await tool_call(svc(ctx).list_contexts())
        return ContextList(contexts=[ContextHandle.of(i) for i in infos])

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
    async def rlm_delete_context(context_id: str, ctx: Context) -> Deleted:
        """Delete a stored context."""
        deleted = await tool_call(svc(ctx).delete_context(context_id))
        return Deleted(context_id=context_id, deleted=deleted)
