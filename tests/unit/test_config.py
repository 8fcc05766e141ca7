"""Settings: environment variables, the TOML file, parsing, and the README staying true."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlm_mcp.config import Settings, parse_size
from tests.paths import REPO

README = REPO / "README.md"


def test_defaults_match_the_design() -> None:
    s = Settings()
    assert s.base_url == "http://localhost:8000/v1"
    assert s.model == "rlm-v0.1" and s.effective_sub_model == "rlm-v0.1"
    assert s.api_key == "EMPTY" and s.extra_body == {}
    assert (s.max_iterations, s.max_depth, s.root_max_tokens, s.sub_max_tokens) == (20, 1, 4096, 4096)
    assert s.pool_size == 2 and s.cell_timeout_s == 60
    assert s.allowed_roots == [Path.home()]


def test_environment_wins_and_lists_are_split(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLM_MCP_ALLOWED_ROOTS", os.pathsep.join([str(tmp_path / "a"), "~/b"]))
    monkeypatch.setenv("RLM_MCP_EXTRA_BODY", '{"chat_template_kwargs": {"enable_thinking": false}}')
    monkeypatch.setenv("RLM_MCP_SUB_MODEL", "small")
    monkeypatch.setenv("RLM_MCP_ALLOWED_SUB_MODELS", "a, b")
    s = Settings()
    assert s.allowed_roots == [tmp_path / "a", Path.home() / "b"]
    assert s.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert s.effective_sub_model == "small"
    assert s.allowed_sub_models == ["a", "b"]


def test_bad_values_are_refused_with_the_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_MCP_EXTRA_BODY", "[1, 2]")
    with pytest.raises(ValidationError, match="RLM_MCP_EXTRA_BODY must be a JSON object"):
        Settings()
    monkeypatch.delenv("RLM_MCP_EXTRA_BODY")
    monkeypatch.setenv("RLM_MCP_MAX_DEPTH", "0")
    with pytest.raises(ValidationError, match="max_depth"):
        Settings()
    monkeypatch.delenv("RLM_MCP_MAX_DEPTH")
    monkeypatch.setenv("RLM_MCP_SANDBOX_MEMORY", "lots")
    with pytest.raises(ValidationError, match="not a size"):
        Settings()


def test_toml_file_is_read_below_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "rlm.toml"
    config.write_text('model = "from-toml"\npool_size = 5\n')
    monkeypatch.setenv("RLM_MCP_CONFIG", str(config))
    monkeypatch.setenv("RLM_MCP_POOL_SIZE", "1")
    s = Settings()
    assert s.model == "from-toml"
    assert s.pool_size == 1


def test_sizes_use_dockers_units() -> None:
    assert parse_size("256m") == 256 << 20
    assert parse_size("1g") == 1 << 30
    assert parse_size("64mb") == 64 << 20
    assert parse_size("4096") == 4096


def test_readme_documents_every_setting() -> None:
    documented = set(re.findall(r"RLM_MCP_([A-Z0-9_]+)", README.read_text(encoding="utf-8")))
    missing = {name.upper() for name in Settings.model_fields} - documented
    assert not missing, f"settings missing from the README's configuration table: {sorted(missing)}"
