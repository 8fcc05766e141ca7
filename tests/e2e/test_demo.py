"""The README's way to try rlm-mcp without a GPU: the scripted LM with `--demo` and one
`rlm-mcp run`, as written (a subprocess each), ending in a completed run with an answer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env


@pytest.mark.anyio
async def test_the_demo_lm_completes_a_run(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("one\ntwo\nthree\n")
    url_file = tmp_path / "url"
    lm = subprocess.Popen(
        [sys.executable, "-m", "rlm_mcp.testing.scripted_lm", "--demo", "--port-file", str(url_file)],
        stdout=subprocess.DEVNULL,
    )
    try:
        await wait_until(url_file.exists, within_s=120, what="the demo LM listening")
        env = cli_env(tmp_path, RLM_MCP_BASE_URL=url_file.read_text().strip())
        run = await anyio.run_process(
            [str(SERVER_SCRIPT), "run", "How long is this file?", "--path", str(tmp_path / "notes.txt")],
            env=env,
            check=False,
        )
    finally:
        lm.terminate()
        lm.wait(60)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    assert "(scripted demo LM) the context has 14 characters and 3 lines" in run.stdout.decode()
