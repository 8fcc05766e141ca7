"""One-off commands in team mode (`rlm-mcp run`, `rlm-mcp eval`) queue their runs as fronts: as
workers they would claim other people's runs and cancel them when they exit. The embedded default
keeps its settings."""

from __future__ import annotations

from pathlib import Path

from rlm_mcp.config.one_off import for_one_off_command
from rlm_mcp.eval.runner import EvalOptions, eval_settings
from rlm_mcp.testing.settings import make_settings

TEAM_DB = "postgresql://rlm:secret@127.0.0.1:1/rlm"  # never connected to here


def test_an_eval_in_team_mode_queues_its_runs_as_a_front(tmp_path: Path) -> None:
    options = EvalOptions(task_file=tmp_path / "tasks.jsonl", output_dir=tmp_path / "out", parallel=4)
    team = eval_settings(make_settings(tmp_path, database_url=TEAM_DB, role="both"), [], options)
    assert team.team.role == "front" and team.runs.max_runs >= 4
    embedded = eval_settings(make_settings(tmp_path), [], options)
    assert embedded.team.role == "both" and embedded.team.database_url is None


def test_a_one_off_run_in_team_mode_is_a_front_whatever_its_role_setting(tmp_path: Path) -> None:
    for role in ("both", "worker", "front"):
        assert for_one_off_command(make_settings(tmp_path, database_url=TEAM_DB, role=role)).team.role == "front"
    assert for_one_off_command(make_settings(tmp_path, role="both")).team.role == "both"
