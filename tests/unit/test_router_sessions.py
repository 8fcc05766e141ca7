"""rlm-mcp behind the real `vllm-router --policy sticky_least_loaded` (with an API key) over two
scripted backends: a run's root turns stay on one replica, a new run goes to the replica with
fewer live sessions, sub-calls key on a few sessions per run tree (not one per request), and every
session a run tree opened is finished at the router when the run ends, however it ends (the
router's own log of its session table is the witness)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.assembly.roles import run_ends
from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.lm.client import LMClient
from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import RunRecord, RunRequest
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import FakeSandboxFactory, make_limits, repl
from tests.fixtures_router import vllm_router

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")
KEY = "router-secret"
BATCH = 6
SUB_SESSIONS = 2
WORK = repl(
    f"r = llm_query_batched([f'part {{i}}' for i in range({BATCH})])\n"
    "c = rlm_query('child task: say ok')\nprint(len(r), c)"
)
DONE = repl('answer["content"] = "done"\nanswer["ready"] = True')
CHILD_DONE = repl('answer["content"] = "ok"\nanswer["ready"] = True')


def script(name: str) -> dict[str, Any]:
    return {
        "root": [WORK, DONE],
        "root_by_query": [
            {"match": "child task", "replies": [CHILD_DONE]},
            {"match": "hang here", "replies": [repl("block_forever()")]},
            {"match": "break here", "replies": [repl("raise ValueError('broken')")]},
        ],
        "sub_default": "fine",
        "server_header": name,
    }


@dataclass
class RouterLog:
    """The router's session table as its log tells it (`SLL: new session` / `finished session`)."""

    path: Path

    def _text(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.path.read_text(errors="replace"))

    def opened(self) -> dict[str, tuple[str, int]]:
        """session -> (replica, live sessions on that replica once it was placed)."""
        found = re.findall(
            r"SLL: new session '([^']+)' -> replica '([^']+)' \(active sessions on replica: (\d+)\)", self._text()
        )
        return {s: (replica, int(n)) for s, replica, n in found}

    def finish_order(self) -> list[str]:
        return re.findall(r"SLL: finished session '([^']+)'", self._text())

    def finished(self) -> set[str]:
        return set(self.finish_order())


@dataclass
class Rig:
    settings: Settings
    lm: LMClient
    runs: RunManager
    engine: RLMEngine
    context_id: str
    log: RouterLog
    servers: list[ScriptedLM]

    def request(self, query: str, **limits: Any) -> RunRequest:
        return RunRequest(
            query=query, context_ids=[self.context_id], limits=make_limits(self.settings, **limits), owner=ALICE
        )

    def replicas_of(self, session: str) -> set[str]:
        return {
            s.script.server_header or "?"
            for s in self.servers
            for r in s.requests_by_role("root")
            if r["status"] == 200 and r["session"] == session
        }


@asynccontextmanager
async def service_on(settings: Settings) -> AsyncIterator[tuple[LMClient, RunManager, RLMEngine, str]]:
    """The LM client (its router sessions ended by the run-end hook), the stores, a run manager
    and an engine on fake sandboxes, as the assembly wires them; and a stored context's id."""
    async with (
        LMClient(settings.lm, routing=settings.routing) as lm,
        make_stores(settings) as stores,
        RunManager(
            settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server), ends=run_ends(lm=lm)
        ) as runs,
    ):
        engine = RLMEngine(settings.engine, lm, FakeSandboxFactory(), system_prompt=RLM_MCP_SYSTEM_PROMPT)
        info = await stores.contexts.put_bytes(
            b"The magic number is 42.", name="ctx", format="text", source={"kind": "text"}, owner=ALICE
        )
        yield lm, runs, engine, info.context_id


@asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    servers = [ScriptedLM(script(f"b{i}")).start() for i in range(2)]
    log = tmp_path / "router.log"
    try:
        async with vllm_router(
            [s.root_url for s in servers], "--api-key", KEY, log=log, policy="sticky_least_loaded"
        ) as url:
            settings = make_settings(
                tmp_path,
                base_url=url,
                api_key=KEY,
                model="rlm-v0.1",
                max_depth=2,
                max_iterations=4,
                request_timeout_s=30.0,
                router_sessions=True,
                router_sub_sessions=SUB_SESSIONS,
            )
            async with service_on(settings) as (lm, runs, engine, context_id):
                yield Rig(settings, lm, runs, engine, context_id, RouterLog(log), servers)
    finally:
        for server in servers:
            server.stop()


def tree_sessions(run_id: str) -> set[str]:
    return {run_id, f"{run_id}.1", *(f"{run_id}~sub{k}" for k in range(SUB_SESSIONS))}


