"""Issue 14 item 6: host memory stays bounded while sandboxes flood it with huge frames.

Four real sandboxes each send 60 MB log frames (legal in size for an exec_result, not for a
log). Before the first fix each frame was buffered, copied and parsed: host RSS went from 83 MB
to 1.6 GB. Before the second, each got a zeroed 60 MB buffer before its type was checked (CI saw
228 MiB). Now the type is checked on the first 64 bytes: growth is about 0, and one 60 MB buffer
would fail the bound. The host's RSS is sampled from /proc while they flood.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from tests.fixtures_sandbox import no_bridge, ready_manager, text_context

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

FLOOD = (
    "import gc\nk = [o for o in gc.get_objects() if type(o).__name__ == 'Kernel'][0]\n"
    "big = 'x' * 60_000_000\nfor _ in range(4):\n    k.send({'type': 'log', 'id': 0, 'message': big})"
)
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * PAGE


class RssSampler:
    """The peak resident size of this process while it runs, sampled every 10 ms."""

    def __init__(self) -> None:
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def test_huge_log_frames_from_four_sandboxes_keep_host_memory_bounded(tmp_path: Path) -> None:
    async with (
        ready_manager(pool_size=0, sandbox_memory="1g", cell_timeout_s=60) as mgr,
        mgr.open([text_context(tmp_path, "a", "a.txt")]) as s1,
        mgr.open([text_context(tmp_path, "b", "b.txt")]) as s2,
        mgr.open([text_context(tmp_path, "c", "c.txt")]) as s3,
        mgr.open([text_context(tmp_path, "d", "d.txt")]) as s4,
    ):
        boxes = [s1, s2, s3, s4]
        results: list[object] = [None] * 4
        baseline = _rss()

        async def flood(i: int) -> None:
            results[i] = await boxes[i].execute(FLOOD, no_bridge)

        with RssSampler() as sampler:
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(flood, i)
        growth = sampler.peak - baseline
        assert growth < 40 << 20, f"host RSS grew by {growth >> 20} MiB"
        for r in results:
            # The frame is refused from its first bytes: the sandbox is replaced, the run goes on.
            assert r.restarted and "log frame of 6000" in (r.notice or "") + (r.error or "")  # type: ignore[attr-defined]
        for box in boxes:
            r = await box.execute("print(len(context))", no_bridge)
            assert r.error is None and r.stdout == "1\n"
