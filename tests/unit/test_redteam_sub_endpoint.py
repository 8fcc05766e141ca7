"""A separate sub-call endpoint (reliability and security round four): the root's API key is
a credential of the root's server, so a sub-call endpoint on another server without
`RLM_MCP_SUB_API_KEY` gets no key (the start log and `doctor` say so); and sandbox code naming
the root model reaches the root's server only when `RLM_MCP_ALLOWED_SUB_MODELS` lists it.
Two scripted LM servers logging every header; the engine's cells run in-process."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from rlm_mcp.config import Settings
from rlm_mcp.doctor import _lm
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.endpoint import endpoint_configs
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_e2e import cli_env
from tests.fixtures_engine import repl
from tests.fixtures_lm import FAST, lm_settings, run_with_client

pytestmark = pytest.mark.anyio

ROOT_KEY = "root-secret-7f3a"
CODE = (
    "a = llm_query('p1')\n"
    "b = llm_query('p2', model='rlm-v0.1')\n"  # the root model, named from the sandbox
    "answer['content'] = a + '|' + b\nanswer['ready'] = True"
)


def _scripts() -> tuple[dict[str, object], dict[str, object]]:
    root: dict[str, object] = {"root": [repl(CODE)], "sub_default": "root:{prompt}"}
    sub: dict[str, object] = {"model": "small", "sub_default": "sub:{prompt}"}
    return root, sub


async def test_another_server_gets_no_root_key_and_no_root_model_calls(tmp_path: Path) -> None:
    root_script, sub_script = _scripts()
    async with ScriptedLM(root_script) as root, ScriptedLM(sub_script) as sub:
        settings = lm_settings(root, api_key=ROOT_KEY, sub_base_url=sub.base_url, sub_model="small")
        async with LMClient(settings.lm, backoff_base_s=FAST) as client:
            result = await run_with_client(settings, client, tmp_path, CODE)
        assert result.status == "completed", result.reason
        assert result.answer == "sub:p1|sub:p2"  # the root model's name fell back to the sub model
        assert [r["role"] for r in root.requests] == ["root"]  # no sub-call reached the root's server
        assert all(r["headers"]["authorization"] == f"Bearer {ROOT_KEY}" for r in root.requests)
        assert len(sub.requests) == 2
        for request in sub.requests:
            assert ROOT_KEY not in repr(request["headers"])
            assert "authorization" not in request["headers"]


async def test_positive_controls_a_listed_root_model_and_a_sub_key(tmp_path: Path) -> None:
    root_script, sub_script = _scripts()
    async with ScriptedLM(root_script) as root, ScriptedLM(sub_script) as sub:
        settings = lm_settings(
            root,
            api_key=ROOT_KEY,
            sub_base_url=sub.base_url,
            sub_api_key="sub-key",
            sub_model="small",
            allowed_sub_models=["rlm-v0.1"],
        )
        async with LMClient(settings.lm, backoff_base_s=FAST) as client:
            result = await run_with_client(settings, client, tmp_path, CODE)
        assert result.answer == "sub:p1|root:p2"  # listed: the root model answers on the root's server
        assert [r["role"] for r in root.requests] == ["root", "sub"]
        assert all(r["headers"]["authorization"] == f"Bearer {ROOT_KEY}" for r in root.requests)
        assert [r["headers"]["authorization"] for r in sub.requests] == ["Bearer sub-key"]


def test_the_same_server_keeps_the_roots_key_and_model() -> None:
    """Another path or spelling of the root's own server is no other server."""

    def with_sub(sub_base_url: str) -> Settings:
        return make_settings(base_url="http://gpu:8000/v1", api_key=ROOT_KEY, sub_base_url=sub_base_url)

    _, sub = endpoint_configs(with_sub("http://GPU:8000/other/v1").lm)
    assert sub is not None and sub.api_key == ROOT_KEY
    _, sub = endpoint_configs(with_sub("https://gpu:8000/v1").lm)
    assert sub is not None and sub.api_key == ""  # another scheme: another server
    _, sub = endpoint_configs(with_sub("http://gpu:8001/v1").lm)
    assert sub is not None and sub.api_key == ""
    _, sub = endpoint_configs(make_settings(base_url="http://gpu:8000/v1", sub_base_url="http://cheap:80/v1").lm)
    assert sub is not None and sub.api_key == "EMPTY"  # the placeholder is no secret: it carries over


async def test_doctor_and_the_start_log_say_the_key_is_withheld(tmp_path: Path) -> None:
    root_script, sub_script = _scripts()
    async with ScriptedLM(root_script) as root, ScriptedLM(sub_script) as sub:
        settings = lm_settings(root, api_key=ROOT_KEY, sub_base_url=sub.base_url, sub_model="small")
        rows = {c.name: c for c in await _lm(settings)}
        assert rows["sub-call key"].warn and "carry no API key" in rows["sub-call key"].detail
        assert ROOT_KEY not in repr(rows)
        assert all(ROOT_KEY not in repr(r["headers"]) for r in sub.requests)
        listed = await _lm(settings.model_copy(update={"sub_api_key": "sub-key"}))
        assert "sub-call key" not in {c.name for c in listed}
        # The start log: `serve` says it first (then stops here: a front needs team mode).
        env = cli_env(
            tmp_path, RLM_MCP_BASE_URL=root.base_url, RLM_MCP_API_KEY=ROOT_KEY, RLM_MCP_SUB_BASE_URL=sub.base_url
        )
        done = await anyio.run_process(
            [sys.executable, "-m", "rlm_mcp", "serve", "--role", "front"], env=env, check=False
        )
        stderr = done.stderr.decode()
        assert done.returncode == 1 and "needs team mode" in stderr
        assert "carry no API key: it is another server than the root's" in stderr
        assert ROOT_KEY not in stderr
