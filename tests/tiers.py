"""The test tiers: each folder under tests/ says what its tests need and gives them the markers
that say so (tests/conftest.py applies them at collection). CONTRIBUTING.md, "Tests, in tiers",
says which folder a new test goes in.

`-m "not docker"` is the fast tier (unit and postgres). e2e runs the whole product (servers,
Docker sandboxes, either store), so it carries both markers: the one folder for a module that
needs Docker and PostgreSQL. The client tier drives real servers from third-party clients (npm
tools, uv environments of their own), two of them with sandboxes: it runs with the Docker tier,
not in the fast one."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

TIER_MARKERS: dict[str, tuple[str, ...]] = {
    "unit": (),
    "postgres": ("postgres",),
    "docker": ("docker",),
    "e2e": ("docker", "postgres"),
    "clients": ("docker",),
}
# Where a fast-tier test finds Docker (tests/conftest.py sets it as DOCKER_HOST): nowhere. A socket
# path that cannot exist, so docker-py and the docker CLI fail to connect, in the test's process and
# in every process it starts.
NO_DOCKER = "unix:///nonexistent/fast-tier-has-no-docker.sock"
MARKERS = frozenset(name for names in TIER_MARKERS.values() for name in names)
TESTS = Path(__file__).resolve().parent


def folder_markers(path: Path) -> tuple[str, ...] | None:
    """The markers a test module gets from its tier folder; None for a module under tests/ but
    outside every tier. A module outside tests/ (a test's own temporary project) gets none."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return ()
    return TIER_MARKERS.get(parts[0]) if len(parts) > 1 else None


def misfit(path: Path, needs: Iterable[str]) -> str | None:
    """Why a test module is in the wrong place for what one of its tests needs (tier markers),
    or None when its folder gives all of it."""
    given = folder_markers(path)
    if given is None:
        return f"{path.name} (outside a tier folder)"
    missing = sorted(set(needs) - set(given))
    return f"{path.name} (needs {' and '.join(missing)})" if missing else None


def placement_error(misfits: Iterable[str]) -> str:
    """The one message for every misplaced module, with the fix."""
    return (
        f"test modules outside a tier folder that fits them: {', '.join(sorted(set(misfits)))}. Move each "
        f"under tests/<tier>/, where <tier> is one of {', '.join(TIER_MARKERS)}; the folder gives the "
        "markers (CONTRIBUTING.md, Tests, in tiers: which tier a test belongs to)."
    )
