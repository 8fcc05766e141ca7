"""The process's side of the service: its long-lived parts and their lifecycle.

`RlmService` holds the parts (stores, LM client, sandbox manager, sessions, run backend), which
the assembly (rlm_mcp/assembly/) builds for this process's role and passes in, opens and closes
them, builds the engine at the first run and checks the LM endpoint, connecting to Docker and
the LM endpoint lazily so the MCP handshake never waits for either.

It has no tool-level operation: those take an owner, and live on `service.caller.Caller`, the
service as one owner sees it (`Caller(service, owner)`, which imports this module, never the
reverse). The helpers here that read owned state take the owner scope they are given, for the
viewer, which decides it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack

import anyio

from rlm_mcp.config import ServiceSettings, Transport
from rlm_mcp.engine import RLMEngine
from rlm_mcp.owners import Owner, OwnerScope
from rlm_mcp.ports.sessions import SessionView
from rlm_mcp.service.backends import RunBackend
from rlm_mcp.service.parts import ServiceParts, Sessions
from rlm_mcp.service.profile import choose_profile
from rlm_mcp.service.run_contexts import KnownContexts
from rlm_mcp.store import ContextInfo

logger = logging.getLogger("rlm_mcp.service")

Mode = Transport  # which transport this service answers (the owner rules differ)
_LM_CHECK_TTL_S = 60.0


class RlmService:
    def __init__(self, settings: ServiceSettings, parts: ServiceParts, *, mode: Mode = "stdio") -> None:
        """`parts`: the stores, LM client, sandboxes, sessions and run backend this process's role
        uses, built by the assembly (`rlm_mcp.assembly.build_service`); the service closes them."""
        self.settings = settings
        self.mode = mode
        self.stores = parts.stores
        self.contexts = self.stores.contexts
        self._known_contexts = KnownContexts(self.contexts)  # a team front's (`run_contexts`)
        self.uploads = self.stores.uploads
        self.records = self.stores.runs
        self.lm = parts.lm
        self.sandboxes = parts.sandboxes
        self.loader = parts.loader
        self._engine: RLMEngine | None = None
        self._engine_lock = anyio.Lock(fast_acquire=True)
        self._lm_checked_at = float("-inf")
        self._runs: RunBackend | None = None
        self._open_runs = parts.open_runs
        self._engine_settings = parts.engine
        self.sessions: Sessions = parts.sessions  # kept sessions, wherever this role keeps them
        self.webhooks = parts.webhooks
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> RlmService:
        await self._stack.__aenter__()
        try:
            await self._stack.enter_async_context(self.stores)  # closed last: runs record into it
            # Stopped after the runs: a run ended by the shutdown still gets its outbox row.
            await self._stack.enter_async_context(self.webhooks)
            await self._stack.enter_async_context(self.sandboxes)
            self._runs = await self._open_runs(self._stack, self.engine)
            # Closed before the runs: a session's REPL goes back to the sandboxes it came from.
            await self._stack.enter_async_context(self.sessions)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        # No enclosing shield here: the stack holds task groups, whose scopes must unwind in
        # order. Each part shields its own cleanup (runs record `cancelled`, sandboxes are removed).
        try:
            await self._stack.aclose()  # runs first, then sandboxes
        finally:
            with anyio.CancelScope(shield=True):
                await self.lm.aclose()

    async def engine(self) -> RLMEngine:
        # Built at the first run, not at start-up: choosing the profile may spawn a subprocess
        # (and fetch the reference once), and a bad profile should be a clear tool error.
        async with self._engine_lock:
            if self._engine is None:
                choice = await anyio.to_thread.run_sync(choose_profile, self.settings)
                if choice.fix:
                    logger.warning("prompt profile %s (%s). %s", choice.profile.name, choice.detail, choice.fix)
                else:
                    logger.info("prompt profile %s (%s)", choice.profile.name, choice.detail)
                self._engine = RLMEngine(self._engine_settings, self.lm, self.sandboxes.open, profile=choice.profile)
        return self._engine

    @property
    def runs(self) -> RunBackend:
        if self._runs is None:
            raise RuntimeError("RlmService used outside `async with`")
        return self._runs

    async def engine_for_runs(self) -> RLMEngine | None:
        """The engine, where runs execute in this process (None: a team front runs nothing)."""
        return await self.engine() if self.runs.local else None

    async def run_contexts(self, ids: Sequence[str], *, owner: Owner) -> list[ContextInfo]:
        """The contexts a run's start names, as its admission reads them: from the store where
        runs execute here, else as this team front last read them (`service.run_contexts`: the
        enqueue checks that the owner still holds them)."""
        if self.runs.local:
            return [await self.contexts.get(cid, owner=owner) for cid in ids]
        return await self._known_contexts.get(ids, owner=owner)

    async def check_ready_to_run(self) -> None:
        """Where runs execute here, the sandbox backend must be up (a team front's workers check
        their own)."""
        if self.runs.local:
            await self.sandboxes.ensure_ready()

    # --- helpers that take the owner scope they are given (the viewer's) -------------------

    async def sessions_of(self, owner: OwnerScope) -> list[SessionView]:
        """The sessions `owner` sees (without the usage summed from their runs' records)."""
        return await self.sessions.list(owner=owner)

    async def session_state(self, session_id: str, *, owner: OwnerScope) -> dict[str, object] | None:
        """What the viewer shows of a session beside its runs: `state` (running, saving, live,
        stored, ended) and its size and age, read without taking back a stored session; None when this
        process knows nothing of it. The caller has checked that `owner` sees the session's runs
        (why an ended session ended is kept without a way to ask whose it was)."""
        for view in await self.sessions_of(owner):  # the viewer sums the usage from the records it reads
            if view.session_id == session_id:
                return {**view.to_dict(), "state": view.state}
        why = self.sessions.why_ended(session_id)
        return {"session_id": session_id, "state": "ended", "why": why} if why is not None else None

    async def check_lm(self) -> None:
        """Fail before the run when the endpoint is down or lacks the model (cached briefly)."""
        now = time.monotonic()
        if now - self._lm_checked_at < _LM_CHECK_TTL_S:
            return
        await self.lm.check_model()
        self._lm_checked_at = now
