"""The Claude Desktop bundle: the generated manifest passes the official `mcpb` CLI (pinned in
tests/js/package.json): validate, pack, unpack; then the server is started from the unpacked
bundle exactly as its manifest says (`mcp_config`, `${__dirname}` and `${user_config.*}`
filled in as a host fills them) and completes a run against the scripted LM. Claude Desktop
itself has no Linux build: this is as far as a test here goes. rlm-mcp is not on PyPI yet, so uv
finds the package in the wheel built from this checkout (UV_FIND_LINKS)."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from rlm_mcp.publish.bundle import manifest, write_bundle, write_bundle_dir
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_dist import Dists, build_dists
from tests.fixtures_e2e import coverage_env, new_instance_id, sandbox_container_ids
from tests.fixtures_js import js_bin
from tests.fixtures_uv import user_env, uv_path

ANSWER = '```repl\nanswer["content"] = "bundle:" + context.strip()\nanswer["ready"] = True\n```'


def mcpb(*args: str, cwd: Path) -> str:
    done = subprocess.run([js_bin("mcpb"), *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    return build_dists(tmp_path_factory.mktemp("dist"))


def test_the_manifest_declares_the_server_tools_and_settings() -> None:
    m = manifest()
    assert m["manifest_version"] == "0.4" and m["server"]["type"] == "uv"
    assert {"rlm_complete", "rlm_start", "rlm_status", "rlm_result", "rlm_cancel"} <= {t["name"] for t in m["tools"]}
    config = m["user_config"]
    assert config["api_key"]["sensitive"] is True and config["base_url"]["required"] is True
    assert m["server"]["mcp_config"]["env"]["RLM_MCP_BASE_URL"] == "${user_config.base_url}"
    assert "Docker must be installed" in m["long_description"]


def test_mcpb_validates_packs_and_unpacks_the_bundle(tmp_path: Path) -> None:
    folder = write_bundle_dir(tmp_path / "bundle")
    assert "passes" in mcpb("validate", str(folder / "manifest.json"), cwd=tmp_path)
    mcpb("pack", str(folder), str(tmp_path / "packed.mcpb"), cwd=tmp_path)
    mcpb("unpack", str(tmp_path / "packed.mcpb"), str(tmp_path / "unpacked"), cwd=tmp_path)
    assert json.loads((tmp_path / "unpacked" / "manifest.json").read_text()) == manifest()
    # The command's own file unpacks the same way.
    ours = write_bundle(tmp_path / "rlm-mcp.mcpb")
    mcpb("unpack", str(ours), str(tmp_path / "ours"), cwd=tmp_path)
    assert json.loads((tmp_path / "ours" / "manifest.json").read_text()) == manifest()
    with zipfile.ZipFile(ours) as z:
        assert sorted(z.namelist()) == ["manifest.json", "pyproject.toml", "src/server.py"]


@pytest.mark.anyio
async def test_the_server_starts_as_the_manifest_says_and_completes_a_run(dists: Dists, tmp_path: Path) -> None:
    ours = await anyio.to_thread.run_sync(write_bundle, tmp_path / "rlm-mcp.mcpb")  # it runs its own loop
    unpacked = tmp_path / "installed"
    with zipfile.ZipFile(ours) as z:
        z.extractall(unpacked)
    m = json.loads((unpacked / "manifest.json").read_text())
    (tmp_path / "ctx.txt").write_text("packed\n")
    owner = new_instance_id()
    with ScriptedLM(Script(root=[ANSWER])) as lm:
        chosen = {"base_url": lm.base_url, "model": "rlm-v0.1", "api_key": "EMPTY", "allowed_roots": str(tmp_path)}

        def fill(text: str) -> str:
            text = text.replace("${__dirname}", str(unpacked))
            for key, value in chosen.items():
                text = text.replace("${user_config." + key + "}", value)
            return text

        config = m["server"]["mcp_config"]
        assert config["command"] == "uv"
        env = user_env(
            tmp_path / "project-env",
            UV_FIND_LINKS=str(dists.wheel.parent),
            RLM_MCP_DATA_DIR=str(tmp_path / "data"),
            RLM_MCP_POOL_SIZE="0",
            RLM_MCP_LOG_LEVEL="WARNING",
            RLM_MCP_INSTANCE_ID=owner,
            RLM_MCP_REFERENCE_FETCH="false",
            **coverage_env(),
        )
        env.update({k: fill(v) for k, v in config["env"].items()})
        params = StdioServerParameters(command=uv_path(), args=[fill(a) for a in config["args"]], env=env)
        async with Client(params) as session:
            loaded = await session.call_tool("rlm_load_context", {"path": str(tmp_path / "ctx.txt")})
            assert loaded.structured_content is not None, loaded
            done = await session.call_tool(
                "rlm_complete", {"query": "what?", "context_id": loaded.structured_content["context_id"]}
            )
            assert done.structured_content is not None, done
            assert done.structured_content["status"] == "completed"
            assert done.structured_content["answer"] == "bundle:packed"
    assert sandbox_container_ids(owner) == set()
