"""`uvx --from <built wheel> rlm-mcp`, as a user installs it from PyPI: no checkout on the path,
the console script from an isolated environment, `doctor` passing and one run completing against
the scripted LM (the same checks as the checkout's README commands)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_dist import Dists, build_dists
from tests.fixtures_e2e import coverage_env, new_instance_id, sandbox_container_ids
from tests.fixtures_uv import user_env, uv_path

ANSWER = '```repl\nanswer["content"] = "wheel:" + context.strip()\nanswer["ready"] = True\n```'


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    return build_dists(tmp_path_factory.mktemp("dist"))


def test_uvx_from_the_wheel_passes_doctor_and_completes_a_run(dists: Dists, tmp_path: Path) -> None:
    uvx = shutil.which("uvx", path=str(Path(uv_path()).parent)) or shutil.which("uvx")
    assert uvx, "uvx comes with uv"
    (tmp_path / "ctx.txt").write_text("from-the-wheel\n")
    owner = new_instance_id()
    with ScriptedLM(Script(root=[ANSWER])) as lm:
        env = user_env(
            tmp_path / "unused-project-env",
            RLM_MCP_BASE_URL=lm.base_url,
            RLM_MCP_DATA_DIR=str(tmp_path / "data"),
            RLM_MCP_ALLOWED_ROOTS=str(tmp_path),
            RLM_MCP_POOL_SIZE="0",
            RLM_MCP_LOG_LEVEL="WARNING",
            RLM_MCP_INSTANCE_ID=owner,
            RLM_MCP_REFERENCE_FETCH="false",
            **coverage_env(),
        )
        base = [uvx, "--from", str(dists.wheel), "rlm-mcp"]

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*base, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)

        doctor = cli("doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr[-3000:]
        assert "all checks passed" in doctor.stdout
        status = cli("image", "status")  # the image definition the wheel carries names the image
        assert status.returncode == 0 and "present" in status.stdout, status.stdout + status.stderr
        run = cli("run", "what is in the file?", "--path", str(tmp_path / "ctx.txt"), "--json")
        assert run.returncode == 0, run.stderr[-3000:]
        result = json.loads(run.stdout)
        assert result["status"] == "completed" and result["answer"] == "wheel:from-the-wheel"
    assert sandbox_container_ids(owner) == set()
