"""`rlm-mcp` entry point. No subcommand: serve MCP over stdio (what `uvx rlm-mcp` does).

argparse subcommands, each with its handler (`set_defaults(handler=...)`) and help text on every
option: `rlm-mcp --help` is the command reference; docs/cli.md is generated from this parser
(tools/docs_pages.py) and tests/unit/test_cli_help.py checks the help texts.

Nothing but MCP protocol may reach stdout in stdio mode, so every log line goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from rlm_mcp import __version__
from rlm_mcp.cli_options import add_override_options
from rlm_mcp.config import Settings, load_settings
from rlm_mcp.config_check import SettingsError, unknown_env_vars
from rlm_mcp.errors import RlmMcpError, UnknownIdError
from rlm_mcp.lm.endpoint import key_note
from rlm_mcp.owners import EVERY_OWNER

if TYPE_CHECKING:
    from rlm_mcp.events import LoggedEvent
    from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.resource_errors import exhausted
from rlm_mcp.visible import visible

Handler = Callable[[argparse.Namespace, Settings], int]


def _async(handler: Callable[[argparse.Namespace, Settings], Awaitable[int]]) -> Handler:
    """A handler that runs an async command on its own event loop."""

    def run(args: argparse.Namespace, settings: Settings) -> int:
        return anyio.run(handler, args, settings)

    return run


def _command(sub: Any, name: str, handler: Handler | None, help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose help is `help` (its summary in the parent's list and its description)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=kwargs.pop("description", help))
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlm-mcp",
        description="MCP server for Recursive Language Models. Without a command: serve MCP over stdio.",
        epilog="`rlm-mcp COMMAND --help` describes a command. Settings: RLM_MCP_* environment variables (docs/configuration.md).",
    )
    p.add_argument("--version", action="version", version=f"rlm-mcp {__version__}")
    p.set_defaults(handler=_serve_command)
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND")

    serve = _command(sub, "serve", _serve_command, "serve MCP (default: stdio)")
    serve.add_argument("--transport", choices=["stdio", "http"], default=None, help="default: RLM_MCP_TRANSPORT, stdio")
    serve.add_argument("--host", default=None, help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="HTTP port (default 8765)")
    serve.add_argument(
        "--role",
        choices=["both", "front", "worker"],
        default=None,
        help="team mode: front (MCP, enqueues runs), worker (executes runs, no MCP) or both (default: RLM_MCP_ROLE)",
    )

    _command(sub, "doctor", _doctor, "check the sandbox backend and image, the LM endpoints and a round trip")

    run = _command(sub, "run", _async(_one_run), "one run from the shell: load a context and ask a question")
    run.add_argument("query", help="the question")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--path", help="a file or folder to load as the context (relative to here)")
    src.add_argument("--url", help="an http(s) URL to load as the context")
    src.add_argument("--context-id", help="a stored context (see `rlm-mcp contexts list`)")
    add_override_options(run)
    run.add_argument("--json", action="store_true", help="print the whole result as JSON (for scripts)")
    kept = run.add_mutually_exclusive_group()
    kept.add_argument(
        "--keep-session",
        action="store_true",
        help="keep the REPL for follow-up questions (stored in the data dir when the command ends; needs dill in the image)",
    )
    kept.add_argument(
        "--session", metavar="ID", help="continue a kept session (the context, if given, becomes context_i)"
    )

    sessions = _command(sub, "sessions", None, "list or close kept sessions stored in the data dir")
    sessions_sub = sessions.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    _command(sessions_sub, "list", _async(_sessions_list), "every stored session: id, runs, contexts, snapshot size")
    close = _command(sessions_sub, "close", _async(_sessions_close), "close a stored session (its snapshot is deleted)")
    close.add_argument("session_id", help="the session's id")

    ctx = _command(sub, "contexts", None, "list or delete stored contexts")
    ctx_sub = ctx.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    _command(ctx_sub, "list", _async(_contexts_list), "every stored context: id, size, format, name")
    delete = _command(ctx_sub, "delete", _async(_contexts_delete), "delete a stored context")
    delete.add_argument("context_id", help="the context's id")

    runs = _command(sub, "runs", None, "inspect run records")
    runs_sub = runs.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    _command(runs_sub, "list", _async(_runs_list), "every run: id, start time, duration, status, query")
    show = _command(runs_sub, "show", _async(_runs_show), "print a run's summary as JSON")
    show.add_argument("run_id", help="the run's id")
    export = _command(
        runs_sub, "export", _async(_runs_export), "print a run as JSONL: its events, or chat conversations"
    )
    export.add_argument("run_id", help="the run's id, or a kept session's id (ses_...): its runs in session order")
    export.add_argument(
        "--format",
        choices=["events", "chat"],
        default="events",
        help="events (default): the trajectory log; chat: one {messages: [...]} line per run of the tree, for fine-tuning sets",
    )
    page = _command(runs_sub, "html", _async(_runs_html), "write a self-contained HTML page of a run's trajectory")
    page.add_argument("run_id", help="the run's id")
    page.add_argument("-o", "--output", help="file to write (default: ./rlm-run-RUN_ID.html; '-': stdout)")
    viewer = _command(
        runs_sub, "view", _async(_runs_view), "open the run viewer: live on loopback, a running HTTP server, or a file"
    )
    viewer.add_argument("run_id", nargs="?", help="the run, or kept session (ses_...), to open (default: the index)")
    viewer.add_argument(
        "--url", help="a running `serve --transport http` (e.g. http://127.0.0.1:8765): print a login link"
    )
    viewer.add_argument("-o", "--output", help="write a self-contained page to this file instead")
    viewer.add_argument("--no-open", action="store_true", help="print the link or path; do not start a browser")

    from rlm_mcp.eval.cli import add_parser as add_eval_parser

    add_eval_parser(sub)

    image = _command(sub, "image", None, "the sandbox image")
    image_sub = image.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    build = _command(image_sub, "build", _image_build, "build the sandbox image")
    build.add_argument("--offline", action="store_true", help="debootstrap a base instead of pulling one")
    build.add_argument("--mirror", default=None, help="Debian mirror for --offline")
    build.add_argument("--force", action="store_true", help="rebuild the base even if present")
    _command(image_sub, "status", _image_status, "is the image present?")

    profile = _command(sub, "profile", None, "the prompt profile (canonical needs the reference's texts)")
    profile_sub = profile.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    _command(
        profile_sub, "fetch", _profile_fetch, "download the pinned reference wheel rlms 0.1.3 (no dependencies) once"
    )
    _command(profile_sub, "show", _profile_show, "which profile a run would use, and why")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        serve_flags = [(name, getattr(args, name, None)) for name in ("transport", "host", "port", "role")]
        overrides = {k: v for k, v in serve_flags if v is not None}
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"rlm-mcp: bad configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        stream=sys.stderr, level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for warning in unknown_env_vars(Settings.model_fields, os.environ):
        logging.getLogger("rlm_mcp.config").warning(warning)
    if settings.log_level.upper() != "DEBUG":  # the clients' line per request only when asked for
        for noisy in ("httpx", "httpcore"):  # (the server's access lines stay: uvicorn, at INFO)
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        handler: Handler = args.handler
        return handler(args, settings)
    except BrokenPipeError:
        return _reader_gone()
    except RlmMcpError as exc:
        if isinstance(exc, UnknownIdError):
            exc = exc.phrased(CLI_FIXES)
        print(f"rlm-mcp: {visible(str(exc))}", file=sys.stderr)  # may quote a URL, a name, a model
        return 1
    except OSError as exc:
        if (phrased := exhausted(exc)) is None:
            raise
        print(f"rlm-mcp: {visible(str(phrased))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# How a shell user fixes an unknown id (the store only says which id was unknown).
CLI_FIXES = {
    "context": "List stored contexts with `rlm-mcp contexts list`.",
    "run": "List run records with `rlm-mcp runs list`.",
}


def _reader_gone() -> int:
    """The command's reader went away (`rlm-mcp runs export ID | head`): stop quietly, as other
    tools do, with SIGPIPE's exit status; stdout goes to /dev/null so that the interpreter's last
    flush at exit cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a descriptor (embedded use)
        pass
    return 128 + signal.SIGPIPE


