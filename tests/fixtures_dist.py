"""The wheel and sdist built from this checkout with `uv build` (once per test session)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures_uv import REPO, uv_path


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path


def build_dists(out: Path) -> Dists:
    subprocess.run([uv_path(), "build", "-q", "--out-dir", str(out), str(REPO)], check=True, timeout=600)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Dists(wheel, sdist)
