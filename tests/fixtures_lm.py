"""Helpers for LM-layer tests: settings pointed at a ScriptedLM, and one engine run whose LM calls go
through a real client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine, RunProgress, RunResult
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.events import RunEvent
from rlm_mcp.lm.client import LMClient
from rlm_mcp.testing import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_engine import FakeSandboxFactory, make_context, make_limits

# The LM client's retry backoff in these tests (`LMClient(..., backoff_base_s=FAST)`).
FAST = 0.01

# Sub-messages and a root conversation, shaped like the engine's.
ROOT_MESSAGES = [
    {"role": "system", "content": "You are an RLM."},
    {"role": "user", "content": "Answer the following: what is x?"},
    {"role": "user", "content": "Turn 1/20:"},
]


def sub_messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def lm_settings(lm: ScriptedLM | str, **overrides: Any) -> Settings:
    """Settings for a client of `lm` (or of a base URL), with quick retries."""
    base_url = lm if isinstance(lm, str) else lm.base_url
    model = "rlm-v0.1" if isinstance(lm, str) else lm.script.model
    values: dict[str, Any] = {"base_url": base_url, "model": model, "lm_retries": 3, "request_timeout_s": 30.0}
    values.update(overrides)
    return make_settings(**values)


async def run_with_client(settings: Settings, client: LMClient, tmp_path: Path, code: str) -> RunResult:
    """One engine run (at most three turns) whose LM calls go through `client` and whose cells run
    in process (FakeSandboxFactory). `code` is not read: the scripted LM behind `client` replies."""

    async def sink(event: RunEvent) -> None:
        pass

    engine = RLMEngine(settings.engine, client, FakeSandboxFactory(), system_prompt=RLM_MCP_SYSTEM_PROMPT)
    limits = make_limits(settings, max_iterations=3)
    return await engine.run(
        run_id="two",
        query="Where do the calls go?",
        contexts=[make_context(tmp_path)],
        limits=limits,
        progress=RunProgress(run_id="two", max_iterations=limits.max_iterations),
        emit=sink,
    )