def _serve_command(args: argparse.Namespace, settings: Settings) -> int:
    if (note := key_note(settings)) is not None:
        logging.getLogger("rlm_mcp.lm").warning("%s; set RLM_MCP_SUB_API_KEY if that server needs one", note)
    if settings.role != "both" and settings.database_url is None:
        raise RlmMcpError(
            f"--role {settings.role} needs team mode: fronts and workers share runs through PostgreSQL.",
            "Set RLM_MCP_DATABASE_URL=postgresql://user:password@host:port/db on every replica "
            "(docs/team.md), or serve with --role both (the default).",
        )
    if settings.database_url is not None:  # a misconfigured database: one line, before anything starts
        anyio.run(_database_ready, settings)
    if settings.role != "front":  # this process runs sandboxes: never without their limits
        from rlm_mcp.sandbox.backends import refuse_unlimited_sandboxes

        anyio.run(refuse_unlimited_sandboxes, settings)
    from rlm_mcp.observability import tracing

    tracing.configure_from_env()  # only when OTEL_* variables ask for traces
    try:
        anyio.run(_serve_worker if settings.role == "worker" else _serve, settings)
    finally:
        tracing.shutdown()  # the spans still batched go out before the process ends
    return 0


async def _database_ready(settings: Settings) -> None:
    """Team mode's first connection (encoding, privileges, migrations), checked before serving."""
    from rlm_mcp.store.pg import Database

    assert settings.database_url is not None
    await Database(settings.database_url.get_secret_value(), replica=False).prepare()


