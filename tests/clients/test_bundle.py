"""The Claude Desktop bundle: the generated manifest passes the official `mcpb` CLI (pinned in
tests/js/package.json): validate, pack, unpack; then the server is started from the unpacked
bundle exactly as its manifest says (`mcp_config`, `${__dirname}` and `${user_config.*}`
filled in as a host fills them) and completes a run against the scripted LM. Claude Desktop
itself has no Linux build: this is as far as a test here goes. The bundle carries the wheel built
from this checkout and a uv.lock with every other package's hashes; the server starts from the
lock (`uv run --frozen`), and a host's unfilled optional fields count as unset."""

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
from tests.fixtures_uv import user_env, uv_cache_dir, uv_path

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
    # A person's titles and sentences in the dialog, not variable names; the folder defaults to home.
    assert all(not entry["title"].startswith("RLM_MCP_") for entry in config.values()), config
    assert config["allowed_roots"]["default"] == "${HOME}" and config["allowed_roots"]["type"] == "directory"
    assert m["compatibility"]["platforms"] == ["darwin", "linux"]
    assert m["server"]["mcp_config"]["args"][:2] == ["run", "--frozen"]  # the shipped lock, as locked


def test_the_tool_descriptions_are_whole() -> None:
    from rlm_mcp.config import Settings
    from rlm_mcp.server.app import build_server

    async def declared() -> dict[str, str]:
        server = build_server(Settings.model_validate({"data_dir": "/nonexistent-rlm-data"}), mode="stdio")
        return {t.name: " ".join((t.description or "").split()) for t in await server.list_tools()}

    full = anyio.run(declared)
    shown = {t["name"]: t["description"] for t in manifest()["tools"]}
    assert shown == full  # never cut mid-sentence ("(waits for the")
    assert all(d.rstrip().endswith((".", ")", "`")) for d in shown.values()), shown


def test_mcpb_validates_packs_and_unpacks_the_bundle(dists: Dists, tmp_path: Path) -> None:
    folder = write_bundle_dir(tmp_path / "bundle", dists.wheel)
    assert "passes" in mcpb("validate", str(folder / "manifest.json"), cwd=tmp_path)
    mcpb("pack", str(folder), str(tmp_path / "packed.mcpb"), cwd=tmp_path)
    mcpb("unpack", str(tmp_path / "packed.mcpb"), str(tmp_path / "unpacked"), cwd=tmp_path)
    assert json.loads((tmp_path / "unpacked" / "manifest.json").read_text()) == manifest()
    # The command's own file unpacks the same way.
    ours = write_bundle(tmp_path / "rlm-mcp.mcpb", dists.wheel)
    mcpb("unpack", str(ours), str(tmp_path / "ours"), cwd=tmp_path)
    assert json.loads((tmp_path / "ours" / "manifest.json").read_text()) == manifest()
    with zipfile.ZipFile(ours) as z:
        assert sorted(z.namelist()) == sorted(
            ["manifest.json", "pyproject.toml", "uv.lock", "src/server.py", f"wheels/{dists.wheel.name}"]
        )
        lock = z.read("uv.lock").decode()
    # every package from an index is pinned with its hashes; rlm-mcp itself comes from the wheel inside
    assert 'name = "pydantic-core"' in lock and 'hash = "sha256:' in lock
    assert f'source = {{ path = "wheels/{dists.wheel.name}" }}' in lock


@pytest.mark.anyio
async def test_the_server_starts_as_the_manifest_says_and_completes_a_run(dists: Dists, tmp_path: Path) -> None:
    ours = await anyio.to_thread.run_sync(write_bundle, tmp_path / "rlm-mcp.mcpb", dists.wheel)  # its own loop
    unpacked = tmp_path / "installed"
    with zipfile.ZipFile(ours) as z:
        z.extractall(unpacked)
    m = json.loads((unpacked / "manifest.json").read_text())
    (tmp_path / "ctx.txt").write_text("packed\n")
    owner = new_instance_id()
    with ScriptedLM(Script(root=[ANSWER])) as lm:
        # The optional fields as some hosts pass them when left empty: "" and an unexpanded placeholder.
        chosen = {"base_url": lm.base_url, "model": "rlm-v0.1", "api_key": ""}

        def fill(text: str) -> str:
            text = text.replace("${__dirname}", str(unpacked))
            for key, value in chosen.items():
                text = text.replace("${user_config." + key + "}", value)
            return text

        config = m["server"]["mcp_config"]
        assert config["command"] == "uv"
        env = user_env(
            tmp_path / "project-env",
            HOME=str(tmp_path),  # the folder field's default: the home folder
            UV_CACHE_DIR=uv_cache_dir(),
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
