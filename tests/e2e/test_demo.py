"""The README's way to try rlm-mcp without a GPU: the scripted LM with `--demo` and one
`rlm-mcp run` (a subprocess each), ending in a completed run with an answer; and the README's
quickstart run as written, from a checkout outside the home folder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env, new_instance_id
from tests.fixtures_uv import REPO, user_env, uv_cache_dir
from tests.readme_blocks import README, blocks


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


def test_the_readme_quickstart_works_as_written_from_a_checkout_outside_home(tmp_path: Path) -> None:
    # The five lines, verbatim but for the stand-in's port (8000 may be taken here), from the
    # checkout, for a user whose home folder does not contain it and who set no allowed roots:
    # a local command reads the path typed to it (docs/getting-started.md, "Paths").
    (block,) = [b for b in blocks(README) if b.marker.startswith("<!-- quickstart")]
    assert len(block.text.splitlines()) == 5, block.text
    port = str(free_port())
    home = tmp_path / "home"
    home.mkdir()
    assert not REPO.is_relative_to(home)
    env = user_env(
        tmp_path / "venv",
        HOME=str(home),
        UV_CACHE_DIR=uv_cache_dir(),
        RLM_MCP_POOL_SIZE="0",
        RLM_MCP_REFERENCE_FETCH="false",
        RLM_MCP_INSTANCE_ID=new_instance_id(),
    )
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text.replace("8000", port)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"\(scripted demo LM\) the context has [\d,]+ characters and [\d,]+ lines", proc.stdout), (
        proc.stdout
    )
