"""Settings: environment variables, the TOML file, parsing, and the README staying true."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlm_mcp.config import SETTING_FIELDS, Settings, parse_size, sandbox_usable_bytes
from tests.paths import REPO
from tools.docs_pages import settings_table

README = REPO / "README.md"
DOCS = REPO / "docs"


def test_defaults_match_the_design() -> None:
    s = Settings()
    assert s.lm.base_url == "http://localhost:8000/v1"
    assert s.lm.model == "rlm-v0.1" and s.lm.effective_sub_model == "rlm-v0.1"
    assert s.lm.api_key == "EMPTY" and s.lm.extra_body == {}
    assert (s.loop.max_iterations, s.loop.max_depth, s.lm.root_max_tokens, s.lm.sub_max_tokens) == (20, 1, 4096, 4096)
    assert s.sandbox.pool_size == 2 and s.sandbox.cell_timeout_s == 60
    assert s.loads.allowed_roots == [Path.home()]


def test_environment_wins_and_lists_are_split(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLM_MCP_ALLOWED_ROOTS", os.pathsep.join([str(tmp_path / "a"), "~/b"]))
    monkeypatch.setenv("RLM_MCP_EXTRA_BODY", '{"chat_template_kwargs": {"enable_thinking": false}}')
    monkeypatch.setenv("RLM_MCP_SUB_MODEL", "small")
    monkeypatch.setenv("RLM_MCP_ALLOWED_SUB_MODELS", "a, b")
    s = Settings()
    assert s.loads.allowed_roots == [tmp_path / "a", Path.home() / "b"]
    assert s.lm.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert s.lm.effective_sub_model == "small"
    assert s.lm.allowed_sub_models == ["a", "b"]


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
    assert s.lm.model == "from-toml"
    assert s.sandbox.pool_size == 1


def test_sizes_use_dockers_units() -> None:
    assert parse_size("256m") == 256 << 20
    assert parse_size("1g") == 1 << 30
    assert parse_size("64mb") == 64 << 20
    assert parse_size("4096") == 4096


def test_the_configuration_page_tables_every_setting_from_the_model() -> None:
    # docs/configuration.md carries the table as generated text (tools/docs_pages.py), never by hand.
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert "<!-- generated: settings -->" in page
    assert not re.search(r"^\| `RLM_MCP_", page, re.M), "a hand-kept settings row in docs/configuration.md"
    table = settings_table()
    for name, field in SETTING_FIELDS.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `RLM_MCP_{name.upper()}` |"))
        assert field.description and field.description.replace("|", "\\|") in row, row


def test_every_setting_the_docs_name_exists() -> None:
    # A setting renamed or removed in the code must not live on in a page (RLM_MCP_SANDBOX_MAX_SANDBOXES
    # once did): every RLM_MCP_ name in the README and the docs is a setting, or a test-only variable.
    known = {f"RLM_MCP_{name.upper()}" for name in SETTING_FIELDS} | {"RLM_MCP_CONFIG"}
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        named = set(re.findall(r"RLM_MCP_[A-Z0-9_]*[A-Z0-9](?![*\w])", page.read_text(encoding="utf-8")))
        unknown = named - known - {"RLM_MCP_SCREENSHOTS", "RLM_MCP_MODLE"}
        assert not unknown, f"{page.name} names settings that do not exist: {sorted(unknown)}"


def test_installer_form_fields_left_unfilled_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a host passes for an optional field its user left empty: "" or the placeholder itself.
    monkeypatch.setenv("RLM_MCP_ALLOWED_ROOTS", "${user_config.allowed_roots}")
    monkeypatch.setenv("RLM_MCP_API_KEY", "")
    monkeypatch.setenv("RLM_MCP_BASE_URL", " ${user_config.base_url} ")
    monkeypatch.setenv("RLM_MCP_SUB_MODEL", "${user_config.sub_model}")
    s = Settings()
    assert s.loads.allowed_roots == [Path.home()]  # never a root named "${user_config...}", never none
    assert s.lm.base_url == "http://localhost:8000/v1" and s.lm.sub_model is None
    assert "api_key" not in s.model_fields_set
    monkeypatch.setenv("RLM_MCP_ALLOWED_ROOTS", "")
    assert Settings().loads.allowed_roots == [Path.home()]


def test_a_blank_auth_token_keeps_its_meaning(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not an installer form field: a blank token is still an error at start, never "no auth".
    monkeypatch.setenv("RLM_MCP_AUTH_TOKEN", "")
    assert "auth_token" in Settings().model_fields_set


@pytest.mark.parametrize("memory", ["1g", "512m", "4g"])
def test_the_largest_context_fits_the_sandbox_by_default(memory: str) -> None:
    # The two defaults agree: a text context of the largest size the store takes is one that a
    # sandbox of RLM_MCP_SANDBOX_MEMORY can load (the check each run meets, sandbox/manager.py).
    from rlm_mcp.ports.engine import ContextSpec
    from rlm_mcp.sandbox.manager import SandboxManager, estimate_context_memory

    settings = Settings(sandbox_memory=memory)
    largest = settings.store.max_context_bytes
    spec = ContextSpec(path=Path("/nonexistent"), format="text", kind="str", chars=largest, bytes=largest)
    assert estimate_context_memory(spec) <= sandbox_usable_bytes(memory)
    SandboxManager(settings.sandbox).check_fits([spec])  # raises if it would not fit
    assert Settings(sandbox_memory=memory, max_context_bytes=1234).store.max_context_bytes == 1234  # set: kept
