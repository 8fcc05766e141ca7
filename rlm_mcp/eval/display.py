"""Live progress of an eval on stderr: a `rich` live panel on a terminal, plain lines otherwise.

Both show tasks done/total, running, the score so far, tokens and elapsed time; the panel also
shows each running task's latest progress line (turn, sub-calls, tokens).
"""

from __future__ import annotations

import sys
import time
from typing import IO, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rlm_mcp.eval.results import TaskResult
from rlm_mcp.visible import visible_line


class Tally:
    """Counts shared by both displays."""

    def __init__(self, total: int, already_done: list[TaskResult]) -> None:
        self.total = total
        self.results: list[TaskResult] = list(already_done)
        self.running: dict[str, str] = {}
        self.started = time.monotonic()

    @property
    def done(self) -> int:
        return sum(1 for r in self.results if r.mode == "rlm")

    def headline(self) -> str:
        rlm = [r for r in self.results if r.mode == "rlm"]
        mean = f"{100 * sum(r.score for r in rlm) / len(rlm):.1f}" if rlm else "–"
        tokens = sum(r.total_tokens for r in self.results)
        return (
            f"{self.done}/{self.total} done · {len(self.running)} running · score so far {mean} · "
            f"{tokens:,} tokens · {time.monotonic() - self.started:.0f} s"
        )


class Display(Protocol):
    tally: Tally

    def started(self, task_id: str) -> None: ...
    def update(self, task_id: str, message: str) -> None: ...
    def finished(self, result: TaskResult) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    """One line per finished task (for logs and CI)."""

    def __init__(self, tally: Tally, stream: IO[str] | None = None) -> None:
        self.tally = tally
        self._stream = stream or sys.stderr

    def started(self, task_id: str) -> None:
        self.tally.running[task_id] = "starting"

    def update(self, task_id: str, message: str) -> None:
        if task_id in self.tally.running:
            self.tally.running[task_id] = visible_line(message)

    def finished(self, result: TaskResult) -> None:
        if result.mode == "rlm":
            self.tally.running.pop(result.id, None)
        self.tally.results.append(result)
        print(
            f"[{result.mode}] {_shown(result)}, score {result.score:.2f} | {self.tally.headline()}",
            file=self._stream,
            flush=True,
        )

    def close(self) -> None:
        pass


class LiveDisplay(PlainDisplay):
    """A panel redrawn four times a second: the headline, then one row per running task."""

    def __init__(self, tally: Tally, console: Console | None = None) -> None:
        super().__init__(tally)
        self._console = console or Console(stderr=True)
        self._live = Live(get_renderable=self._render, console=self._console, refresh_per_second=4, transient=False)
        self._live.start()

    def _render(self) -> Group:
        table = Table(show_header=True, header_style="bold", expand=False, box=None)
        table.add_column("running task")
        table.add_column("progress")
        for task_id, message in list(self.tally.running.items()):
            table.add_row(Text(visible_line(task_id)), Text(message))
        return Group(Text(self.tally.headline(), style="bold"), table)

    def finished(self, result: TaskResult) -> None:
        if result.mode == "rlm":
            self.tally.running.pop(result.id, None)
        self.tally.results.append(result)
        self._console.print(
            f"[{result.mode}] {_shown(result)}, score {result.score:.2f}", markup=False, highlight=False
        )

    def close(self) -> None:
        self._live.stop()


def _shown(result: TaskResult) -> str:
    """'id: status', controls shown: task ids come from downloaded benchmark files."""
    return f"{visible_line(result.id)}: {visible_line(result.status)}"


def make_display(tally: Tally, *, live: bool | None = None) -> Display:
    """The live panel when stderr is a terminal (or `live` says so), else plain lines."""
    use_live = sys.stderr.isatty() if live is None else live
    return LiveDisplay(tally) if use_live else PlainDisplay(tally)
