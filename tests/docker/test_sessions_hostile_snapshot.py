"""Kept sessions whose own cells attack their snapshot (the real sandbox, embedded mode).

A session's cells run in the interpreter that later serializes its namespace, so they can replace
whatever that code uses. The host bounds what it reads whatever the sandbox claims, a snapshot
stops at its deadline (RLM_MCP_CELL_TIMEOUT_S + RLM_MCP_SESSION_SNAPSHOT_WAIT_S) and is taken in
a task of the session manager, never in the task of the run that needs the slot; the idle sweep
handles each session on its own; `rlm_close_session` ends a session that is saving; a restore
that fails inside the fresh sandbox leaves the session without that sandbox, its snapshot kept."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import build_service
from rlm_mcp.owners import LOCAL_OWNER, Owner
from rlm_mcp.ports.sessions import SAVING
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_engine import cell, submit
from tests.fixtures_sandbox import docker_image
from tests.fixtures_sessions import SLOW_PIECES, dill_image
from tests.fixtures_surface import make_settings

__all__ = ["dill_image", "docker_image"]

pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.usefixtures("dill_image")]

# The in-sandbox size check (`len(blob) > limit` in `_rlm_take`) sees 0; the size printed after it
# is the true one: 400 KB of base64 against a 64 KiB limit.
LYING_LEN = (
    "import builtins, sys\n"
    "_real_len = builtins.len\n"
    "def _len(o):\n"
    "    return 0 if sys._getframe(1).f_code.co_name == '_rlm_take' else _real_len(o)\n"
    "builtins.len = _len\n"
    "big = 'y' * 300000\n"
    "print('ok')"
)
SCRIPT = Script(
    root=[submit('"plain"')],
    root_by_query=[
        RootScript(match="LIE-Q", replies=[cell(LYING_LEN), submit('"lied"')]),
        RootScript(match="SLOW-Q", replies=[cell(SLOW_PIECES), submit('"slow"')]),
        RootScript(match="KEEP-Q", replies=[cell("kept = 41"), submit('"kept"')]),
        RootScript(match="AGAIN-Q", replies=[submit("str(kept + 1)")]),
    ],
)


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


async def test_a_claim_past_the_snapshot_limit_is_refused_by_the_host(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(
            tmp_path, lm.base_url, pool_size=0, max_sandboxes=1, session_snapshot_max_bytes=64 << 10
        )
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            ctx = await local.load_context(text="alpha")
            one, sid = await local.complete_in_session(
                "LIE-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert one.answer == "lied" and sid is not None
            assert await service.sessions.reclaim()  # its sandbox is given back: the snapshot is refused
            with pytest.raises(Exception, match="could not be saved .*claims a snapshot of .*SNAPSHOT_MAX_BYTES"):
                await local.start_run("AGAIN-Q", None, RunOverrides(), session_id=sid)
        # Nothing of it was kept on this host either.
        assert not [p for p in (tmp_path / "data" / "sessions").iterdir() if p.stat().st_size > 64 << 10]


async def test_a_slow_snapshot_holds_no_other_run_and_close_ends_it(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        # Deadline 5 + 25 s: far longer than the other owner's run may wait (2 s).
        settings = make_settings(
            tmp_path,
            lm.base_url,
            pool_size=0,
            max_sandboxes=1,
            cell_timeout_s=5,
            cell_output_bytes=8192,
            session_snapshot_wait_s=25,
            run_queue_timeout_s=60,
        )
        async with build_service(settings) as service:
            alice, bob = Caller(service, Owner("alice")), Caller(service, Owner("bob"))
            ctx = await alice.load_context(text="alpha")
            slow, sid = await alice.complete_in_session(
                "SLOW-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert slow.answer == "slow" and sid is not None
            theirs = await bob.load_context(text="beta")
            # Bob's run needs the only slot: alice's idle session gives it back, its snapshot taken
            # in the session manager's task. Bob's run waits for the slot only as long as its own
            # timeout allows (it used to wait, shielded, for the whole snapshot).
            with anyio.fail_after(20):
                waited = await bob.complete("OTHER-Q", theirs.context_id, RunOverrides(timeout_s=2), _quiet)
            assert waited.status == "timeout", waited
            assert (await alice.session(sid))["running"] == SAVING
            # The owner closes the saving session: it ends at once and the slot comes back.
            with anyio.fail_after(20):
                closed = await alice.close_session(sid)
            assert closed["session_id"] == sid
            with pytest.raises(Exception, match=f"Session {sid} was closed"):
                await alice.start_run("AGAIN-Q", None, RunOverrides(), session_id=sid)
            with anyio.fail_after(20):
                after = await bob.complete("OTHER-Q", theirs.context_id, RunOverrides(), _quiet)
            assert after.answer == "plain"


async def test_the_sweep_releases_each_session_on_its_own_and_a_snapshot_stops_at_its_deadline(
    tmp_path: Path,
) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            pool_size=0,
            max_sandboxes=2,
            cell_timeout_s=4,
            cell_output_bytes=8192,
            session_snapshot_wait_s=16,  # with the cell timeout: a snapshot is cut at 20 s
            session_idle_s=1,
        )
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            ctx = await local.load_context(text="alpha")
            _, slow = await local.complete_in_session(
                "SLOW-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            _, kept = await local.complete_in_session(
                "KEEP-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert slow is not None and kept is not None

            async def released_beside_the_slow_one() -> bool:
                other = await local.session(kept)
                return other["sandbox_live"] is False and (await local.session(slow))["running"] == SAVING

            # The slow session's snapshot (a minute, cut at 20 s) does not hold the other's back: the other
            # run's cold start, its idle second and its own snapshot fit in that on a loaded machine.
            await wait_until(released_beside_the_slow_one, within_s=22, what="the other session released first")
            assert isinstance((await local.session(kept))["snapshot_bytes"], int)

            async def slow_ended() -> bool:
                return service.sessions.why_ended(slow) is not None

            await wait_until(slow_ended, within_s=60, what="the slow snapshot stopped at its deadline")
            with pytest.raises(Exception, match=f"Session {slow} ended after .*did not finish within 20 s"):
                await local.start_run("AGAIN-Q", None, RunOverrides(), session_id=slow)
            again = await local.complete_in_session("AGAIN-Q", None, RunOverrides(), _quiet, session_id=kept)
            assert again[0].answer == "42"


async def test_a_failed_restore_leaves_the_session_its_snapshot_not_the_empty_sandbox(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0, max_sandboxes=1)
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            ctx = await local.load_context(text="alpha")
            _, sid = await local.complete_in_session(
                "KEEP-Q", ctx.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
            assert await service.sessions.reclaim()
            snap = tmp_path / "data" / "sessions" / f"{sid}.snap"
            good = snap.read_bytes()
            snap.write_bytes(b"not a pickle at all")  # loading it fails inside the fresh sandbox
            with pytest.raises(Exception, match=f"Session {sid} could not be restored in a fresh sandbox"):
                await local.complete_in_session("AGAIN-Q", None, RunOverrides(), _quiet, session_id=sid)
            described = await local.session(sid)
            assert described["sandbox_live"] is False and described["snapshot_bytes"] == len(good)  # kept
            snap.write_bytes(good)  # the cause fixed: the next follow-up restores it
            again, _ = await local.complete_in_session("AGAIN-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert again.answer == "42"
