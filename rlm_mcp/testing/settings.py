"""The one settings factory of the tests (tests/fixtures_<layer>.py re-export it under their names)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm_mcp.config import Settings


def make_settings(tmp_path: Path | None = None, **overrides: Any) -> Settings:
    """Settings that read no `.env` file. With `tmp_path`, the data dir is `tmp_path/data` and the
    one allowed root is `tmp_path/root` (created); `overrides` win over both."""
    values: dict[str, Any] = {}
    if tmp_path is not None:
        root = tmp_path / "root"
        root.mkdir(exist_ok=True)
        values = {"data_dir": tmp_path / "data", "allowed_roots": [root]}
    values.update(overrides)
    return Settings(_env_file=None, **values)
