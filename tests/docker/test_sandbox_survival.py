"""Issue 14 items 4 and 5: the kernel survives what user code does, and the cell clock cannot be
dodged. Real Docker, the real kernel."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from rlm_mcp.ports import LMRequest
from tests.fixtures_sandbox import no_bridge, ready_manager, text_context

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]


async def test_a_thread_printing_forever_does_not_crash_the_kernel(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        r = await sb.execute(
            "import threading\ndef spam():\n    while True:\n        print('bg', 'x' * 100)\n"
            "threading.Thread(target=spam, daemon=True).start()",
            no_bridge,
        )
        assert r.error is None
        # Every cell used to replace sys.stdout while the thread was inside print(): SIGSEGV.
        for i in range(25):
            # The thread may write between print()'s text and its newline, so the marker is
            # looked for whole, not with the newline after it.
            r = await sb.execute(f"print('<fg {i}>')", no_bridge)
            assert not r.restarted, r.notice
            assert r.error is None and f"<fg {i}>" in r.stdout


async def test_a_cell_holding_every_fd_does_not_kill_the_kernel(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        r = await sb.execute(
            "held = []\ntry:\n    while True:\n        held.append(open('/dev/null'))\n"
            "except OSError as exc:\n    print('full at', len(held), type(exc).__name__)",
            no_bridge,
        )
        assert r.error is None and r.stdout.startswith("full at"), r.stdout
        r = await sb.execute("print('alive', len(held))", no_bridge)  # the kernel opened nothing
        assert not r.restarted, r.notice
        assert r.error is None and r.stdout.startswith("alive")
        r = await sb.execute(
            "for f in held:\n    f.close()\ndel held\nprint(open('/dev/null').read() == '')", no_bridge
        )
        assert r.error is None and r.stdout == "True\n"


async def test_forked_children_are_reaped_and_subprocess_keeps_its_exit_codes(tmp_path: Path) -> None:
    # 64 pids in this sandbox: 150 unreaped children used to leave none for a new thread. Here 156,
    # 13 a cell, each cell waiting until its children have exited and left zombies (WNOWAIT: not
    # reaped, which is the kernel's job between cells, tested here). Without that wait the count
    # depended on how soon a loaded host ran the children: those of earlier cells still running
    # at the next cell's forks used the 64 up in one CI run under Podman.
    async with ready_manager(pool_size=0, sandbox_pids=64) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        fork_some = (
            "import os\nchildren = []\nfor _ in range(13):\n    pid = os.fork()\n    if pid == 0:\n"
            "        os._exit(0)\n    children.append(pid)\n"
            "for pid in children:\n    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)"
        )
        for _ in range(12):
            r = await sb.execute(fork_some, no_bridge)
            assert r.error is None, (r.error, r.notice)  # a lost sandbox's notice says how it ended
        r = await sb.execute(
            "import threading, subprocess, sys\nt = threading.Thread(target=print, args=('thread ok',))\nt.start()\n"
            "t.join()\nprint(subprocess.run([sys.executable, '-c', 'raise SystemExit(3)']).returncode)",
            no_bridge,
        )
        assert r.error is None, (r.error, r.notice)
        assert r.stdout == "thread ok\n3\n"


class SlowBridge:
    """Answers `slow` prompts after `delay_s` and everything else at once; records what finished."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.finished: list[str] = []

    async def __call__(self, request: LMRequest) -> list[str]:
        if any(p == "slow" for p in request.prompts):
            await anyio.sleep(self.delay_s)
        self.finished.extend(request.prompts)
        return [f"echo:{p}" for p in request.prompts]


async def test_a_background_call_in_flight_does_not_stop_the_cell_clock(tmp_path: Path) -> None:
    bridge = SlowBridge(delay_s=60)
    async with ready_manager(pool_size=0, cell_timeout_s=2) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        r = await sb.execute(
            "import threading\nthreading.Thread(target=llm_query, args=('slow',), daemon=True).start()\n"
            "n = 0\nwhile True:\n    n += 1",
            bridge,
        )
        assert r.timed_out and r.error and "RLM_MCP_CELL_TIMEOUT_S" in r.error
        assert bridge.finished == []  # interrupted while the background call was still in flight
        # The cell's own wait for the model is still not counted: 3 s of waiting on a 2 s limit.
        bridge.delay_s = 3
        r = await sb.execute("print(llm_query('slow'))", bridge)
        assert r.error is None and r.stdout == "echo:slow\n"


@pytest.mark.usefixtures("fast_channel")
async def test_a_cell_is_cut_at_its_wall_clock_ceiling(tmp_path: Path) -> None:
    bridge = SlowBridge(delay_s=120)
    settings = dict(pool_size=0, cell_timeout_s=60, cell_wall_timeout_s=2)
    async with ready_manager(**settings) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        r = await sb.execute("x = 1\nprint(llm_query('slow'))", bridge)
        assert r.timed_out and r.error and "RLM_MCP_CELL_WALL_TIMEOUT_S" in r.error
        assert bridge.finished == []
        r = await sb.execute("print(x)", no_bridge)
        assert r.stdout == "1\n" and not r.restarted
