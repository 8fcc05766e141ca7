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
        if self._status is not None:
            self._status.update(message)
        else:
            print(message, file=self._stream, flush=True)


async def one_run(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_options import overrides_of
    from rlm_mcp.service.service import RlmService

    # A relative --path means relative to where the command was typed.
    path = str(await (await anyio.Path(args.path).expanduser()).resolve()) if args.path else None
    with ProgressDisplay() as display:
        async with RlmService(settings, mode="stdio") as service:
            if args.context_id:
                context_id = args.context_id
            else:
                info = await service.load_context(path=path, url=args.url)
                context_id = info.context_id
            overrides = overrides_of(args)
            result = await service.complete(args.query, context_id, overrides, display.report)
    if args.json:
        print(json.dumps(result.model_dump(), indent=2))
    else:
        print(result.answer if result.answer is not None else "")
        tokens = result.usage.get("total", {}).get("total", 0) if isinstance(result.usage, dict) else 0
        print(
            f"{result.status} · {result.iterations} turns · {result.sub_calls} sub-calls · {tokens} tokens · "
            f"{result.duration_s or 0:.1f} s · run {result.run_id}" + (f" · {result.reason}" if result.reason else ""),
            file=sys.stderr,
        )
    return 0 if result.status == "completed" else 1


def runs_table(summaries: list[dict[str, Any]]) -> list[str]:
    """`runs list`: id, start time, duration, status, query."""
    lines = []
    for s in summaries:
        created = s.get("created_at")
        started = (
            datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M:%S") if isinstance(created, (int, float)) else "?"
        )
        raw_result = s.get("result")
        result: dict[str, Any] = raw_result if isinstance(raw_result, dict) else {}
        duration = result.get("duration_s", s.get("duration_s"))
        took = f"{duration:.1f} s" if isinstance(duration, (int, float)) else "?"
        query = " ".join(str(s.get("query", "")).split())
        query = query if len(query) <= 60 else query[:59] + "…"
        lines.append(f"{s.get('run_id')}  {started}  {took:>9}  {str(s.get('status', '?')):<15} {query}")
    return lines


async def write_page(page: str, run_id: str, output: str | None) -> str | None:
    """`runs html`: write the page (default ./rlm-run-<id>.html) and return where; '-' prints it."""
    if output == "-":
        sys.stdout.write(page)
        return None
    target = await (await anyio.Path(output or f"rlm-run-{run_id}.html").expanduser()).resolve()
    await target.write_text(page, encoding="utf-8")
    return str(target)
