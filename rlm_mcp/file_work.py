"""Where a piece of file work runs: on the event loop when it is small, in a worker thread when
it is not. The one owner of that rule (run records and logs, child prompt files).

A small write (a few KiB into the page cache, a rename, an unlink) takes microseconds; the hop to
a worker thread and back costs more, milliseconds on a loaded machine, and the run waits for it
when the work is on its path (its record before it starts, its final record before the caller
wakes, a child's prompt before the child starts). Large work still leaves the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio

INLINE_FILE_BYTES = 64 << 10  # up to this many bytes, file work runs on the event loop

R = TypeVar("R")


async def small_here(size: int, work: Callable[[], R]) -> R:
    """Run `work` (which touches about `size` bytes of files) here when it is small, else in a
    worker thread that runs to its end even if the caller is cancelled (a half-written file must
    reach its rename or its cleanup)."""
    if size <= INLINE_FILE_BYTES:
        return work()
    return await anyio.to_thread.run_sync(work)
