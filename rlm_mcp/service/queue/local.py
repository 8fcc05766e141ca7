"""The local lane of a `both` replica: the runs its front queues that its own worker executes,
followed in-process instead of through the database's announcements.

A `both` replica's front offers a run it starts to its own worker when that worker has room now
(a free run slot and sandbox slot, its lease current: `Claims.has_room`). The run is queued as
any run (the same row, claim, attempt and fencing: the lane never bypasses the queue), preferred
for this worker for `window_s` (RLM_MCP_QUEUE_POLL_S) and announced to no other worker; this
worker is woken in-process and claims it at once (no spreading wait). Once it has, what its
announcements carry (each live summary, the final record) it also hands to the front here, after
the write committed, so the front neither LISTENs to the run's channel nor decodes its
announcements; a front's follow of its progress reaches the worker in-process too (`follow`).
Every other outcome is the queue's usual path, taken late: the front LISTENs to the
run and reads its row (what was announced before is in the row) when
- the window ends before this worker claimed the run (busy with older runs): the other workers are
  told it is queued then, and may claim it once the preference lapses;
- the run's execution here ends without a final record this worker's write made (stopped by its
  fence, handed back at shutdown, ended by another path or another process).
A follow said in-process is said again through the queue then (the next worker's claim reads it).

Set RLM_MCP_QUEUE_LOCAL_FIRST=false to queue every run for any worker, as a front-only replica does.
"""

from __future__ import annotations

from collections.abc import Callable

from rlm_mcp.ports.runs import RunRecord


class LocalLane:
    """The link between one process's front and its worker (both hold it)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # The worker's: whether it could take a run now, and its id then; and its in-process wake-up.
        self.room: Callable[[], int | None] = lambda: None
        self.wake_worker: Callable[[], None] = lambda: None
        self.mark_followed: Callable[[str], None] = lambda run_id: None  # the worker's follow notes
        # The front's: what an announcement of a run taken here carries, and the late fall-back.
        self.deliver: Callable[[str, RunRecord], None] = lambda run_id, record: None
        self.fall_back: Callable[[str], None] = lambda run_id: None
        self._offered: set[str] = set()  # offered by the front, not taken (yet) by the worker
        self._taken: set[str] = set()  # executing here, announced to the front in-process, not ended yet

    def offer(self, run_id: str) -> int | None:
        """The worker to prefer for a run the front is about to queue (None: no room, queue it
        as any run); the run counts as offered from now on (`withdraw` if its enqueue fails)."""
        worker_id = self.room()
        if worker_id is not None:
            self._offered.add(run_id)
        return worker_id

    def withdraw(self, run_id: str) -> None:
        self._offered.discard(run_id)

    def take(self, run_id: str) -> bool:
        """The worker claimed the run: True when it was offered here and not given up on, so
        its announcements go to the front in-process from now on (`announce`, `released`)."""
        if run_id not in self._offered:
            return False
        self._offered.discard(run_id)
        self._taken.add(run_id)
        return True

    def lapsed(self, run_id: str) -> bool:
        """The front's window for the run ended: True when the worker has not taken it (it never
        will here: the front follows it through the queue from now on)."""
        if run_id not in self._offered:
            return False
        self._offered.discard(run_id)
        return True

    def follow(self, run_id: str) -> bool:
        """A front follows the run's progress turn by turn: True when the run is offered or
        taken here, and the worker was told in-process (its live summaries at the followed
        interval); False: say it through the queue."""
        if run_id not in self._offered and run_id not in self._taken:
            return False
        self.mark_followed(run_id)
        return True

    def announce(self, run_id: str, record: RunRecord) -> None:
        """What the run's announcement carried (a live summary, or a final record this worker's
        end write made), once the write committed."""
        if run_id not in self._taken:
            return
        if record.done:  # nothing more to hand over, and no fall-back at its release
            self._taken.discard(run_id)
        self.deliver(run_id, record)

    def released(self, run_id: str) -> None:
        """The run's execution here ended: without a final record delivered, the front reads
        its row (and follows it: another worker may take it up)."""
        if run_id in self._taken:
            self._taken.discard(run_id)
            self.fall_back(run_id)
