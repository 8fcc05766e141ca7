"""What `rlm-mcp run` and `rlm-mcp runs list|html` show a person (the argparse wiring is in parser.py).

Progress goes to stderr: a live, self-updating line (rich) on a terminal, one plain line per
update otherwise. The result goes to stdout: the answer and a summary line, or with `--json`
the whole result object for scripts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.runs import RunRecord, Usage
from rlm_mcp.visible import visible, visible_line


class ProgressDisplay:
    """Live progress on a terminal (a rich status line), plain lines when not a terminal."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._live = stream.isatty()
        self._stack = ExitStack()
        self._status: Any = None

    def __enter__(self) -> ProgressDisplay:
        if self._live:
            from rich.console import Console

            console = Console(file=self._stream)
            self._status = self._stack.enter_context(console.status("starting …"))
            self._logs_above_the_status()
        return self

    def _logs_above_the_status(self) -> None:
        """While the status line shows, rich stands a proxy in for sys.stderr that prints whole
        lines above it; log handlers keep the stream they were given, so point the ones writing to
        this terminal at the proxy (until exit), else a log line lands inside the status line."""
        proxy = sys.stderr
        if proxy is self._stream:
            return
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is self._stream:
                previous = handler.setStream(proxy)
                if previous is not None:
                    self._stack.callback(handler.setStream, previous)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    async def report(self, progress: float, total: float | None, message: str) -> None:
        message = visible_line(message)  # progress may quote the model
        if self._status is not None:
            from rich.text import Text

            self._status.update(Text(message))  # a Text: no rich markup is read from it
        else:
            print(message, file=self._stream, flush=True)


async def one_run(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import build_service
    from rlm_mcp.cli.options import overrides_of
    from rlm_mcp.config.one_off import for_one_off_command, opening_local_paths
    from rlm_mcp.service.caller import Caller

    settings = for_one_off_command(settings)
    # A relative --path means relative to where the command was typed; the path typed is what
    # this command may read, wherever it lies (the local commands' rule, `opening_local_paths`).
    path = str(await (await anyio.Path(args.path).expanduser()).resolve()) if args.path else None
    if path is not None:
        settings = opening_local_paths(settings, [Path(path)])
    with ProgressDisplay() as display:
        async with build_service(settings, mode="stdio") as service:
            local = Caller(service, LOCAL_OWNER)
            context_id: str | None = None
            if args.context_id:
                context_id = args.context_id
            elif path or args.url:
                info = await local.load_context(path=path, url=args.url)
                context_id = info.context_id
            elif not args.session:
                raise BadArgumentError(
                    "No context given.", "Pass --path, --url or --context-id (or --session to continue a kept session)."
                )
            overrides = overrides_of(args)
            try:
                result, session_id = await local.complete_in_session(
                    args.query,
                    context_id,
                    overrides,
                    display.report,
                    keep_session=args.keep_session,
                    session_id=args.session,
                )
            except NotFoundError as exc:
                raise _session_phrased(exc, args.session, settings) from None
    if args.json:
        print(json.dumps(result.model_dump() | {"session_id": session_id}, indent=2))
    else:
        print(visible(result.answer if result.answer is not None else ""))  # the model's text: controls shown
        print(status_line(result), file=sys.stderr)
    ended = service.sessions.why_ended(session_id) if session_id else None
    if session_id and ended is None:
        print(f"session {session_id} kept (ask a follow-up with --session {session_id})", file=sys.stderr)
    elif session_id:
        print(visible_line(f"session {session_id} could not be kept: it {ended}"), file=sys.stderr)
    return 0 if result.status == "completed" else 1


# How a shell user starts again when a session cannot go on (MCP clients are told keep_session=true).
CLI_START_AGAIN = "Start a new one: rlm-mcp run QUESTION --path FILE --keep-session (or --context-id ID)."


def _session_phrased(exc: NotFoundError, session_id: str | None, settings: Settings) -> NotFoundError:
    """A session that cannot go on, said as a server says it over MCP ("Session ... was closed"
    for one `rlm-mcp sessions close` ended), with the fix in the CLI's terms."""
    from rlm_mcp.service import session_files
    from rlm_mcp.service.kept import START_AGAIN

    if session_id is None or exc.fix != START_AGAIN:
        return exc
    cause = exc.cause
    if (
        cause.startswith("Unknown session id")
        and session_files.closed_by(settings.store.data_dir, session_id) is not None
    ):
        cause = f"Session {session_id} was closed."
    return NotFoundError(cause, CLI_START_AGAIN)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def cost_text(usage: Usage) -> str | None:
    """What a run cost by the price table (RLM_MCP_MODEL_PRICES), or None when no model it
    called has a price there (no cost is ever guessed)."""
    cost = usage.total.cost_usd
    return f"${cost:.4f}" if cost is not None else None


def status_line(result: Any) -> str:
    """`run`'s last line: status, turns, sub-calls, tokens (prompt + completion), cost where
    priced, time, id, reason."""
    usage = Usage.of(result.usage)
    parts = [
        str(result.status),
        _count(result.iterations, "turn"),
        _count(result.sub_calls, "sub-call"),
        _count(usage.total.total, "token"),
        *filter(None, [cost_text(usage)]),
        f"{result.duration_s or 0:.1f} s",
        f"run {result.run_id}",
    ]
    if result.reason:
        parts.append(result.reason)
    return visible_line(" · ".join(parts))


def runs_table(records: list[RunRecord]) -> list[str]:
    """`runs list`: a header row, then id, start time, duration, cost ("-" when unpriced),
    status, query per run."""
    width = max((len(visible_line(r.run_id)) for r in records), default=6)
    lines = [f"{'RUN ID':<{width}}  {'STARTED':<19}  {'DURATION':>9}  {'COST':>9}  {'STATUS':<15} QUERY"]
    for r in records:
        started = datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S") if r.created_at else "?"
        duration = r.result.duration_s if r.result is not None else r.elapsed_s
        took = f"{duration:.1f} s" if duration is not None else "?"
        cost = cost_text(r.spent) or "-"
        query = " ".join(r.request.query.split())
        query = query if len(query) <= 60 else query[:59] + "…"
        status = visible_line(r.status)
        row = f"{visible_line(r.run_id):<{width}}  {started:<19}  {took:>9}  {cost:>9}  {status:<15}"
        lines.append(f"{row} {visible_line(query)}")
    return lines


def contexts_table(contexts: list[Any]) -> list[str]:
    """`contexts list`: a header row, then id, size, format and name per context."""
    width = max((len(c.context_id) for c in contexts), default=10)
    lines = [f"{'CONTEXT ID':<{width}}  {'BYTES':>14}  {'FORMAT':<6}  NAME"]
    for c in contexts:
        lines.append(f"{c.context_id:<{width}}  {c.bytes:>12,} B  {c.format:<6}  {visible_line(c.name)}")
    return lines


async def write_page(page: str, run_id: str, output: str | None) -> str | None:
    """`runs html`: write the page (default ./rlm-run-<id>.html) and return where; '-' prints it."""
    if output == "-":
        sys.stdout.write(page)
        return None
    target = await (await anyio.Path(output or f"rlm-run-{run_id}.html").expanduser()).resolve()
    await target.write_text(page, encoding="utf-8")
    return str(target)
