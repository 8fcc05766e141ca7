"""The reference texts (read from the pinned wheel, never imported into this process) and the
rule that picks the prompt profile."""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.engine.profiles import format_trained_cell
from rlm_mcp.errors import BadArgumentError, RlmMcpError
from rlm_mcp.ports import CellResult
from rlm_mcp.reference import load_reference_texts
from rlm_mcp.reference.wheel import fetch_wheel
from rlm_mcp.service.profile import choose_profile, is_adapter
from tests.fixtures_reference import reference_wheel, seed_data_dir
from tests.fixtures_store import LoopbackServer

__all__ = ["reference_wheel"]


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", reference_fetch=False, **kw)  # type: ignore[arg-type]


def test_texts_come_from_the_wheel_without_its_package_init(reference_wheel: Path, tmp_path: Path) -> None:
    # Unpacked, with an __init__ that would fail: the builders still run, so no __init__ ran.
    root = tmp_path / "unpacked"
    with zipfile.ZipFile(reference_wheel) as archive:
        archive.extractall(root)
    (root / "rlm" / "__init__.py").write_text("raise RuntimeError('the package __init__ ran')\n")
    texts = load_reference_texts(root)
    assert hashlib.sha256(texts.system.encode()).hexdigest().startswith("64ba1c0e5543f4f4")
    assert len(texts.system) == 5357
    assert "rlm" not in sys.modules  # nothing of it was imported here
    from_wheel = load_reference_texts(reference_wheel)
    assert from_wheel.system == texts.system and from_wheel.turn_first == texts.turn_first


def test_filled_templates(reference_wheel: Path) -> None:
    texts = load_reference_texts(reference_wheel)
    meta = texts.metadata("What is x?", "list", 1234)
    assert meta.startswith("Answer the following: What is x?\n\n") and "a list of 1234 total characters" in meta
    assert texts.metadata(None, "str", 5).startswith("Your context is a str of 5 total characters")
    assert texts.turn_message(4, 20, 1) == "Turn 4/20:"
    first = texts.turn_message(1, 20, 1)
    assert first.endswith("\n\nTurn 1/20:") and len(first) > 60
    assert texts.turn_message(2, 7, 3).startswith(
        "Turn 2/7:\n\n"
    ) and "context_0 through context_2" in texts.turn_message(2, 7, 3)
    # A query holding a marker is not filled again.
    assert "\x00N\x00" in texts.metadata("\x00N\x00", "str", 1)


def test_trained_cell_layout() -> None:
    raised = CellResult(
        stdout="hi\n",
        error="ZeroDivisionError: division by zero\n...",
        trained_error="\nZeroDivisionError: division by zero\nTraceback (most recent call last):\n  x\n",
        variables=["answer", "context_0", "context", "made_before_raise"],
        variables_at_start=["answer", "context_0", "context"],
    )
    assert format_trained_cell(raised) == (
        "\nhi\n\n\n\n\nZeroDivisionError: division by zero\nTraceback (most recent call last):\n  x\n"
        "\n\nREPL variables: ['answer', 'context_0', 'context']\n"
    )
    assert format_trained_cell(CellResult()) == "No output"


def test_auto_gives_the_adapter_canonical(reference_wheel: Path, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    seed_data_dir(settings.store.data_dir, reference_wheel)
    assert settings.loop.prompt_profile == "auto" and is_adapter(settings.lm.model)
    choice = choose_profile(settings.service)
    assert choice.profile.name == "canonical" and not choice.fix
    other = choose_profile(_settings(tmp_path, model="gpt-4o-mini").service)
    assert other.profile.name == "rlm-mcp"


def test_auto_without_a_copy_falls_back_and_names_the_fix(tmp_path: Path) -> None:
    choice = choose_profile(_settings(tmp_path).service)
    assert choice.profile.name == "rlm-mcp"
    assert "rlm-mcp profile fetch" in choice.fix
    with pytest.raises(BadArgumentError, match="rlm-mcp profile fetch"):
        choose_profile(_settings(tmp_path, prompt_profile="canonical").service)


@pytest.fixture
def fake_index(http_server: LoopbackServer) -> str:
    """A package index whose one wheel is not the pinned one."""
    wheel = "rlms-0.1.3-py3-none-any.whl"
    listing = {"urls": [{"filename": wheel, "url": http_server.url(f"/{wheel}")}]}
    http_server.route("/pypi/rlms/0.1.3/json", json.dumps(listing).encode(), Content_Type="application/json")
    http_server.route(f"/{wheel}", b"not the wheel")
    return http_server.url("/pypi/rlms/0.1.3/json")


def test_fetch_refuses_a_wheel_with_another_hash(fake_index: str, tmp_path: Path) -> None:
    with pytest.raises(RlmMcpError, match="pinned SHA-256"):
        fetch_wheel(tmp_path, index_url=fake_index)
    assert not list(tmp_path.rglob("*.whl"))
