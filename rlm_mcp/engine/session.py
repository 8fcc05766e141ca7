"""A kept session as the engine sees it: the REPL that outlives one run, for follow-up questions.

The layout is the reference's persistent mode (rlms 0.1.3, `RLM(persistent=True)` with its local
environment): run k's context(s) become the next `context_i` (`context` stays `context_0`), and
each finished root conversation is stored in the REPL as `history_k` (`history` is `history_0`).
Every variable the model built in earlier runs is still there. Each run's root conversation
starts afresh (system, metadata of this run's context, `Turn 1/N:` ...), and its turn messages
say how many contexts and earlier conversations the REPL holds.

How a run gets its sandbox (`SandboxSource`) is decided by whoever owns the REPL's state, never
by the engine: a new session opens a fresh sandbox and keeps it; a kept sandbox makes the next run
warm (it continues in it); a released one makes it a restore (a fresh sandbox, the contexts
reloaded, the namespace loaded from the snapshot), unless a team worker decides otherwise against
the database (`service/queue/sessions.py`). The engine only opens what it is given.

Two things the reference does not do, both invisible to the model's conversation:
- `answer` is reset to `{"content": "", "ready": False}` before a follow-up's first cell (the
  answer protocol here reads `answer` at the end of each cell, so a ready answer left by the
  previous run would otherwise end the follow-up at its first cell);
- the stored conversation is the list of messages the run's last root call was sent (the
  reference stores the same list: it appends the history before it would add the final reply).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Literal, Protocol

import anyio

from rlm_mcp.engine import messages as msg
from rlm_mcp.engine.snapshot import Snapshot, SnapshotUnavailable, restore_failed, restore_snapshot
from rlm_mcp.observability import metrics
from rlm_mcp.ports import ContextSpec, LMRequest, Sandbox, SandboxFactory

# Code the engine runs in the REPL between runs (never shown to the model). It binds no other
# name (no `import json` left behind: the REPL's variable listing must stay the reference's).
RESET_ANSWER = 'answer = {"content": "", "ready": False}'


def store_history_code(index: int, messages: list[dict[str, str]]) -> str:
    """The cell that binds one finished conversation as `history_{index}` (and `history` for 0)."""
    text = json.dumps(messages, ensure_ascii=True)
    code = f"history_{index} = __import__('json').loads({text!r})"
    if index == 0:
        code += "\nhistory = history_0"
    return code


async def no_bridge(request: LMRequest) -> list[str]:
    """The bridge of the engine's own cells between runs: they make no sub-calls."""
    return ["Error: no sub-calls here."] * len(request.prompts)


@dataclass(frozen=True)
class Opening:
    """What a run's sandbox is opened with: the engine's factory, the run's exit stack (a sandbox
    left on it closes with the run), this run's contexts, the child levels it may still start."""

    factory: SandboxFactory
    stack: AsyncExitStack
    contexts: Sequence[ContextSpec]
    levels_below: int
    chunk_chars: int  # per cell when a snapshot crosses into the sandbox


@dataclass(frozen=True)
class Opened:
    """A run's sandbox, the names a restore could not bring back, and the note the model gets
    first when the REPL is not what the session had (restarted, or restored from an older run)."""

    sandbox: Sandbox
    restored_lost: list[str] | None = None
    note: str | None = None


class SandboxSource(Protocol):
    """Where a run's sandbox comes from, already decided (warm, restored or fresh).

    `keeps`: the sandbox outlives the run (a session's REPL). The run then lets an opening it
    no longer needs finish (its first call failed): one cut off halfway would leave the REPL
    holding contexts the session does not count. A one-run sandbox is simply abandoned."""

    keeps: bool

    async def open(self, opening: Opening) -> Opened: ...


class OneRunSandbox:
    """A run outside any session (or a child run): its own sandbox, closed with the run."""

    keeps = False

    async def open(self, opening: Opening) -> Opened:
        factory = opening.factory(opening.contexts, levels_below=opening.levels_below)
        return Opened(await opening.stack.enter_async_context(factory))


ONE_RUN = OneRunSandbox()

# How the session's next run gets its sandbox: `fresh` (a new session), `warm` (its live REPL),
# `restore` (a fresh sandbox loaded from the snapshot and the histories).
NextRun = Literal["fresh", "warm", "restore"]


