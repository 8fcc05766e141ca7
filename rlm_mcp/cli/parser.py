"""`rlm-mcp`'s argument parser: every command, its options and their help texts.

`rlm-mcp --help` is the command reference; docs/cli.md is generated from this parser
(tools/docs_pages.py) and tests/unit/test_cli_help.py checks the help texts. Each command's
handler lives in the module of its area (serve, records, tools, run, sessions, webhooks, blobs, eval), and imports
what it needs when it runs, so `--help` stays fast.
"""

from __future__ import annotations

import argparse

from rlm_mcp import __version__
from rlm_mcp.cli import records, tools
from rlm_mcp.cli.blobs import blobs_move
from rlm_mcp.cli.common import command, run_async
from rlm_mcp.cli.eval import add_parser as add_eval_parser
from rlm_mcp.cli.options import add_override_options
from rlm_mcp.cli.run import one_run
from rlm_mcp.cli.serve import serve_command
from rlm_mcp.cli.sessions import sessions_close, sessions_list
from rlm_mcp.cli.tools import doctor
from rlm_mcp.cli.webhooks import webhooks_list, webhooks_redeliver


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlm-mcp",
        description="MCP server for Recursive Language Models. Without a command: serve MCP over stdio.",
        epilog="`rlm-mcp COMMAND --help` describes a command. Settings: RLM_MCP_* environment variables (docs/configuration.md).",
    )
    p.add_argument("--version", action="version", version=f"rlm-mcp {__version__}")
    p.set_defaults(handler=serve_command)
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND")

    serve = command(sub, "serve", serve_command, "serve MCP (default: stdio)")
    serve.add_argument("--transport", choices=["stdio", "http"], default=None, help="default: RLM_MCP_TRANSPORT, stdio")
    serve.add_argument("--host", default=None, help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="HTTP port (default 8765)")
    serve.add_argument(
        "--role",
        choices=["both", "front", "worker"],
        default=None,
        help="team mode: front (MCP, enqueues runs), worker (executes runs, no MCP) or both (default: RLM_MCP_ROLE)",
    )

    command(sub, "doctor", doctor, "check the sandbox backend and image, the LM endpoints and a round trip")

    run = command(sub, "run", run_async(one_run), "one run from the shell: load a context and ask a question")
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

    sessions = command(sub, "sessions", None, "list or close kept sessions stored in the data dir")
    sessions_sub = sessions.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    command(sessions_sub, "list", run_async(sessions_list), "every stored session: id, runs, contexts, snapshot size")
    close = command(
        sessions_sub, "close", run_async(sessions_close), "close a stored session (its snapshot is deleted)"
    )
    close.add_argument("session_id", help="the session's id")

    hooks = command(sub, "webhooks", None, "list webhook deliveries, or deliver one again")
    hooks_sub = hooks.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    command(hooks_sub, "list", run_async(webhooks_list), "every kept delivery: id, state, attempts, last answer, URL")
    again = command(hooks_sub, "redeliver", run_async(webhooks_redeliver), "deliver a webhook again (same webhook-id)")
    again.add_argument("webhook_id", help="the delivery's id (msg_<run id>)")
    blobs = command(sub, "blobs", None, "team mode: move context bytes and snapshots to the bucket")
    blobs_sub = blobs.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    moving = command(
        blobs_sub,
        "move",
        run_async(blobs_move),
        "move the database's context bytes and snapshots to RLM_MCP_BLOB_URL while serving (resumable)",
    )
    moving.add_argument("--dry-run", action="store_true", help="only report what would move and how many bytes")

    ctx = command(sub, "contexts", None, "list or delete stored contexts")
    ctx_sub = ctx.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    command(ctx_sub, "list", run_async(records.contexts_list), "every stored context: id, size, format, name")
    delete = command(ctx_sub, "delete", run_async(records.contexts_delete), "delete a stored context")
    delete.add_argument("context_id", help="the context's id")

    runs = command(sub, "runs", None, "inspect run records")
    runs_sub = runs.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    command(runs_sub, "list", run_async(records.runs_list), "every run: id, start time, duration, status, query")
    show = command(runs_sub, "show", run_async(records.runs_show), "print a run's summary as JSON")
    show.add_argument("run_id", help="the run's id")
    export = command(
        runs_sub, "export", run_async(records.runs_export), "print a run as JSONL: its events, or chat conversations"
    )
    export.add_argument("run_id", help="the run's id, or a kept session's id (ses_...): its runs in session order")
    export.add_argument(
        "--format",
        choices=["events", "chat"],
        default="events",
        help="events (default): the trajectory log; chat: one {messages: [...]} line per run of the tree, for fine-tuning sets",
    )
    page = command(
        runs_sub, "html", run_async(records.runs_html), "write a self-contained HTML page of a run's trajectory"
    )
    page.add_argument("run_id", help="the run's id")
    page.add_argument("-o", "--output", help="file to write (default: ./rlm-run-RUN_ID.html; '-': stdout)")
    viewer = command(
        runs_sub,
        "view",
        run_async(records.runs_view),
        "open the run viewer: live on loopback, a running HTTP server, or a file",
    )
    viewer.add_argument("run_id", nargs="?", help="the run, or kept session (ses_...), to open (default: the index)")
    viewer.add_argument(
        "--url", help="a running `serve --transport http` (e.g. http://127.0.0.1:8765): print a login link"
    )
    viewer.add_argument("-o", "--output", help="write a self-contained page to this file instead")
    viewer.add_argument("--no-open", action="store_true", help="print the link or path; do not start a browser")

    add_eval_parser(sub)

    image = command(sub, "image", None, "the sandbox image")
    image_sub = image.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    build = command(image_sub, "build", tools.image_build, "build the sandbox image")
    build.add_argument("--offline", action="store_true", help="debootstrap a base instead of pulling one")
    build.add_argument("--mirror", default=None, help="Debian mirror for --offline")
    build.add_argument("--force", action="store_true", help="rebuild the base even if present")
    command(image_sub, "status", tools.image_status, "is the image present?")

    profile = command(sub, "profile", None, "the prompt profile (canonical needs the reference's texts)")
    profile_sub = profile.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    command(
        profile_sub,
        "fetch",
        tools.profile_fetch,
        "download the pinned reference wheel rlms 0.1.3 (no dependencies) once",
    )
    command(profile_sub, "show", tools.profile_show, "which profile a run would use, and why")
    return p
