"""Host CPU per sandbox cell (run by hand: `.venv/bin/python bench/cell_cpu.py`). Needs Docker and the image.

CPU time (time.process_time) of this process per trivial cell and per cell making a 16-way
llm_query_batched against an instant bridge: the host-side cost of the attach stream, the reader
and writer threads and the hand-offs, less noisy than wall time on a loaded machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlm_mcp.ports import LMRequest
from rlm_mcp.sandbox.manager import SandboxManager
from tests.fixtures_sandbox import no_bridge, sandbox_settings


async def echo(req: LMRequest) -> list[str]:
    return ["x"] * len(req.prompts)


async def main() -> None:
    async with SandboxManager(sandbox_settings(pool_size=0).sandbox) as mgr:
        await mgr.ensure_ready()
        async with mgr.open([]) as sb:
            for _ in range(20):
                await sb.execute("x = 1", no_bridge)
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(300):
                await sb.execute("x = 1", no_bridge)
            print(
                f"trivial cell: cpu {(time.process_time() - c0) / 300 * 1e3:.3f} ms, wall {(time.perf_counter() - t0) / 300 * 1e3:.3f} ms"
            )
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(30):
                await sb.execute("r = llm_query_batched(['q'] * 16)", echo)
            print(
                f"16-way batch cell: cpu {(time.process_time() - c0) / 30 * 1e3:.3f} ms, wall {(time.perf_counter() - t0) / 30 * 1e3:.3f} ms"
            )


if __name__ == "__main__":
    anyio.run(main)
