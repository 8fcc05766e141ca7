"""What the selected tests need from the machine, checked once before any test runs: one message
that lists everything missing with how to get it, instead of failures scattered over the run."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.tiers import folder_markers

# Modules that run a JavaScript tool (npx, tests/js): need Node.js and npm.
NODE_MODULES = frozenset({"test_client_snippets", "test_claude_code_cli", "test_bundle", "test_ts_sdk_client"})
CHROMIUM_MODULES = frozenset(
    {"test_viewer_browser", "test_viewer_live", "test_viewer_sessions", "test_viewer_throttling_browser"}
)
# Modules that scrape a server with Prometheus or check rules with promtool.
PROMETHEUS_MODULES = frozenset({"test_obs_metrics", "test_obs_deploy", "test_obs_team"})


def _module(item: pytest.Item) -> str:
    module = getattr(item, "module", None)  # a Function's; other items have none
    return module.__name__.rpartition(".")[2] if module is not None else ""


def _docker_answers() -> str | None:
    from rlm_mcp.errors import RlmMcpError
    from rlm_mcp.sandbox.docker.docker_api import connect_sync

    try:
        connect_sync(timeout=10).close()
    except RlmMcpError as exc:
        return f"{exc.cause} {exc.fix or ''}".strip()
    return None


def missing(items: list[pytest.Item]) -> list[str]:
    return missing_for({_module(i) for i in items}, any(i.get_closest_marker("docker") is not None for i in items))


def missing_for(modules: set[str], docker: bool) -> list[str]:
    """What tests of `modules` (names without their package) need and this machine lacks;
    `docker`: whether any of them needs Docker."""
    found: list[str] = []
    if modules & NODE_MODULES and not (shutil.which("node") and shutil.which("npm") and shutil.which("npx")):
        found.append("Node.js with npm and npx (apt-get install nodejs npm; tested with Node 20.20)")
    if modules & CHROMIUM_MODULES and not (shutil.which("chromium") or shutil.which("chromium-browser")):
        found.append("Chromium, for the viewer's browser tests (apt-get install chromium)")
    if modules & PROMETHEUS_MODULES and not (shutil.which("prometheus") and shutil.which("promtool")):
        found.append("Prometheus and promtool, for the metrics tests (apt-get install prometheus)")
    if docker:
        problem = _docker_answers()
        if problem is not None:
            found.append(f"a running Docker daemon ({problem})")
    return found


def _paths(rootpath: Path, ids: Sequence[str]) -> set[Path]:
    return {rootpath / test_id.partition("::")[0] for test_id in ids}


def docker_needed(rootpath: Path, ids: Sequence[str]) -> bool:
    """Whether any of the tests `ids` (`path::name[param]`, relative to `rootpath`: an xdist
    controller's view) needs Docker: its module's tier folder says so (tests/tiers.py)."""
    return any("docker" in (folder_markers(p) or ()) for p in _paths(rootpath, ids))


def missing_for_ids(rootpath: Path, ids: Sequence[str]) -> list[str]:
    """`missing` from test ids, as an xdist controller has them (`docker_needed`)."""
    return missing_for({p.stem for p in _paths(rootpath, ids)}, docker_needed(rootpath, ids))


def check(session: pytest.Session) -> None:
    """Stop before the first test when something the selected tests need is missing. An xdist
    worker leaves it to the controller (`check_ids`): a worker that exits is a crash there."""
    if not hasattr(session.config, "workerinput"):
        stop_if(missing(list(session.items)))


def check_ids(rootpath: Path, ids: Sequence[str]) -> None:
    """`check` in an xdist controller, from a worker's collection, before any test is sent out."""
    stop_if(missing_for_ids(rootpath, ids))


def stop_if(lacking: list[str]) -> None:
    if lacking:
        lines = "\n".join(f"  - {what}" for what in lacking)
        pytest.exit(
            f"The selected tests need what this machine lacks:\n{lines}\n"
            "Install it (docs/getting-started.md, Install; `bash .ci/run` does all of it on Debian), or run the fast tier "
            '(-m "not docker") where Docker is the only thing missing.',
            returncode=1,
        )
