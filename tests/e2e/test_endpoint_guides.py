"""Each endpoint guide of docs/endpoints.md, tested as written: its settings, against the scripted server
with that endpoint's personality, give the `doctor` lines the guide shows and complete one
`rlm_complete` run (real server over stdio, real Docker sandbox)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from rlm_mcp.testing.endpoints import ENDPOINTS
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import SERVER_SCRIPT, minimal_env, stdio_client
from tests.fixtures_reference import reference_wheel, seed_data_dir
from tests.readme_blocks import blocks

__all__ = ["reference_wheel"]

pytestmark = pytest.mark.anyio

# The window each scripted endpoint serves when the guide does not set one (what it reports, if it does).
SERVED_WINDOW = {"vllm": 16384, "openrouter": 32768, "llamacpp": 16384}
ROOT = [
    "```repl\nline = [l for l in context.splitlines() if 'vault' in l][0]\n"
    "answer['content'] = llm_query('Extract the code: ' + line)\nanswer['ready'] = True\n```"
]


def guide(name: str) -> tuple[dict[str, str], list[str]]:
    """(the guide's settings, its doctor lines) from the docs page."""
    found = {b.marker: b.text for b in blocks()}
    settings = dict(line.split("=", 1) for line in found[f"<!-- endpoint: {name} -->"].splitlines() if "=" in line)
    return settings, found[f"<!-- doctor: {name} -->"].splitlines()


def on_loopback(settings: dict[str, str], lm: ScriptedLM) -> dict[str, str]:
    """The guide's settings with its host and port replaced by the scripted server's (path kept)."""
    url = urlsplit(settings["RLM_MCP_BASE_URL"])
    return {**settings, "RLM_MCP_BASE_URL": lm.root_url + url.path}


async def doctor(env: dict[str, str]) -> tuple[int, str]:
    with anyio.fail_after(180):
        proc = await anyio.run_process([str(SERVER_SCRIPT), "doctor"], env=env, check=False)
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


def line_pattern(expected: str) -> re.Pattern[str]:
    words = re.sub(r"\s+", " ", expected.strip())
    return re.compile(".*".join(re.escape(part) for part in words.split("…")))


@pytest.mark.parametrize("name", sorted(ENDPOINTS))
async def test_endpoint_guide(name: str, tmp_path: Path, reference_wheel: Path) -> None:
    settings, doctor_lines = guide(name)
    model = settings.get("RLM_MCP_MODEL", "rlm-v0.1")
    window = int(settings.get("RLM_MCP_MAX_MODEL_LEN", SERVED_WINDOW.get(name, 16384)))
    base = {} if name == "vllm" else {"base_model": model}
    script = Script(
        model=model,
        **base,
        max_model_len=window,
        root=ROOT,
        sub=[{"match": r"code is (\S+)", "reply": r"\1"}],
        sub_default="OK, that works.",
    )
    endpoint = ENDPOINTS[name](api_key=settings.get("RLM_MCP_API_KEY"))
    data_dir = tmp_path / "data"
    seed_data_dir(data_dir, reference_wheel)  # the adapter's profile; doctor never downloads
    with ScriptedLM(script, endpoint=endpoint) as lm:
        env = minimal_env(lm.base_url, data_dir, [tmp_path], RLM_MCP_POOL_SIZE="0", **on_loopback(settings, lm))
        code, out = await doctor(env)
        said = [re.sub(r"\s+", " ", line.strip()) for line in out.splitlines()]
        assert code == 0, out
        for expected in doctor_lines:
            pattern = line_pattern(expected)
            assert any(pattern.fullmatch(line) for line in said), f"doctor did not say {expected!r}:\n{out}"

        if endpoint.api_key is not None:  # the key is needed: without it doctor names the fix
            keyless = {k: v for k, v in env.items() if k != "RLM_MCP_API_KEY"}
            code, out = await doctor(keyless)
            assert code == 1 and "RLM_MCP_API_KEY" in out, out

        async with stdio_client(env) as client:
            loaded = await client.call_tool("rlm_load_context", {"text": "alpha\nthe vault code is 7-7-3\nbeta\n"})
            assert not loaded.is_error, loaded.content
            done = await client.call_tool(
                "rlm_complete",
                {"query": "What is the vault code?", "context_id": loaded.structured_content["context_id"]},
            )
            assert not done.is_error, done.content
            result = done.structured_content
            assert result["status"] == "completed" and result["answer"] == "7-7-3", result
    if name == "openai":  # the newer model refused max_tokens; the run went on with max_completion_tokens
        assert any("max_completion_tokens" in r["body"] for r in lm.requests)
