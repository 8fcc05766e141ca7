"""`rlm-mcp serve` (and a bare `rlm-mcp`): serve MCP over stdio or HTTP, or run a team worker,
until stdin closes or SIGINT/SIGTERM.

Nothing but MCP protocol may reach stdout in stdio mode, so every log line goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable

import anyio

from rlm_mcp.cli.collector import tune_for_serving
from rlm_mcp.config import Settings, TeamDatabase
from rlm_mcp.config.blobs import BlobSettings


def serve_command(args: argparse.Namespace, settings: Settings) -> int:
    # Here, not at the top: the LM layer loads its HTTP client, which the other commands need not pay for.
    from rlm_mcp.lm.endpoint import key_note

    if (note := key_note(settings.lm)) is not None:
        logging.getLogger("rlm_mcp.lm").warning("%s; set RLM_MCP_SUB_API_KEY if that server needs one", note)
    deployment = settings.deployment.served()  # a front or worker without the database: refused there
    if not deployment.serves_mcp:  # a worker's listener off loopback without tokens: refused first
        from rlm_mcp.server.start_checks import checked_tokens, refuse_open_bind

        refuse_open_bind(settings, checked_tokens(settings), serves_mcp=False)
    if deployment.database is not None:  # a misconfigured database: one line, before anything starts
        anyio.run(_database_ready, deployment.database)
        if settings.blobs.location is not None:  # so is a bucket that refuses or does not answer
            anyio.run(_bucket_ready, settings.blobs)
    if deployment.executes_runs:  # this process runs sandboxes: never without their limits
        from rlm_mcp.sandbox.backends import refuse_unlimited_sandboxes

        anyio.run(refuse_unlimited_sandboxes, settings.sandbox)
    from rlm_mcp.observability import tracing

    tracing.configure_from_env()  # only when OTEL_* variables ask for traces
    try:
        anyio.run(_serve if deployment.serves_mcp else _serve_worker, settings)
    finally:
        tracing.shutdown()  # the spans still batched go out before the process ends
    return 0


async def _database_ready(database: TeamDatabase) -> None:
    """Team mode's first connection (encoding, privileges, migrations), checked before serving."""
    from rlm_mcp.store.pg import Database

    await Database(database.dsn, replica=False).prepare()


async def _bucket_ready(blobs: BlobSettings) -> None:
    """Team mode's bucket answers a write, a read and a delete (as `doctor`'s bucket row checks);
    else a `BucketError` naming the bucket and the fix, never a credential."""
    from rlm_mcp.store.bucket import Bucket

    location = blobs.location
    assert location is not None  # the caller checked
    await Bucket(location, timeout_s=min(blobs.blob_timeout_s, BUCKET_CHECK_TIMEOUT_S)).round_trip()


BUCKET_CHECK_TIMEOUT_S = 15.0  # a start-up check: a slow bucket fails it in seconds, not minutes


async def _serve_worker(settings: Settings) -> None:
    """A team-mode worker: executes queued runs and serves only the unauthenticated health route
    (`GET /healthz`, for a balancer or systemd) and its metrics (`GET /metrics`) on
    RLM_MCP_HOST:RLM_MCP_PORT; no MCP, no viewer."""
    from rlm_mcp.assembly import build_service
    from rlm_mcp.server.http import build_worker_app, serve_http
    from rlm_mcp.server.listen import bind_listener

    closed = threading.Event()
    listener = bind_listener(
        settings.server.host, settings.server.port
    )  # a port in use: one line, before anything starts

    async def serve() -> None:
        try:
            async with build_service(settings, mode="http") as service:
                logging.getLogger("rlm_mcp").info("team worker: executing queued runs; health on /healthz")
                await serve_http(settings, build_worker_app(settings, service.stores), listener)
        finally:
            closed.set()

    try:
        await _serve_until_signal(serve, closed)
    finally:
        listener.close()


async def _serve(settings: Settings) -> None:
    """Serve until stdin closes (stdio), or SIGINT/SIGTERM; the lifespan then removes this
    server's sandboxes before the process exits."""
    closed = threading.Event()
    listener = None
    if settings.server.transport == "http":
        from rlm_mcp.server.http import build_http_app, serve_http
        from rlm_mcp.server.listen import bind_listener

        app = build_http_app(settings, on_closed=closed.set)  # refusals happen before binding
        listener = bind_listener(
            settings.server.host, settings.server.port
        )  # a port in use: one line, before "serving"

        async def serve() -> None:
            await serve_http(settings, app, listener)
    else:
        from rlm_mcp.cli.hints import STDIO_ON_A_TERMINAL

        if sys.stdin.isatty():  # a person typed `rlm-mcp`: say what it waits for
            print(STDIO_ON_A_TERMINAL, file=sys.stderr, flush=True)
        from rlm_mcp.server.app import build_server

        server = build_server(settings, mode="stdio", on_closed=closed.set)

        async def serve() -> None:
            await server.run_stdio_async()

    try:
        await _serve_until_signal(serve, closed)
    finally:
        if listener is not None:
            listener.close()


async def _serve_until_signal(serve: Callable[[], Awaitable[None]], closed: threading.Event) -> None:
    # Server and worker alike, once their modules are imported and before the first request: a
    # long-running process's collector settings (cli/collector.py).
    tune_for_serving()
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    # The SDK reads stdin in a worker thread that cancellation cannot
                    # interrupt, so once the service has cleaned up, leave without it.
                    threading.Thread(target=_exit_when, args=(closed,), daemon=True).start()
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_on_signal)
        await serve()
        tg.cancel_scope.cancel()


def _exit_when(closed: threading.Event, grace_s: float = 30.0) -> None:
    closed.wait(grace_s)
    logging.getLogger("rlm_mcp").info("shut down on signal")
    from rlm_mcp.observability import tracing

    tracing.shutdown()  # the spans still batched go out first (os._exit skips every finally)
    logging.shutdown()
    os._exit(0)