async def test_runs_stick_spread_by_sessions_and_finish_every_session_at_every_end(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        # A run that hangs in its first cell holds a session on one replica ...
        hanging = await r.runs.start(r.request("hang here"), r.engine)
        await wait_until(lambda: hanging.run_id in r.log.opened(), within_s=30, what="the hanging run's session")
        held_on, live = r.log.opened()[hanging.run_id]
        assert live == 1
        # ... so the next run goes to the other one, and all its root turns stay there.
        done = await r.runs.start(r.request("count the parts"), r.engine)
        await done.done.wait()
        assert done.progress.status == "completed"
        opened = r.log.opened()
        assert opened[done.run_id][0] != held_on
        assert len(r.replicas_of(done.run_id)) == 1 and len(r.replicas_of(f"{done.run_id}.1")) == 1
        # Its sub-calls (6) and its child's opened SUB_SESSIONS sessions, not one per request.
        assert {s for s in opened if s.startswith(done.run_id)} == tree_sessions(done.run_id)
        # Every session of the completed tree is finished: the root's, the child's, the sub-calls'.
        await wait_until(lambda: tree_sessions(done.run_id) <= r.log.finished(), within_s=30, what="finishes")
        # The child's session was finished when the child ended, before its tree's.
        order = r.log.finish_order()
        assert order.index(f"{done.run_id}.1") < order.index(done.run_id)

        # A cancelled run's session is finished too.
        await r.runs.cancel(hanging.run_id, wait_s=30)
        await wait_until(lambda: hanging.run_id in r.log.finished(), within_s=30, what="the cancelled run's finish")

        # An error end (a cell that keeps raising).
        broken = await r.runs.start(r.request("break here", max_errors=1), r.engine)
        await broken.done.wait()
        assert broken.progress.status == "error"
        await wait_until(lambda: broken.run_id in r.log.finished(), within_s=30, what="the error run's finish")

        # Each finish made the counts true again: a new run is placed as the only session of its replica.
        last = await r.runs.start(r.request("count the parts again"), r.engine)
        await last.done.wait()
        assert r.log.opened()[last.run_id][1] == 1
        opened, finished = r.log.opened(), r.log.finished()
        assert set(opened) <= finished, set(opened) - finished  # nothing left counted


async def test_an_end_told_by_another_process_finishes_the_keys_the_run_id_determines(tmp_path: Path) -> None:
    """A sweeper ending a lost worker's run (or a front cancelling one) sent nothing for it: its
    hook still finishes the run's own session and its sub-call sessions."""
    async with rig(tmp_path) as r:
        run_id = "run_lostworker0001"
        # The worker that ran it (its engine, straight on the client: no run-end hook here) ...
        from rlm_mcp.engine import RunProgress

        async def sink(event: Any) -> None:
            pass

        request = r.request("count the parts")
        from tests.fixtures_engine import make_context

        result = await r.engine.run(
            run_id=run_id,
            query=request.query,
            contexts=[make_context(tmp_path, name="lost")],
            limits=request.limits,
            progress=RunProgress(run_id=run_id, max_iterations=request.limits.max_iterations),
            emit=sink,
        )
        assert result.status == "completed"
        assert tree_sessions(run_id) <= set(r.log.opened())
        determined = {run_id, *(f"{run_id}~sub{k}" for k in range(SUB_SESSIONS))}
        assert f"{run_id}.1" in r.log.finished()  # its child's, when the child ended
        assert not determined & r.log.finished()
        # ... is gone; another process (its own client, nothing noted) tells the end.
        async with LMClient(r.settings.lm, routing=r.settings.routing) as other:
            record = RunRecord(run_id=run_id, created_at=0.0, request=request).ended("error", "its worker was lost")
            await run_ends(lm=other).ended(record)
        assert determined <= r.log.finished()


async def test_sub_calls_behind_another_router_open_and_finish_their_sessions_there(tmp_path: Path) -> None:
    """`RLM_MCP_SUB_BASE_URL` at a second router: root and child sessions live at the root's
    router, the sub-call sessions at the sub-calls' one, and each is told to finish its own."""
    servers = [ScriptedLM(script(f"b{i}")).start() for i in range(2)]
    try:
        async with (
            vllm_router([servers[0].root_url], log=tmp_path / "root.log", policy="sticky_least_loaded") as root_url,
            vllm_router([servers[1].root_url], log=tmp_path / "sub.log", policy="sticky_least_loaded") as sub_url,
        ):
            settings = make_settings(
                tmp_path,
                base_url=root_url,
                sub_base_url=sub_url,
                model="rlm-v0.1",
                max_depth=2,
                max_iterations=4,
                router_sessions=True,
                router_sub_sessions=SUB_SESSIONS,
            )
            async with service_on(settings) as (_, runs, engine, context_id):
                limits = make_limits(settings)
                run = await runs.start(
                    RunRequest(query="count the parts", context_ids=[context_id], limits=limits, owner=ALICE),
                    engine,
                )
                await run.done.wait()
                assert run.progress.status == "completed"
        at_root, at_sub = RouterLog(tmp_path / "root.log"), RouterLog(tmp_path / "sub.log")
        subs = {f"{run.run_id}~sub{k}" for k in range(SUB_SESSIONS)}
        assert set(at_root.opened()) == {run.run_id, f"{run.run_id}.1"} <= at_root.finished()
        assert set(at_sub.opened()) == subs <= at_sub.finished()
    finally:
        for server in servers:
            server.stop()
