"""Issue 20, what the start checks: a `file:PATH` prompt profile must be a small regular UTF-8
file (item 12)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm_mcp.config import load_settings
from rlm_mcp.config_check import SettingsError
from rlm_mcp.engine.prompts import resolve_system_prompt
from rlm_mcp.errors import BadArgumentError
from rlm_mcp.prompt_file import MAX_PROMPT_BYTES


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "make",
    [
        _fifo,
        lambda tmp: Path("/dev/zero"),
        lambda tmp: Path("/proc/self/environ"),
        lambda tmp: (tmp / "big.txt", (tmp / "big.txt").write_text("x" * (MAX_PROMPT_BYTES + 1)))[0],
        lambda tmp: (tmp / "latin1.txt", (tmp / "latin1.txt").write_bytes(b"caf\xe9"))[0],
        lambda tmp: tmp / "missing.txt",
        lambda tmp: tmp,
    ],
    ids=["fifo", "dev-zero", "proc-environ", "too-big", "not-utf8", "missing", "folder"],
)
def test_a_bad_prompt_file_stops_the_start(tmp_path: Path, make: object) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(SettingsError) as err:
        load_settings(prompt_profile=f"file:{path}", data_dir=tmp_path / "data")
    assert "RLM_MCP_PROMPT_PROFILE" in str(err.value)
    assert str(path) in str(err.value)


def test_a_prompt_file_swapped_for_a_fifo_after_the_start_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "prompt.txt"
    good.write_text("You are a careful assistant.")
    settings = load_settings(prompt_profile=f"file:{good}", data_dir=tmp_path / "data")
    assert resolve_system_prompt(settings.loop.prompt_profile) == "You are a careful assistant."
    good.unlink()
    os.mkfifo(good)
    with pytest.raises(BadArgumentError) as err:  # at once: the open does not wait for a writer
        resolve_system_prompt(settings.loop.prompt_profile)
    assert "not a regular file" in str(err.value)
