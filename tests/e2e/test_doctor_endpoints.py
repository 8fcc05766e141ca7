"""`doctor` tells which kind of server it talks to where it can, and warns when the window is
only assumed (the endpoint does not report one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rlm_mcp.lm.server_kind import guess_server_kind
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import SERVER_SCRIPT, coverage_env, new_instance_id
from tests.fixtures_reference import reference_wheel, seed_data_dir

__all__ = ["reference_wheel"]


@pytest.mark.parametrize(
    ("url", "cards", "kind"),
    [
        ("https://api.openai.com/v1", [{"id": "gpt-4o", "owned_by": "system"}], "OpenAI"),
        ("https://openrouter.ai/api/v1", None, "OpenRouter"),
        ("http://gpu:8000/v1", [{"id": "rlm-v0.1", "owned_by": "vllm"}], "vLLM"),
        ("http://localhost:11434/v1", [{"id": "qwen3:8b", "owned_by": "library"}], "Ollama"),
        ("http://box:9000/v1", [{"id": "qwen3:8b", "owned_by": "library"}], "Ollama"),
        ("http://localhost:1234/v1", None, "LM Studio"),
        ("http://localhost:8080/v1", [{"id": "model.gguf", "owned_by": "llamacpp"}], "llama.cpp server"),
        ("http://localhost:8080/v1", [{"id": "x", "owned_by": "someone"}], None),
    ],
)
def test_server_kind_is_guessed_from_address_and_cards(url: str, cards: list | None, kind: str | None) -> None:
    assert guess_server_kind(url, cards) == kind


def doctor(tmp_path: Path, base_url: str) -> subprocess.CompletedProcess[str]:
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": os.environ.get("PATH", ""),
        "RLM_MCP_DATA_DIR": str(tmp_path),
        "RLM_MCP_POOL_SIZE": "0",
        "RLM_MCP_LOG_LEVEL": "WARNING",
        "RLM_MCP_BASE_URL": base_url,
        "RLM_MCP_INSTANCE_ID": new_instance_id(),
        **coverage_env(),
    }
    return subprocess.run([str(SERVER_SCRIPT), "doctor"], env=env, capture_output=True, text=True, timeout=120)


def test_doctor_warns_when_the_window_is_assumed(tmp_path: Path, reference_wheel: Path) -> None:
    seed_data_dir(tmp_path, reference_wheel)  # the adapter's profile needs it; doctor never downloads
    with ScriptedLM(Script(models_endpoint=False, sub_default="OK")) as lm:
        proc = doctor(tmp_path, lm.base_url)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning, not a failure
    assert "16384 tokens ASSUMED" in proc.stdout
    assert "fix: Set RLM_MCP_MAX_MODEL_LEN" in proc.stdout
    assert "server kind not recognised" in proc.stdout
    assert "ok    completion" in proc.stdout  # the model answered a one-token request
