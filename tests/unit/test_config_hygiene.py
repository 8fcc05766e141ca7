"""Settings hygiene: typos are named with the nearest valid name, a missing config file is an
error, a bad value is one line naming the setting, the value and the expected form."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlm_mcp.config import SETTING_FIELDS, load_settings
from rlm_mcp.config_check import SettingsError, unknown_env_vars
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env


def test_unknown_variables_get_the_nearest_name() -> None:
    found = unknown_env_vars(
        SETTING_FIELDS,
        {"RLM_MCP_MODLE": "x", "RLM_MCP_MODEL": "y", "RLM_MCP_CONFIG": "f", "RLM_MCP_QQQQQQ": "1", "HOME": "/"},
    )
    assert found == [
        "unknown setting RLM_MCP_MODLE (ignored); did you mean RLM_MCP_MODEL?",
        "unknown setting RLM_MCP_QQQQQQ (ignored)",
    ]


def test_every_setting_is_a_known_variable() -> None:
    environ = {f"RLM_MCP_{name.upper()}": "x" for name in SETTING_FIELDS}
    assert unknown_env_vars(SETTING_FIELDS, environ) == []


def test_missing_config_file_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLM_MCP_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(SettingsError, match=r"nope\.toml, which does not exist"):
        load_settings()


def test_unknown_config_key_gets_the_nearest_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "rlm.toml"
    config.write_text('modle = "x"\npool_size = 1\n')
    monkeypatch.setenv("RLM_MCP_CONFIG", str(config))
    with pytest.raises(SettingsError, match=r"`modle`; did you mean model\?"):
        load_settings()


def test_bad_value_is_one_line_with_setting_value_and_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_MCP_MAX_DEPTH", "zero")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("RLM_MCP_MAX_DEPTH='zero': ")
    assert "expected an integer" in message


def test_bad_config_file_value_names_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "rlm.toml"
    config.write_text('transport = "udp"\n')
    monkeypatch.setenv("RLM_MCP_CONFIG", str(config))
    with pytest.raises(SettingsError, match=r"RLM_MCP_TRANSPORT='udp': .*expected one of stdio \| http"):
        load_settings()


def _cli(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = cli_env(tmp_path, **env)
    return subprocess.run([str(SERVER_SCRIPT), "runs", "list"], env=full, capture_output=True, text=True, timeout=60)


def test_cli_warns_about_a_typo_and_refuses_a_bad_value(tmp_path: Path) -> None:
    typo = _cli(tmp_path, RLM_MCP_MODLE="x")
    assert typo.returncode == 0, typo.stderr
    assert "unknown setting RLM_MCP_MODLE (ignored); did you mean RLM_MCP_MODEL?" in typo.stderr
    bad = _cli(tmp_path, RLM_MCP_PORT="eighty")
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlm-mcp: bad configuration: RLM_MCP_PORT='eighty': "), bad.stderr
    missing = _cli(tmp_path, RLM_MCP_CONFIG=str(tmp_path / "absent.toml"))
    assert missing.returncode == 2 and "absent.toml, which does not exist" in missing.stderr