async def _serve_worker(settings: Settings) -> None:
    """A team-mode worker: executes queued runs and serves only the unauthenticated health route
    (`GET /healthz`, for a balancer or systemd) and its metrics (`GET /metrics`) on
    RLM_MCP_HOST:RLM_MCP_PORT; no MCP, no viewer."""
    from rlm_mcp.access import load_tokens
    from rlm_mcp.observability.exposition import metrics_endpoint, with_metrics
    from rlm_mcp.server.health import health_app, store_readiness
    from rlm_mcp.server.http import serve_http
    from rlm_mcp.server.listen import bind_listener
    from rlm_mcp.service.service import RlmService

    closed = threading.Event()
    listener = bind_listener(settings.host, settings.port)  # a port in use: one line, before anything starts

    async def serve() -> None:
        try:
            async with RlmService(settings, mode="http") as service:
                logging.getLogger("rlm_mcp").info("team worker: executing queued runs; health on /healthz")
                health = health_app(store_readiness(service.stores), role="worker")
                scrape = metrics_endpoint(load_tokens(settings), public=settings.metrics_public)
                await serve_http(settings, with_metrics(health, scrape), listener)
        finally:
            closed.set()

    try:
        await _serve_until_signal(serve, closed)
    finally:
        listener.close()


def _doctor(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.doctor import run_doctor

    return anyio.run(run_doctor, settings)


def _profile_fetch(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.reference import fetch_wheel

    print(f"reference wheel: {fetch_wheel(settings.data_dir)}")
    return _profile_show(args, settings)


def _profile_show(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.service.profile import choose_profile

    choice = choose_profile(settings, fetch=False)
    print(f"prompt profile: {choice.profile.name} ({choice.detail})")
    if choice.fix:
        print(f"fix: {choice.fix}")
    return 0 if not choice.fix else 1


async def _serve(settings: Settings) -> None:
    """Serve until stdin closes (stdio), or SIGINT/SIGTERM; the lifespan then removes this
    server's sandboxes before the process exits."""
    closed = threading.Event()
    listener = None
    if settings.transport == "http":
        from rlm_mcp.server.http import build_http_app, serve_http
        from rlm_mcp.server.listen import bind_listener

        app = build_http_app(settings, on_closed=closed.set)  # refusals happen before binding
        listener = bind_listener(settings.host, settings.port)  # a port in use: one line, before "serving"

        async def serve() -> None:
            await serve_http(settings, app, listener)
    else:
        from rlm_mcp.cli_hints import STDIO_ON_A_TERMINAL

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


def _image_status(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.sandbox.docker.docker_api import connect_sync, image_present_sync

    client = connect_sync()
    try:
        present = image_present_sync(client, settings.sandbox_image)
    finally:
        client.close()
    print(f"{settings.sandbox_image}: {'present' if present else 'missing (run: rlm-mcp image build --offline)'}")
    return 0 if present else 1


def _image_build(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.sandbox.docker.image import build_image

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    tag = build_image(settings, offline=args.offline, mirror=args.mirror, force=args.force, log=log)
    print(tag)
    return 0


async def _contexts_list(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_run import contexts_table
    from rlm_mcp.store.factory import make_stores

    async with make_stores(settings) as stores:
        for line in contexts_table(await stores.contexts.list(owner=EVERY_OWNER)):  # every owner's
            print(line)
    return 0


async def _contexts_delete(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.store.factory import make_stores

    async with make_stores(settings) as stores:
        await stores.contexts.get(args.context_id, owner=EVERY_OWNER)
        await stores.contexts.delete(args.context_id, owner=EVERY_OWNER)
    print(f"deleted {args.context_id}")
    return 0


async def _runs_list(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_run import runs_table
    from rlm_mcp.store.factory import make_stores

    async with make_stores(settings) as stores:
        for line in runs_table(await stores.runs.list(owner=EVERY_OWNER)):
            print(line)
    return 0


async def _runs_show(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.store.factory import make_stores

    async with make_stores(settings) as stores:
        record = await stores.runs.read_summary(args.run_id, owner=EVERY_OWNER)
    print(json.dumps(record.to_stored(), indent=2))
    return 0


async def _runs_view(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.viewer.local import view

    return await view(settings, args.run_id, url=args.url, output=args.output, open_browser=not args.no_open)


async def _run_record(settings: Settings, run_id: str) -> tuple[RunRecord, list[LoggedEvent]]:
    """The operator's view of one run: its record and events, from whichever store is set."""
    from rlm_mcp.store.factory import make_stores

    async with make_stores(settings) as stores:
        record = await stores.runs.read_summary(run_id, owner=EVERY_OWNER)
        return record, await stores.runs.read_events(run_id, owner=EVERY_OWNER)


async def _runs_html(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_run import write_page
    from rlm_mcp.viewer import render_run_html

    summary, events = await _run_record(settings, args.run_id)
    written = await write_page(render_run_html(summary, events), args.run_id, args.output)
    if written is not None:
        print(f"wrote {written}")
    return 0


async def _runs_export(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.events import to_json
    from rlm_mcp.viewer.export import chat_jsonl

    run_ids = [args.run_id]
    if args.run_id.startswith("ses_"):  # a kept session: every run of it, in the order they ran
        run_ids = await _session_runs(settings, args.run_id)
        if not run_ids:
            print(f"No run records of session {args.run_id}. List runs with `rlm-mcp runs list`.", file=sys.stderr)
            return 1
    for run_id in run_ids:
        summary, events = await _run_record(settings, run_id)
        if args.format == "chat":
            sys.stdout.write(chat_jsonl(summary, events))
            continue
        for event in events:
            print(json.dumps(to_json(event), default=str))
    return 0


async def _session_runs(settings: Settings, session_id: str) -> list[str]:
    """The runs of a kept session, oldest first (their records carry the session id)."""
    from rlm_mcp.store.factory import make_stores

    async with make_stores(settings) as stores:
        records = await stores.runs.list(settings.run_max_records, owner=EVERY_OWNER)
    mine = [r for r in records if r.request.session_id == session_id]
    return [r.run_id for r in sorted(mine, key=lambda r: r.created_at)]


async def _sessions_list(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_sessions import sessions_list

    return await sessions_list(settings)


async def _sessions_close(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_sessions import sessions_close

    return await sessions_close(settings, args.session_id)


async def _one_run(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_run import one_run

    return await one_run(args, settings)


if __name__ == "__main__":
    sys.exit(main())
