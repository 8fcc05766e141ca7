"""Issue 20, "also seen": the sandbox-restart notice says its reason once, and a kernel that was
stopped (SIGSTOP) is not explained to the model as a C-level loop. Real sandboxes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures_sandbox import no_bridge, ready_manager, text_context

pytestmark = pytest.mark.anyio


async def test_a_restart_notice_says_its_reason_once(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        r = await sb.execute("import os\nos.kill(os.getpid(), 9)", no_bridge)
        assert r.restarted
        shown = f"{r.error}\n{r.notice}"
        assert shown.count("killed by signal 9") == 1, shown
        assert r.error is not None and r.error.startswith("SandboxRestarted")


async def test_a_stopped_kernel_is_not_called_a_c_loop(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0, cell_timeout_s=2) as mgr, mgr.open([text_context(tmp_path, "ctx")]) as sb:
        r = await sb.execute("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)", no_bridge)
        assert r.restarted
        shown = f"{r.error}\n{r.notice}"
        assert "C-level loop" not in shown, shown
        assert "stopped" in shown, shown
