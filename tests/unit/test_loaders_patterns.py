"""Glob matching: same meaning as before, linear work on any pattern, clear errors for bad ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from rlm_mcp.errors import BadArgumentError
from rlm_mcp.server.app import build_server
from rlm_mcp.service.loaders import load_path
from rlm_mcp.service.loaders.patterns import MAX_PATTERN_CHARS, MAX_PATTERNS, Glob, check_patterns, compile_glob
from tests.fixtures_store import sections
from tests.fixtures_surface import make_settings

EVIL = "*?" * 12 + "Z"


def _reference(pattern: str) -> re.Pattern[str]:
    """The former regex translation (backtracking), kept as the meaning to preserve."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if i < len(pattern) and pattern[i] == "/":
                    i += 1
                    out.append("(?:.*/)?")
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab/*?", max_size=8).filter(lambda p: "***" not in p),
    st.text(alphabet="ab/", max_size=10),
)
def test_same_meaning_as_the_regex_translation(pattern: str, path: str) -> None:
    assert compile_glob(pattern).match(path) == (_reference(pattern).match(path) is not None)


def test_classes_and_globstar() -> None:
    assert compile_glob("[a-c]x").match("bx") and not compile_glob("[a-c]x").match("dx")
    assert compile_glob("[!a-c]x").match("dx") and not compile_glob("[!a-c]x").match("/x")
    assert compile_glob("src/**/b.py").match("src/b.py") and compile_glob("src/**/b.py").match("src/p/q/b.py")
    assert compile_glob("[z").match("[z")  # an unclosed '[' is a plain character


def test_pathological_pattern_does_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[int] = []
    real_step = Glob._step

    def counting(self: Glob, states: frozenset[int], char: str) -> frozenset[int]:
        steps.append(1)
        return real_step(self, states, char)

    monkeypatch.setattr(Glob, "_step", counting)
    name = "ordinary_file_name_" * 20 + ".txt"  # 384 characters
    for pattern in (EVIL, "*?" * 200 + "Z"):
        assert compile_glob(pattern).match(name) is False
        # At most one new state-set transition per character: work grows with the text, not 2^stars.
        assert len(steps) <= len(name)
        steps.clear()


def test_bad_patterns_are_argument_errors() -> None:
    with pytest.raises(BadArgumentError, match="invalid character range 'z-a'"):
        check_patterns(["[z-a]"], "include")
    with pytest.raises(BadArgumentError, match="NUL"):
        check_patterns(["a\0b"], "exclude")
    with pytest.raises(BadArgumentError, match="lone surrogate"):
        check_patterns(["\ud800*"], "include")
    with pytest.raises(BadArgumentError, match="characters long"):
        check_patterns(["a" * (MAX_PATTERN_CHARS + 1)], "include")
    with pytest.raises(BadArgumentError, match="patterns given"):
        check_patterns(["*.py"] * (MAX_PATTERNS + 1), "include")
    with pytest.raises(BadArgumentError, match="empty"):
        check_patterns([" "], "include")


@pytest.mark.anyio
async def test_evil_include_on_a_real_folder_answers(tmp_path: Path) -> None:
    settings_ = make_settings(tmp_path, "http://127.0.0.1:9/v1")
    folder = tmp_path / "root" / "proj"
    folder.mkdir()
    for k in range(50):
        (folder / f"an_ordinary_file_name_{k}.txt").write_text("x\n")
    with pytest.raises(BadArgumentError, match="No text file"):
        await load_path(str(folder), **sections(settings_), include=["*?" * 30 + "Z"])


@pytest.mark.anyio
async def test_bad_input_is_a_tool_error_and_other_calls_go_on(tmp_path: Path) -> None:
    settings_ = make_settings(tmp_path, "http://127.0.0.1:9/v1")
    folder = tmp_path / "root" / "proj"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"path": str(folder), "include": ["[z-a]"]}, "invalid character range"),
        ({"path": str(folder), "exclude": ["x\0"]}, "NUL"),
        ({"path": str(folder) + "\0/a.txt"}, "NUL"),
        ({"glob": str(folder) + "/[z-a].txt"}, "invalid character range"),
        ({"path": str(folder) + "/\ud800"}, "lone UTF-16 surrogate"),
    ]
    async with Client(build_server(settings_)) as client:
        async with anyio.create_task_group() as tg:
            answers: dict[int, str] = {}

            async def one(k: int, args: dict[str, Any]) -> None:
                result = await client.call_tool("rlm_load_context", args)
                assert result.is_error
                answers[k] = " ".join(getattr(c, "text", "") for c in result.content)

            for k, (args, _) in enumerate(cases):
                tg.start_soon(one, k, args)
            listed = await client.call_tool("rlm_list_contexts", {})
            assert not listed.is_error
        for k, (_, expected) in enumerate(cases):
            # A crash would read only "Error executing tool rlm_load_context": the cause must be there.
            assert expected in answers[k] and "Internal error" not in answers[k]
