"""Every shell block of the README and the docs pages marked `<!-- runnable -->` works as written,
from the checkout, with uv, against a scripted LM standing in for the endpoint."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import new_instance_id
from tests.fixtures_uv import REPO, user_env
from tests.readme_blocks import runnable_blocks

ANSWER = '```repl\nanswer["content"] = "readme:" + str(len(context))\nanswer["ready"] = True\n```'


@pytest.fixture(scope="module")
def uv_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment the blocks run in: uv on PATH, its project venv in a temp folder (the
    checkout's own .venv is left alone), a scripted LM as the endpoint."""
    tmp = tmp_path_factory.mktemp("readme")
    with ScriptedLM(Script(root=[ANSWER], sub_default="OK")) as lm:
        env = user_env(
            tmp / "venv",
            RLM_MCP_BASE_URL=lm.base_url,
            RLM_MCP_DATA_DIR=str(tmp / "data"),
            RLM_MCP_ALLOWED_ROOTS=str(REPO),
            RLM_MCP_POOL_SIZE="0",
            RLM_MCP_LOG_LEVEL="WARNING",
            RLM_MCP_INSTANCE_ID=new_instance_id(),
        )
        yield env


def test_the_readme_marks_its_commands_runnable() -> None:
    texts = [b.text for b in runnable_blocks()]
    assert any("uv run rlm-mcp " in t or t.startswith("uv run rlm-mcp") for t in texts)
    assert any("rlm-mcp doctor" in t for t in texts)


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.where)
def test_runnable_block_works_as_written(block, uv_env: dict[str, str]) -> None:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=REPO,
        env=uv_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{block.where} failed:\n{block.text}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
