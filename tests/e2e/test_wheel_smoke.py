"""`uvx --from <built wheel> rlm-mcp`, as a user installs it from PyPI: no checkout on the path,
the console script from an isolated environment, the sandbox image built from the wheel's own
files, `doctor` passing and one run completing in a sandbox of that image against the scripted LM
(the same checks as the checkout's README commands).

The image is built under a tag of this test's own, on the base the session's image was built on
(the offline base where it exists: no network, Docker's layer cache makes it about a second), so
the shared image is never touched; the test removes only its own tag."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlm_mcp.sandbox.docker.docker_api import connect_sync, image_present_sync
from rlm_mcp.sandbox.docker.image import OFFLINE_BASE_TAG
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_dist import Dists, build_dists
from tests.fixtures_e2e import coverage_env, new_instance_id, sandbox_container_ids
from tests.fixtures_uv import REPO, user_env, uv_path

ANSWER = '```repl\nanswer["content"] = "wheel:" + context.strip()\nanswer["ready"] = True\n```'


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    return build_dists(tmp_path_factory.mktemp("dist"))


@pytest.fixture
def wheel_image_tag() -> Iterator[str]:
    """A tag of this test's own for the image built from the wheel; removed afterwards."""
    tag = f"rlm-mcp-sandbox:test-wheel-{secrets.token_hex(4)}"
    yield tag
    client = connect_sync()
    try:
        if image_present_sync(client, tag):
            client.images.remove(tag)  # untags only: never force, the layers are shared with the session's image
    finally:
        client.close()


def offline_base_present() -> bool:
    client = connect_sync()
    try:
        return image_present_sync(client, OFFLINE_BASE_TAG)
    finally:
        client.close()


def test_uvx_from_the_wheel_builds_the_image_passes_doctor_and_completes_a_run(
    dists: Dists, wheel_image_tag: str, tmp_path: Path
) -> None:
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
            RLM_MCP_SANDBOX_IMAGE=wheel_image_tag,
            **coverage_env(),
        )
        base = [uvx, "--from", str(dists.wheel), "rlm-mcp"]

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*base, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)

        missing = cli("image", "status")
        assert missing.returncode == 1 and "missing" in missing.stdout, missing.stdout + missing.stderr
        # The session's image came from the offline base (CI, this machine) or from a pulled
        # debian:bookworm-slim; either way the base is local and the build needs no network.
        build = cli("image", "build", *(["--offline"] if offline_base_present() else []))
        assert build.returncode == 0, build.stderr[-3000:]
        assert build.stdout.strip() == wheel_image_tag
        context = re.search(rf"Building {re.escape(wheel_image_tag)} from (\S+) on ", build.stderr)
        assert context, build.stderr[-3000:]
        built_from = Path(context.group(1))
        assert built_from.name == "default" and built_from.parent.name == "sandbox_images", built_from
        assert not built_from.is_relative_to(REPO), f"built from the checkout ({built_from}), not the wheel's files"
        assert built_from.parent.parent.name == "rlm_mcp"  # the installed package's copy

        status = cli("image", "status")
        assert status.returncode == 0 and "present" in status.stdout, status.stdout + status.stderr
        doctor = cli("doctor")  # its round trip starts a sandbox of the wheel-built image
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr[-3000:]
        assert "all checks passed" in doctor.stdout
        run = cli("run", "what is in the file?", "--path", str(tmp_path / "ctx.txt"), "--json")
        assert run.returncode == 0, run.stderr[-3000:]
        result = json.loads(run.stdout)
        assert result["status"] == "completed" and result["answer"] == "wheel:from-the-wheel"
    assert sandbox_container_ids(owner) == set()
