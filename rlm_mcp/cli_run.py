"""What `rlm-mcp run` and `rlm-mcp runs list|html` show a person (the argparse wiring is in cli.py).

Progress goes to stderr: a live, self-updating line (rich) on a terminal, one plain line per
update otherwise. The result goes to stdout: the answer and a summary line, or with `--json`
the whole result object for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from datetime import datetime
from typing import Any, TextIO

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError
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
        return self

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
    from rlm_mcp.cli_options import overrides_of
    from rlm_mcp.service.backends import for_one_off_command
    from rlm_mcp.service.service import RlmService

    settings = for_one_off_command(settings)
    # A relative --path means relative to where the command was typed.
    path = str(await (await anyio.Path(args.path).expanduser()).resolve()) if args.path else None
    with ProgressDisplay() as display:
        async with RlmService(settings, mode="stdio") as service:
            context_id: str | None = None
            if args.context_id:
                context_id = args.context_id
            elif path or args.url:
                info = await service.load_context(path=path, url=args.url, owner=LOCAL_OWNER)
                context_id = info.context_id
            elif not args.session:
                raise BadArgumentError(
                    "No context given.", "Pass --path, --url or --context-id (or --session to continue a kept session)."
                )
            overrides = overrides_of(args)
            result, session_id = await service.complete_in_session(
                args.query,
                context_id,
                overrides,
                display.report,
                owner=LOCAL_OWNER,
                keep_session=args.keep_session,
                session_id=args.session,
            )
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


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def status_line(result: Any) -> str:
    """`run`'s last line: status, turns, sub-calls, tokens (prompt + completion), time, id, reason."""
    tokens = Usage.of(result.usage).total.total
    parts = [
        str(result.status),
        _count(result.iterations, "turn"),
        _count(result.sub_calls, "sub-call"),
        _count(tokens, "token"),
        f"{result.duration_s or 0:.1f} s",
        f"run {result.run_id}",
    ]
    if result.reason:
        parts.append(result.reason)
    return visible_line(" · ".join(parts))


def runs_table(records: list[RunRecord]) -> list[str]:
    """`runs list`: id, start time, duration, status, query."""
    lines = []
    for r in records:
        started = datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S") if r.created_at else "?"
        duration = r.result.duration_s if r.result is not None else r.elapsed_s
        took = f"{duration:.1f} s" if duration is not None else "?"
        query = " ".join(r.request.query.split())
        query = query if len(query) <= 60 else query[:59] + "…"
        status = visible_line(r.status)
        lines.append(f"{visible_line(r.run_id)}  {started}  {took:>9}  {status:<15} {visible_line(query)}")
    return lines


async def write_page(page: str, run_id: str, output: str | None) -> str | None:
    """`runs html`: write the page (default ./rlm-run-<id>.html) and return where; '-' prints it."""
    if output == "-":
        sys.stdout.write(page)
        return None
    target = await (await anyio.Path(output or f"rlm-run-{run_id}.html").expanduser()).resolve()
    await target.write_text(page, encoding="utf-8")
    return str(target)
