"""Durable kept sessions: after each run the sandbox snapshots its namespace (dill, inside the
sandbox); a session whose sandbox was released under slot pressure is restored in a fresh one,
and the first REPL output of that run names what could not be saved. Needs the sandbox image
with python3-dill (both build paths install it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from rlm_mcp.assembly import build_service
from rlm_mcp.owners import LOCAL_OWNER, Owner
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.testing.script import RootScript, Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import cli
from tests.fixtures_engine import cell, submit
from tests.fixtures_sandbox import docker_image
from tests.fixtures_sessions import dill_image
from tests.fixtures_surface import make_settings

__all__ = ["dill_image", "docker_image"]

pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.usefixtures("dill_image")]


BUILD = (
    "import collections\ncounts = collections.Counter(context.split())\n"
    "def top(n):\n    return [w for w, _ in counts.most_common(n)]\n"
    "gen = (i for i in range(3))\nprint(top(1))"
)
SCRIPT = Script(
    root=[submit('"plain"')],
    root_by_query=[
        RootScript(match="BUILD-Q", replies=[cell(BUILD), submit("top(1)[0]")]),
        RootScript(
            match="AGAIN-Q",
            replies=[
                cell("print(counts['alpha'], top(1), len(history), context_1[:4])"),
                submit("f\"{counts['alpha']}|{top(1)[0]}|{len(history_0)}|{context_1[:4]}|{'gen' in globals()}\""),
            ],
        ),
        RootScript(match="THIRD-Q", replies=[submit("f\"{counts['beta']}|{len(history_1)}\"")]),
    ],
)


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _session_metrics() -> dict[str, float]:
    """The kept-session series of this process's /metrics (counters only grow: compare deltas)."""
    return {
        "warm": _metric("rlm_mcp_session_followups_total", how="warm"),
        "restored": _metric("rlm_mcp_session_followups_total", how="restored"),
        "snapshots": _metric("rlm_mcp_session_snapshot_bytes_count"),
        "snapshot_bytes": _metric("rlm_mcp_session_snapshot_bytes_sum"),
        "snapshot_s": _metric("rlm_mcp_session_snapshot_seconds_count"),
        "live": _metric("rlm_mcp_sessions_open", mode="embedded", state="live"),
        "released": _metric("rlm_mcp_sessions_open", mode="embedded", state="released"),
    }


def _grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


