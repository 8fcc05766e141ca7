"""What PyPI gets: the wheel and sdist pass `twine check --strict`, carry the license, the
classifiers and the repository URL, and a long description without images or relative links
(PyPI shows no file of the repository). The URL is written once, in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

from tests.fixtures_dist import Dists, build_dists
from tests.fixtures_uv import REPO


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    return build_dists(tmp_path_factory.mktemp("dist"))


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(name).decode("utf-8"))


def test_twine_check_strict_passes(dists: Dists) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dists.wheel), str(dists.sdist)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2


def test_wheel_metadata_is_complete_and_its_description_stands_alone(dists: Dists) -> None:
    meta = wheel_metadata(dists.wheel)
    repository = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    assert f"Repository, {repository}" in meta.get_all("Project-URL", [])
    classifiers = meta.get_all("Classifier", [])
    assert "Programming Language :: Python :: 3.11" in classifiers and len(classifiers) >= 8
    assert meta["Description-Content-Type"] == "text/markdown"
    body = meta.get_payload()
    assert isinstance(body, str) and "# rlm-mcp" in body
    assert "![" not in body, "an image in the long description is broken on PyPI"
    assert "](docs/" not in body and "](CONTRIBUTING" not in body
    with zipfile.ZipFile(dists.wheel) as z:
        names = z.namelist()
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "rlm_mcp/sandbox_images/default/Dockerfile" in names  # `rlm-mcp image build` from the wheel
    for dialect in ("sqlite", "postgres"):  # the migrations, read as package data
        shipped = sorted(REPO.glob(f"rlm_mcp/store/migrations/{dialect}/[0-9]*"))
        assert shipped and {p.relative_to(REPO).as_posix() for p in shipped} <= set(names)
