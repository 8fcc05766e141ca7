"""The tier folders give the markers (tests/tiers.py): where a module lives decides what it may
use, and a module in the wrong place is named with the fix instead of running in the wrong tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiers import MARKERS, TESTS, TIER_MARKERS, folder_markers, misfit, placement_error


def test_each_folder_gives_its_markers() -> None:
    assert folder_markers(TESTS / "unit" / "test_x.py") == ()
    assert folder_markers(TESTS / "postgres" / "test_x.py") == ("postgres",)
    assert folder_markers(TESTS / "docker" / "test_x.py") == ("docker",)
    assert set(folder_markers(TESTS / "e2e" / "test_x.py") or ()) == {"docker", "postgres"}
    assert folder_markers(TESTS / "clients" / "test_x.py") == ("docker",)


def test_a_module_outside_every_tier_has_no_place(tmp_path: Path) -> None:
    assert folder_markers(TESTS / "test_x.py") is None
    assert folder_markers(TESTS / "data" / "test_x.py") is None
    assert misfit(TESTS / "test_x.py", set()) == "test_x.py (outside a tier folder)"
    assert folder_markers(tmp_path / "test_x.py") == ()  # not the suite's: left alone


def test_a_module_needing_more_than_its_folder_gives_is_named() -> None:
    assert misfit(TESTS / "unit" / "test_x.py", {"postgres"}) == "test_x.py (needs postgres)"
    assert misfit(TESTS / "postgres" / "test_x.py", {"docker", "postgres"}) == "test_x.py (needs docker)"
    assert misfit(TESTS / "e2e" / "test_x.py", {"docker", "postgres"}) is None
    message = placement_error(["test_a.py (needs docker)", "test_b.py (outside a tier folder)"])
    assert "test_a.py (needs docker), test_b.py (outside a tier folder)" in message
    assert "tests/<tier>/" in message and ", ".join(TIER_MARKERS) in message


def test_every_test_module_is_in_a_tier_folder() -> None:
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == [], f"move these under a tier folder: {loose}"
    assert all((TESTS / tier).is_dir() for tier in TIER_MARKERS)


def test_the_tier_markers_are_registered(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert registered >= MARKERS


@pytest.mark.parametrize("tier", ["unit", "postgres"])
def test_the_fast_tiers_are_not_marked_docker(request: pytest.FixtureRequest, tier: str) -> None:
    # This module is in tests/unit: the folder gave it no marker at all.
    assert request.node.get_closest_marker("docker") is None
    assert "docker" not in (folder_markers(TESTS / tier / "test_x.py") or ())