async def test_a_released_session_is_restored_from_its_snapshot(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0, max_sandboxes=1, run_queue_timeout_s=30)
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            first = await local.load_context(text="alpha beta alpha gamma alpha")
            second = await local.load_context(text="more text")
            at_start = _session_metrics()
            one, sid = await local.complete_in_session(
                "BUILD-Q", first.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert one.answer == "alpha" and sid is not None
            assert (await local.session(sid))["snapshot_bytes"] is None  # none while live
            opened = _grew(at_start, _session_metrics())
            assert (opened["live"], opened["released"], opened["warm"], opened["restored"]) == (1, 0, 0, 0), opened

            # Another run needs the only sandbox slot: the idle session gives it back as a snapshot.
            plain = await local.complete("OTHER-Q", first.context_id, RunOverrides(), _quiet)
            assert plain.answer == "plain"
            described = await local.session(sid)
            assert described["snapshot_error"] is None, described
            assert described["sandbox_live"] is False
            assert isinstance(described["snapshot_bytes"], int) and described["snapshot_bytes"] > 0
            released = _grew(at_start, _session_metrics())
            assert (released["live"], released["released"], released["snapshots"]) == (0, 1, 1), released
            assert released["snapshot_bytes"] == described["snapshot_bytes"] and released["snapshot_s"] == 1

            two, _ = await local.complete_in_session(
                "AGAIN-Q", second.context_id, RunOverrides(), _quiet, session_id=sid
            )
            assert two.status == "completed"
            assert two.answer == "3|alpha|6|more|False"  # restored: counts, a function, history; gen could not be
            three, _ = await local.complete_in_session("THIRD-Q", None, RunOverrides(), _quiet, session_id=sid)
            assert three.answer == "1|6"  # the warm path again, with the second conversation stored
            # /metrics: one follow-up restored from the snapshot, one warm; the session live again.
            followed = _grew(at_start, _session_metrics())
            assert (followed["restored"], followed["warm"], followed["live"], followed["released"]) == (1, 1, 1, 0)

        outputs = [m["content"] for r in lm.requests_by_role("root") for m in r["body"]["messages"]]
        lost = [o for o in outputs if "could not be saved" in o]
        assert lost and all("are gone: gen." in o for o in lost)
        # Named once: in run 2's first REPL output only (later requests repeat that same message).
        assert len(set(lost)) == 1 and lost[0].startswith("REPL output:")


async def test_a_snapshot_past_the_owners_cap_is_not_kept(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(
            tmp_path,
            lm.base_url,
            pool_size=0,
            max_sandboxes=1,
            run_queue_timeout_s=30,
            session_snapshot_bytes_per_owner=16,
        )
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            first = await local.load_context(text="alpha beta alpha gamma alpha")
            _, sid = await local.complete_in_session(
                "BUILD-Q", first.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
            assert await service.sessions.reclaim()  # its sandbox is given back: the snapshot is over the cap
            with pytest.raises(Exception, match="could not be saved .*RLM_MCP_SESSION_SNAPSHOT_BYTES_PER_OWNER=16"):
                await local.start_run("AGAIN-Q", None, RunOverrides(), session_id=sid)


async def test_a_session_outlives_its_server_and_is_taken_back_by_the_next(tmp_path: Path) -> None:
    with ScriptedLM(SCRIPT) as lm:
        settings = make_settings(tmp_path, lm.base_url, pool_size=0)
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            first = await local.load_context(text="alpha beta alpha gamma alpha")
            second = await local.load_context(text="more text")
            _, sid = await local.complete_in_session(
                "BUILD-Q", first.context_id, RunOverrides(), _quiet, keep_session=True
            )
            assert sid is not None
        # The server stopped: the session was snapshotted into the data dir, owner-private.
        stored = tmp_path / "data" / "sessions"
        assert sorted(p.suffix for p in stored.iterdir()) == [".json", ".snap"]
        assert all(p.stat().st_mode & 0o077 == 0 for p in stored.iterdir())

        assert (
            settings.sandbox.instance_id is not None
        )  # make_settings names the instance: its sandboxes are found by it
        async with build_service(
            settings.model_copy(update={"instance_id": settings.sandbox.instance_id + "b"})
        ) as service:
            local, mallory = Caller(service, LOCAL_OWNER), Caller(service, Owner("mallory"))
            listed = await local.list_sessions()
            assert [(s["session_id"], s["stored"]) for s in listed] == [(sid, True)]
            assert await mallory.list_sessions() == []
            with pytest.raises(Exception, match=f"Unknown session id '{sid}'"):
                await mallory.start_run("AGAIN-Q", None, RunOverrides(), session_id=sid)
            two, _ = await local.complete_in_session(
                "AGAIN-Q", second.context_id, RunOverrides(), _quiet, session_id=sid
            )
            assert two.status == "completed"
            assert two.answer == "3|alpha|6|more|False"  # counts, top() and history_0 came back; context_1 is new
        assert (stored / f"{sid}.json").exists()  # stored again as that server stopped


def test_the_cli_keeps_a_session_between_commands(tmp_path: Path, dill_image: str) -> None:
    (tmp_path / "doc.txt").write_text("alpha beta alpha gamma alpha", encoding="utf-8")
    (tmp_path / "more.txt").write_text("more text", encoding="utf-8")
    with ScriptedLM(SCRIPT) as lm:
        env = {"RLM_MCP_BASE_URL": lm.base_url, "RLM_MCP_SANDBOX_IMAGE": dill_image}
        one = cli(tmp_path, "run", "BUILD-Q", "--path", str(tmp_path / "doc.txt"), "--keep-session", **env)
        assert one.returncode == 0, one.stderr
        match = re.search(r"session (ses_[0-9a-f]{20}) kept", one.stderr)
        assert match, one.stderr
        sid = match[1]
        listed = cli(tmp_path, "sessions", "list", **env)
        assert sid in listed.stdout and "1 runs" in listed.stdout
        two = cli(tmp_path, "run", "AGAIN-Q", "--path", str(tmp_path / "more.txt"), "--session", sid, **env)
        assert two.returncode == 0, two.stderr
        assert two.stdout.strip() == "3|alpha|6|more|False"
        closed = cli(tmp_path, "sessions", "close", sid, **env)
        assert closed.returncode == 0 and f"closed {sid}" in closed.stdout
        again = cli(tmp_path, "run", "AGAIN-Q", "--session", sid, **env)
        # As a server says it over MCP ("was closed"), with the fix in the CLI's terms.
        assert again.returncode != 0 and f"Session {sid} was closed." in again.stderr, again.stderr
        assert "--keep-session" in again.stderr and "keep_session=true" not in again.stderr
