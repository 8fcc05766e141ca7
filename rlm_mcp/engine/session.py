"""A kept session as the engine sees it: the REPL that outlives one run, for follow-up questions.

The layout is the reference's persistent mode (rlms 0.1.3, `RLM(persistent=True)` with its local
environment): run k's context(s) become the next `context_i` (`context` stays `context_0`), and
each finished root conversation is stored in the REPL as `history_k` (`history` is `history_0`).
Every variable the model built in earlier runs is still there. Each run's root conversation
starts afresh (system, metadata of this run's context, `Turn 1/N:` ...), and its turn messages
say how many contexts and earlier conversations the REPL holds.

Two things the reference does not do, both invisible to the model's conversation:
- `answer` is reset to `{"content": "", "ready": False}` before a follow-up's first cell (the
  answer protocol here reads `answer` at the end of each cell, so a ready answer left by the
  previous run would otherwise end the follow-up at its first cell);
- the stored conversation is the list of messages the run's last root call was sent (the
  reference stores the same list: it appends the history before it would add the final reply).
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import anyio

from rlm_mcp.engine.snapshot import Snapshot
from rlm_mcp.ports import ContextSpec, Sandbox

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
    # Team mode: the session is continued from the database even without a snapshot (its worker
    # was lost before it stored one): the contexts and histories come back, the variables do not
    # (the first output says so). Embedded mode ends a session that has no snapshot instead.
    restore_bare: bool = False

    @property
    def restorable(self) -> bool:
        """A fresh sandbox can continue the session: it ran before and its REPL is gone."""
        return self.sandbox is None and self.runs > 0 and (self.snapshot is not None or self.restore_bare)

    @property
    def partial(self) -> bool:
        """A restore brings back fewer runs' variables than the session has had."""
        return self.snapshot is None or (self.snapshot_runs is not None and self.snapshot_runs < self.runs)

    @property
    def live(self) -> bool:
        return self.sandbox is not None

    def keep(self, sandbox: Sandbox, stack: AsyncExitStack) -> None:
        """Take over an open sandbox (and what closes it) at the end of a run."""
        self.sandbox = sandbox
        self.stack = stack

    async def release(self) -> None:
        """Close the kept sandbox (idempotent; shielded: it runs at cancellation and shutdown)."""
        stack, self.stack, self.sandbox = self.stack, None, None
        if stack is not None:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
