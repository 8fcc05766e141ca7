"""A benchmark's figures as a result file, `bench/results/NAME.json`: what the docs' Benchmarks
page shows (tools/docs_pages.py renders it with its machine, date and command), so a figure is
recorded by the run that measured it and never re-typed into prose."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    """This host in one line: CPUs, memory, OS and kernel, Python."""
    memory = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return (
        f"{os.cpu_count()} vCPUs, {memory}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


class ResultFile:
    """Rows gathered during a run, written once at its end."""

    def __init__(self, name: str, title: str, columns: list[str], note: str = "") -> None:
        self.name, self.title, self.columns, self.note = name, title, columns, note
        self.rows: list[list[str]] = []

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for the columns {self.columns}")
        self.rows.append([str(c) for c in cells])

    def write(self, folder: Path = RESULTS) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        described = machine() + (f"; {self.note}" if self.note else "")
        result = {
            "title": self.title,
            "command": " ".join(shlex.quote(a) for a in ["bench/" + Path(sys.argv[0]).name, *sys.argv[1:]]),
            "machine": described,
            "date": datetime.date.today().isoformat(),
            "columns": self.columns,
            "rows": self.rows,
        }
        path = folder / f"{self.name}.json"
        path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return path
