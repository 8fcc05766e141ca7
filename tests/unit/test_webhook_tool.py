"""`webhook_url` on the run tools: declared by both, and refused before a run is accepted when
the caller's token may not name it (the allow-list check, `service/webhooks/targets.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from rlm_mcp.server.app import build_server
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_tasks import declaring_tasks

pytestmark = pytest.mark.anyio


async def test_a_webhook_url_the_caller_may_not_name_refuses_the_run(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    async with Client(build_server(settings)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ("rlm_complete", "rlm_start"):
            assert "webhook_url" in tools[name].input_schema["properties"]
            assert "webhook_url" not in tools[name].input_schema.get("required", [])
            refused = await client.call_tool(
                name, {"query": "q", "context_id": "ctx_x", "webhook_url": "https://hooks.example/run"}
            )
            assert refused.is_error
            text = refused.content[0].text  # type: ignore[union-attr]
            assert "no webhook secret" in text and "webhook_allow=" in text
    runs = Path(settings.store.data_dir) / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # no run was accepted


async def test_rlm_complete_asked_as_a_task_checks_its_webhook_url_too(tmp_path: Path) -> None:
    # A task starts the run instead of waiting for it: the same webhook_url must go with it (it
    # was dropped, so the run was accepted and its end never delivered).
    settings = make_settings(tmp_path)
    async with Client(build_server(settings), extensions=declaring_tasks()) as client:
        refused = await client.call_tool(
            "rlm_complete", {"query": "q", "context_id": "ctx_x", "webhook_url": "https://hooks.example/run"}
        )
        assert refused.is_error
        text = refused.content[0].text  # type: ignore[union-attr]
        assert "no webhook secret" in text and "webhook_allow=" in text
    runs = Path(settings.store.data_dir) / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # no run was accepted
