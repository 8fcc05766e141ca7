"""Host pids of a gVisor sandbox while its cell forks up to RLM_MCP_SANDBOX_PIDS. Run by hand:

    .venv/bin/python bench/gvisor_pids.py [--pids 32] [--sandboxes 6] [--pattern exit|busy] [--unbounded]

Needs Docker with runsc registered and the sandbox image. Each sandbox runs three cells of a
pattern: `exit`, children that exit at once until a fork is refused (the gVisor test's cell);
`busy`, children that spin half a second on three threads until a fork is refused, then are
waited for. A thread polls the container's pids cgroup (`pids.current`, cgroup v1 or v2) each
millisecond for its peak. Printed per sandbox: the pids at rest, the host limit
(`engine.pids_limit`), the peak, the cgroup's count of refusals at its limit, and whether a cell
lost its sandbox (gVisor's kernel dies when the host limit refuses one of its threads).
`--unbounded` raises the host limit far above the peak, to read the peak itself.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlm_mcp.sandbox.docker import engine
from tests.fixtures_sandbox import container_id, no_bridge, ready_manager

EXIT = (
    "import os\nn = 0\ntry:\n    for _ in range(500):\n        if os.fork() == 0:\n            os._exit(0)\n"
    "        n += 1\nexcept BlockingIOError:\n    print('refused')\nprint(n)"
)
BUSY = (
    "import os, threading, time\n"
    "def spin():\n    t = time.monotonic()\n    while time.monotonic() - t < 0.5:\n        pass\n"
    "kids = []\ntry:\n    for _ in range(500):\n        pid = os.fork()\n        if pid == 0:\n"
    "            try:\n                for t in [threading.Thread(target=spin) for _ in range(2)]:\n"
    "                    t.start()\n            except RuntimeError:\n                pass\n"
    "            spin()\n            os._exit(0)\n        kids.append(pid)\n"
    "except BlockingIOError:\n    print('refused')\nfor k in kids:\n    os.waitpid(k, 0)\nprint(len(kids))"
)


def pids_dir(cid: str) -> Path:
    """The container's pids cgroup: cgroup v1, or v2 under systemd's or cgroupfs' driver."""
    for candidate in (
        Path(f"/sys/fs/cgroup/pids/docker/{cid}"),
        Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"),
        Path(f"/sys/fs/cgroup/docker/{cid}"),
    ):
        if (candidate / "pids.current").exists():
            return candidate
    raise SystemExit(f"no pids cgroup found for container {cid[:12]}")


class Peak:
    """The highest `pids.current` seen while it runs."""

    def __init__(self, cgroup: Path) -> None:
        self.cgroup = cgroup
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, int((self.cgroup / "pids.current").read_text()))
            except OSError:  # the container is gone
                return
            time.sleep(0.001)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def refusals(cgroup: Path) -> str:
    try:
        return (cgroup / "pids.events").read_text().split()[-1]
    except OSError:
        return "?"


async def main(args: argparse.Namespace) -> None:
    if args.unbounded:
        engine.GVISOR_PIDS_PER_GUEST = 256
    cell = BUSY if args.pattern == "busy" else EXIT
    async with ready_manager(pool_size=0, sandbox_runtime="runsc", sandbox_pids=args.pids, cell_timeout_s=120) as mgr:
        for n in range(args.sandboxes):
            async with mgr.open([]) as sb:
                cgroup = pids_dir(container_id(sb.container))
                rest = int((cgroup / "pids.current").read_text())
                limit = (cgroup / "pids.max").read_text().strip()
                lost = False
                with Peak(cgroup) as peak:
                    for _ in range(3):
                        result = await sb.execute(cell, no_bridge)
                        lost = lost or result.restarted
                print(
                    f"sandbox {n + 1}/{args.sandboxes}: at rest {rest}, limit {limit}, peak {peak.peak}, "
                    f"refused at the limit {refusals(cgroup)}, {'LOST' if lost else 'lived'}",
                    flush=True,
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pids", type=int, default=32, help="RLM_MCP_SANDBOX_PIDS of the sandboxes")
    parser.add_argument("--sandboxes", type=int, default=6, help="sandboxes, one after another")
    parser.add_argument("--pattern", choices=["exit", "busy"], default="exit")
    parser.add_argument("--unbounded", action="store_true", help="a host limit far above the peak")
    anyio.run(main, parser.parse_args())