@dataclass
class SessionSandbox:
    """The live REPL of a kept session between its runs, and what it holds.

    `stack` owns the sandbox (its slot and container): closing it releases both. The engine fills
    it after a session's first run and reuses it on each follow-up; the session's owner (the
    service) closes it when the session ends, idles out or the server stops.
    """

    session_id: str
    sandbox: Sandbox | None = None
    stack: AsyncExitStack | None = None
    context_count: int = 0  # contexts bound so far: context_0 .. context_{n-1}
    history_count: int = 0  # conversations stored so far: history_0 .. history_{n-1}
    runs: int = 0  # runs that used this REPL
    contexts: list[ContextSpec] = field(default_factory=list)  # context_0, context_1, ... as bound
    # history_0, history_1, ... as stored: bound again when the REPL had to restart between runs.
    histories: list[list[dict[str, str]]] = field(default_factory=list)
    # The namespace as the sandbox was given back, serialized inside it (engine/snapshot.py): the
    # next run restores it in a fresh sandbox.
    snapshot: Snapshot | None = None
    snapshot_error: str | None = None  # why the last attempt left no snapshot
    # Team mode: the runs the snapshot covers, when it was taken before the last runs ended (their
    # worker was lost before it stored a newer one); None: it covers every run.
    snapshot_runs: int | None = None
    # Decided where the REPL's state changes (`keep`, `release`) or by a team worker against the
    # database; the engine opens the sandbox this way (`open`) and never looks at the REPL itself.
    # A team session is restored even without a snapshot (its worker was lost before it stored
    # one): the contexts and histories come back, the variables do not (the first output says
    # so); embedded mode ends a session that has no snapshot instead.
    next_run: NextRun = "fresh"
    keeps = True  # a SandboxSource whose sandbox outlives the run

    def numbering(self) -> tuple[int, int, list[ContextSpec]]:
        """(contexts bound, conversations stored, the bound contexts) as this run's REPL will
        hold them once `open` has run: known before it runs, so the first root call can be
        written while the sandbox opens (a fresh sandbox starts the count again)."""
        if self.next_run == "fresh":
            return 0, 0, []
        return self.context_count, self.history_count, list(self.contexts)

    def bound(self, contexts: Sequence[ContextSpec]) -> None:
        """Count this run's contexts and the run itself, once its sandbox is open."""
        self.context_count += len(contexts)
        self.contexts.extend(contexts)
        self.runs += 1

    @property
    def partial(self) -> bool:
        """A restore brings back fewer runs' variables than the session has had."""
        return self.snapshot is None or (self.snapshot_runs is not None and self.snapshot_runs < self.runs)

    @property
    def live(self) -> bool:
        return self.sandbox is not None

    def keep(self, sandbox: Sandbox, stack: AsyncExitStack) -> None:
        """Take over an open sandbox (and what closes it) at the end of a run: the next run
        continues in it."""
        self.sandbox = sandbox
        self.stack = stack
        self.next_run = "warm"

    async def release(self) -> None:
        """Close the kept sandbox (idempotent; shielded: it runs at cancellation and shutdown). A
        session that has run is restored by its next run (from its snapshot, when one is kept)."""
        stack, self.stack, self.sandbox = self.stack, None, None
        if self.runs > 0:
            self.next_run = "restore"
        if stack is not None:
            with anyio.CancelScope(shield=True):
                await stack.aclose()

    # --- the session as a sandbox source (`SandboxSource`) ----------------------------------

    async def open(self, opening: Opening) -> Opened:
        """This run's sandbox, the way `next_run` says."""
        if self.next_run == "warm":
            return await self._warm(opening)
        if self.next_run == "restore":
            opened = await self._restore(opening)
            metrics.session_followup("restored")
            return opened
        return await self._fresh(opening)

    async def _warm(self, opening: Opening) -> Opened:
        """The session's live REPL, this run's contexts added, `answer` reset."""
        sandbox = self.sandbox
        if sandbox is None:  # `keep` and `release` set both: never without a bug
            raise RuntimeError(f"session {self.session_id}: a warm run without a live sandbox")
        metrics.session_followup("warm")
        await sandbox.add_contexts(opening.contexts)
        reset = await sandbox.execute(RESET_ANSWER, no_bridge)
        if not reset.restarted:
            return Opened(sandbox)
        # It had died since the last run (a cancelled cell, a crash): the histories come back.
        for index, messages in enumerate(self.histories):
            await sandbox.execute(store_history_code(index, messages), no_bridge)
        return Opened(sandbox, note=msg.session_restarted_note())

    async def _fresh(self, opening: Opening) -> Opened:
        """A new session's sandbox, kept past the run."""
        factory = opening.factory(opening.contexts, levels_below=opening.levels_below, kept=True)
        sandbox = await opening.stack.enter_async_context(factory)
        self.keep(sandbox, opening.stack.pop_all())  # outlives this run
        self.context_count = self.history_count = 0
        self.contexts.clear()
        self.histories.clear()
        return Opened(sandbox)

    async def _restore(self, opening: Opening) -> Opened:
        """A session whose sandbox was released: a fresh one, every context reloaded by id, the
        namespace restored from the snapshot (inside the sandbox), and the note for a restore that
        misses runs (team mode)."""
        factory = opening.factory([*self.contexts, *opening.contexts], levels_below=opening.levels_below, kept=True)
        sandbox = await opening.stack.enter_async_context(factory)
        lost = None
        if self.snapshot is not None:
            try:
                lost = await restore_snapshot(sandbox, self.snapshot, chunk_chars=opening.chunk_chars)
            except SnapshotUnavailable as exc:  # the run's stack closes the fresh sandbox: not the session's
                raise restore_failed(self.session_id, exc) from None
        self.keep(sandbox, opening.stack.pop_all())  # only a restored REPL becomes the session's
        if not self.partial:
            return Opened(sandbox, lost)
        for index, messages in enumerate(self.histories):  # those the snapshot missed come back
            await sandbox.execute(store_history_code(index, messages), no_bridge)
        return Opened(sandbox, lost, msg.session_partial_note(self.snapshot_runs if self.snapshot else 0))
