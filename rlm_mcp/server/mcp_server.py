"""The SDK's `MCPServer`, with the few replies rlm-mcp answers differently.

`prompts/get` for a prompt the server does not have: the SDK raises a bare `ValueError`, which the
2026-07-28 entry turns into "Internal server error" and a logged traceback on every call (the
handshake era answered "Unknown prompt" with code 0). A name the client got wrong is the
client's mistake, not the server's: it answers the spec's invalid-params error naming the
prompt, in both eras, and logs nothing.

`subscriptions/listen`: served by a handler of rlm-mcp's (`listen_with`, server/task_listen.py)
that also carries the Tasks extension's task status notifications.

stdio: answers are written on the event loop instead of through two worker threads
(server/stdio_out.py), and requests read on it instead of a worker thread each
(server/stdio_in.py), with fds 1 and 0 kept off the wire as the SDK keeps them.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, cast

import anyio
from mcp.server.lowlevel.server import RequestHandler
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, GetPromptResult, InputRequiredResult, SubscriptionsListenRequestParams

from rlm_mcp.server.stdio_in import PipeIn, claimed_stdin
from rlm_mcp.server.stdio_out import PipeOut, claimed_stdout, wire_is_a_stream
from rlm_mcp.service.service import RlmService


class RlmMcpServer(MCPServer[RlmService]):
    """`MCPServer` whose unknown-prompt reply is a protocol error, not an internal one."""

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[RlmService, Any] | None = None
    ) -> GetPromptResult | InputRequiredResult:
        if name not in {prompt.name for prompt in await self.list_prompts()}:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown prompt: {name}", data={"name": name})
        return await super().get_prompt(name, arguments, context)

    def listen_with(self, handler: RequestHandler[Any, SubscriptionsListenRequestParams]) -> None:
        """Serve `subscriptions/listen` with `handler` instead of the SDK's own."""
        self._lowlevel_server.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, handler)

    async def run_stdio_async(self) -> None:
        """Serve over stdin/stdout, the answers written by `PipeOut` when stdout is a pipe or a
        socket and the requests read by `PipeIn` when stdin is (the SDK's own transport for
        either otherwise)."""
        with ExitStack() as claims:
            stdin = stdout = None
            if wire_is_a_stream(0):
                # The SDK's reader only iterates its stdin, line by line.
                stdin = cast("anyio.AsyncFile[str]", PipeIn(claims.enter_context(claimed_stdin())))
            if wire_is_a_stream(1):
                # The SDK's writer calls only `write` and `flush` on its stdout.
                stdout = cast("anyio.AsyncFile[str]", PipeOut(claims.enter_context(claimed_stdout())))
            async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
                lowlevel = self._lowlevel_server
                await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
