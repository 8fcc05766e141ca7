"""Prompt profiles and the fixed message texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.engine import resolve_system_prompt
from rlm_mcp.engine.formatting import format_cell, format_outputs, truncate_head
from rlm_mcp.engine.messages import turn_message
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT, check_canonical
from rlm_mcp.errors import BadArgumentError
from rlm_mcp.ports import CellResult


def test_rlm_mcp_profile_names_the_protocol() -> None:
    text = resolve_system_prompt("rlm-mcp")
    assert text == RLM_MCP_SYSTEM_PROMPT
    for name in (
        "```repl",
        "context",
        "llm_query(prompt, model=None)",
        "llm_query_batched",
        "rlm_query",
        "rlm_query_batched",
        "SHOW_VARS()",
        'answer["content"]',
        'answer["ready"] = True',
        "print(",
        "small",
        "plan",
    ):
        assert name in text, name


def test_file_profile(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("my prompt", encoding="utf-8")
    assert resolve_system_prompt(f"file:{path}") == "my prompt"
    with pytest.raises(BadArgumentError, match="does not exist"):
        resolve_system_prompt(f"file:{tmp_path / 'missing.txt'}")


def test_unknown_profile() -> None:
    with pytest.raises(BadArgumentError, match="rlm-mcp"):
        resolve_system_prompt("fancy")


def test_canonical_check_accepts_only_the_known_prompt() -> None:
    assert check_canonical("x" * 5357) is False


def test_turn_texts() -> None:
    first = turn_message(1, 20, 1)
    assert first.endswith("\n\nTurn 1/20:")
    safeguard = first.split("\n\n")[0]
    assert safeguard.count(". ") == 1 and safeguard.endswith(".")  # two sentences
    assert turn_message(7, 20, 1) == "Turn 7/20:"


def test_formatting() -> None:
    assert format_cell(CellResult()) == "No output"
    assert format_cell(CellResult(stdout="hi\n", variables=["a"])) == "\nhi\n\n\nREPL variables: ['a']\n"
    text = format_cell(CellResult(stderr="warn\n", error="ValueError: x"))
    assert text == "\nwarn\nValueError: x"
    assert (
        format_cell(CellResult(stderr="Traceback...\nValueError: x\n", error="ValueError: x")).count("ValueError: x")
        == 1
    )
    assert truncate_head("abcdef", 4) == "abcd... + [2 chars...]"
    assert format_outputs(["a"], 20000) == "REPL output:\na"
    assert format_outputs(["a", "b"], 20000) == "REPL output (block 1):\na\n\nREPL output (block 2):\nb"
