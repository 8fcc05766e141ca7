"""Settings in sections: each RLM_MCP_* name (variable, TOML key, keyword) keeps its flat form and
lands in the one section that owns it; `settings.deployment` is the one decision of the mode."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rlm_mcp.config import SECTIONS, SETTING_FIELDS, LMSettings, SandboxSettings, Settings, load_settings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.testing.settings import make_settings

TEAM_DB = "postgresql://rlm:secret@127.0.0.1:1/rlm"  # never connected to here


def test_every_setting_belongs_to_exactly_one_section() -> None:
    owners: dict[str, list[str]] = {}
    for name, section in SECTIONS.items():
        for field in section.model_fields:
            owners.setdefault(field, []).append(name)
    assert set(owners) == set(SETTING_FIELDS)
    assert {field: names for field, names in owners.items() if len(names) > 1} == {}


def test_a_section_holds_the_values_the_settings_were_given(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_sandboxes=3, model="m1", port=9000, run_max_records=7)
    for name, section_model in SECTIONS.items():
        section = getattr(settings, name)
        assert type(section) is section_model
        for field in section_model.model_fields:
            assert getattr(section, field) == getattr(settings, field), (name, field)
    assert settings.sandbox.max_sandboxes == 3 and settings.lm.model == "m1" and settings.server.port == 9000
    # A copy with an update is seen by its sections too.
    assert settings.model_copy(update={"max_sandboxes": 5}).sandbox.max_sandboxes == 5


def test_the_environment_and_the_config_file_keep_their_flat_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "rlm.toml"
    config.write_text('max_runs = 6\nsub_model = "small"\n', encoding="utf-8")
    monkeypatch.setenv("RLM_MCP_CONFIG", str(config))
    monkeypatch.setenv("RLM_MCP_SANDBOX_MEMORY", "2g")
    monkeypatch.setenv("RLM_MCP_AUTH_TOKENS", "a, b")
    settings = load_settings(max_sandboxes=2)
    assert settings.runs.max_runs == 6
    assert settings.lm.effective_sub_model == "small"
    assert settings.sandbox.sandbox_memory == "2g" and settings.sandbox.max_sandboxes == 2
    assert settings.server.auth_tokens == ["a", "b"]


def test_a_component_typed_with_its_section_sees_no_other_setting(tmp_path: Path) -> None:
    section = make_settings(tmp_path).sandbox
    assert isinstance(section, SandboxSettings) and not isinstance(section, Settings)
    assert not hasattr(section, "base_url") and not hasattr(section, "database_url")


def test_the_deployment_is_decided_by_the_database_url_alone(tmp_path: Path) -> None:
    embedded = make_settings(tmp_path).deployment
    assert (embedded.embedded, embedded.team, embedded.name) == (True, False, "embedded")
    assert embedded.executes_runs and embedded.serves_mcp
    front = make_settings(tmp_path, database_url=TEAM_DB, role="front").deployment
    assert (front.team, front.name, front.executes_runs, front.serves_mcp) == (True, "front", False, True)
    worker = make_settings(tmp_path, database_url=TEAM_DB, role="worker").deployment
    assert (worker.name, worker.executes_runs, worker.serves_mcp) == ("worker", True, False)
    # A blank variable is the embedded store, whatever the role says.
    assert make_settings(tmp_path, database_url="  ", role="worker").deployment.embedded


def test_the_database_dsn_is_read_in_team_mode_only(tmp_path: Path) -> None:
    team = make_settings(tmp_path, database_url=TEAM_DB).deployment.database
    assert team is not None and team.dsn == TEAM_DB
    assert make_settings(tmp_path).deployment.database is None
    # A front or a worker without it is refused in one place, where a process starts serving.
    with pytest.raises(RlmMcpError, match="RLM_MCP_DATABASE_URL"):
        make_settings(tmp_path, role="front").deployment.served()


def test_a_section_built_on_its_own_refuses_a_setting_it_does_not_own() -> None:
    # A test that builds only the LM section must not silently drop a sandbox setting.
    with pytest.raises(ValidationError, match="max_sandboxes"):
        LMSettings.model_validate({"max_sandboxes": 2})
    assert LMSettings(model="m").effective_sub_model == "m"


def test_settings_hold_their_sections_and_keep_the_flat_names(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_sandboxes=2, role="front")
    # Composed, not inherited: a part typed with its section cannot be handed the whole Settings.
    assert not isinstance(settings, SandboxSettings) and isinstance(settings.sandbox, SandboxSettings)
    assert (settings.sandbox.max_sandboxes, settings.team.role) == (2, "front")
    assert {"max_sandboxes", "role"} <= settings.model_fields_set  # the flat names given
    copied = settings.model_copy(update={"max_sandboxes": 3})
    assert (copied.sandbox.max_sandboxes, settings.sandbox.max_sandboxes) == (3, 2)
    flat = "max_sandboxes"  # an untyped script's flat read still answers (typed code reads the section)
    assert getattr(settings, flat) == 2
