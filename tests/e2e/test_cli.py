"""The `rlm-mcp` command line: doctor, image status, a one-off run, contexts and runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import cli
from tests.fixtures_reference import reference_wheel, seed_data_dir

__all__ = ["reference_wheel"]

ANSWER = '```repl\nanswer["content"] = "cli:" + context.strip()\nanswer["ready"] = True\n```'


def test_doctor_passes_when_everything_is_there(tmp_path: Path, reference_wheel: Path) -> None:
    seed_data_dir(tmp_path / "data", reference_wheel)
    with ScriptedLM(Script(sub_default="OK")) as lm:
        proc = cli(tmp_path, "doctor", RLM_MCP_BASE_URL=lm.base_url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for check in ("docker", "image", "lm endpoint", "model", "completion", "sandbox round trip", "prompt profile"):
        assert f"ok    {check}" in proc.stdout, proc.stdout
    assert "16384 tokens" in proc.stdout and "ASSUMED" not in proc.stdout and "looks like vLLM" in proc.stdout
    assert "canonical (auto: rlm-v0.1 is the trained adapter)" in proc.stdout
    assert "ok    docker" in proc.stdout and "runtime runc" in proc.stdout  # the engine and runtime used
    assert "ok    cpu sharing" in proc.stdout  # Docker with runc updates quotas in place
    assert "all checks passed" in proc.stdout


def test_doctor_names_the_fix_for_each_failure(tmp_path: Path) -> None:
    proc = cli(
        tmp_path,
        "doctor",
        RLM_MCP_BASE_URL="http://127.0.0.1:9/v1",
        RLM_MCP_SANDBOX_IMAGE="rlm-mcp-sandbox:not-built",
    )
    assert proc.returncode == 1
    assert "FAIL  image" in proc.stdout and "rlm-mcp image build" in proc.stdout
    assert "FAIL  lm endpoint" in proc.stdout and "RLM_MCP_BASE_URL" in proc.stdout
    assert "ok    docker" in proc.stdout
    # No reference copy: the adapter would get rlm-mcp (the server still works): doctor warns, with the fix.
    assert re.search(r"warn  prompt profile +rlm-mcp \(auto: the adapter should get canonical", proc.stdout)
    assert "fix: Run `rlm-mcp profile fetch`." in proc.stdout


def test_profile_fetch_then_show(tmp_path: Path) -> None:
    before = cli(tmp_path, "profile", "show")
    assert before.returncode == 1 and "prompt profile: rlm-mcp" in before.stdout
    fetched = cli(tmp_path, "profile", "fetch")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert "rlms-0.1.3-py3-none-any.whl" in fetched.stdout
    assert "prompt profile: canonical" in fetched.stdout
    other = cli(tmp_path, "profile", "show", RLM_MCP_MODEL="some-other-model")
    assert (
        other.returncode == 0 and "prompt profile: rlm-mcp (auto: some-other-model is not the adapter)" in other.stdout
    )


def test_image_status(tmp_path: Path) -> None:
    assert cli(tmp_path, "image", "status").returncode == 0
    missing = cli(tmp_path, "image", "status", RLM_MCP_SANDBOX_IMAGE="rlm-mcp-sandbox:not-built")
    assert missing.returncode == 1 and "rlm-mcp image build" in missing.stdout


def test_run_then_inspect_contexts_and_runs(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello from a file\n")
    with ScriptedLM(Script(root=[ANSWER])) as lm:
        proc = cli(tmp_path, "run", "What does it say?", "--path", str(notes), "--json", RLM_MCP_BASE_URL=lm.base_url)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "completed" and result["answer"] == "cli:hello from a file"
    assert "turn 1/20" in proc.stderr  # progress goes to stderr
    # Offline (fetching off) with no reference copy: the first run's log names the fix.
    assert "prompt profile rlm-mcp (auto: the adapter should get canonical" in proc.stderr
    assert "Run `rlm-mcp profile fetch`." in proc.stderr

    listed = cli(tmp_path, "contexts", "list")
    assert "notes.txt" in listed.stdout
    runs = cli(tmp_path, "runs", "list")
    assert result["run_id"] in runs.stdout and "completed" in runs.stdout
    shown = json.loads(cli(tmp_path, "runs", "show", result["run_id"]).stdout)
    assert shown["result"]["answer"] == "cli:hello from a file"
    events = [json.loads(line) for line in cli(tmp_path, "runs", "export", result["run_id"]).stdout.splitlines()]
    assert events[0]["type"] == "run_start" and events[-1]["type"] == "run_end"
    assert events[0]["prompt_profile"] == "rlm-mcp"

    chat = [
        json.loads(line)
        for line in cli(tmp_path, "runs", "export", result["run_id"], "--format", "chat").stdout.splitlines()
    ]
    assert len(chat) == 1 and chat[0]["answer"] == "cli:hello from a file"
    roles = [m["role"] for m in chat[0]["messages"]]
    assert roles == ["system", "user", "user", "assistant", "user"]
    assert "hello from a file" not in json.dumps(chat[0]["messages"])  # the root never saw the context

    page = tmp_path / "run.html"
    assert cli(tmp_path, "runs", "html", result["run_id"], "-o", str(page)).returncode == 0
    text = page.read_text()
    assert "What does it say?" in text and "cli:hello from a file" in text
    assert 'answer[\\"content\\"]' in text  # the model's code travels as JSON data, never as HTML

    missing = cli(tmp_path, "runs", "show", "run_nope")
    assert missing.returncode == 1 and "Unknown run id" in missing.stderr
    assert "rlm-mcp runs list" in missing.stderr and "rlm_start" not in missing.stderr  # phrased for a shell


def test_bad_configuration_is_reported_not_raised(tmp_path: Path) -> None:
    proc = cli(tmp_path, "contexts", "list", RLM_MCP_MAX_ITERATIONS="lots")
    assert proc.returncode == 2
    assert "RLM_MCP_MAX_ITERATIONS='lots'" in proc.stderr and "Traceback" not in proc.stderr
