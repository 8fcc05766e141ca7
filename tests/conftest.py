"""Shared pytest set-up: the test tiers and the fixtures every layer's tests may use.

Tiers: test modules live in tier folders (tests/unit, postgres, docker, e2e, clients) and get their
markers from the folder (`tests/tiers.py`): `docker` (a Docker daemon and the sandbox image) and
`postgres` (PostgreSQL's server binaries), so `pytest -m "not docker"` runs the fast tier alone. A
module outside a tier folder, or one using PostgreSQL outside a tier that has it, stops the
collection with the fix. A fast-tier test that reaches for Docker in-process fails at once with a
message saying so (see `_no_docker_in_fast_tier`), and one that reaches it through a process it
starts finds no daemon (DOCKER_HOST points nowhere: `pytest_runtest_protocol`).

Plain helper functions stay importable from tests/fixtures_<layer>.py; the fixtures below are
registered here so test modules need not import them by name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import DockerUnavailableError, SandboxError
from rlm_mcp.testing.image_ensure import ensure_image
from tests import parallel
from tests.chromium import browser
from tests.fixtures_bucket import bucket_url, rclone_s3, seaweedfs
from tests.fixtures_phoenix import phoenix
from tests.fixtures_postgres import (
    STORES,
    STORES_OF_BYTES,
    database_url,
    pg_cluster,
    pg_migrated_url,
    pg_template,
    pg_url,
    store_settings,
)
from tests.fixtures_sandbox import docker_image, fast_channel
from tests.fixtures_spans import recorded_spans
from tests.fixtures_store import http_server, root, settings, settings_factory
from tests.tiers import MARKERS, NO_DOCKER, folder_markers, misfit, placement_error

__all__ = [
    "browser",
    "bucket_url",
    "rclone_s3",
    "seaweedfs",
    "database_url",
    "docker_image",
    "fast_channel",
    "http_server",
    "phoenix",
    "pg_cluster",
    "pg_migrated_url",
    "pg_template",
    "pg_url",
    "recorded_spans",
    "root",
    "settings",
    "settings_factory",
    "store_settings",
]

# What the user exported is not the tests' configuration: every test states the settings it needs
# (make_settings, cli_env, minimal_env), and an exported RLM_MCP_INSTANCE_ID or RLM_MCP_CONFIG
# would change what a test sees. Cleared before any test or fixture reads the environment.
# The same for OpenTelemetry's standard variables: an exported OTEL_EXPORTER_OTLP_ENDPOINT would
# make every server a test starts send spans somewhere; the tracing tests set their own.
CLEARED_SETTINGS = sorted(name for name in os.environ if name.upper().startswith(("RLM_MCP_", "OTEL_")))
for _name in CLEARED_SETTINGS:
    del os.environ[_name]

_PORT_CLAIMS = pytest.StashKey[Path | None]()
_PREPARED = pytest.StashKey[bool]()


def pytest_report_header(config: pytest.Config) -> str | None:
    if not CLEARED_SETTINGS:
        return None
    return "cleared from the test environment: " + ", ".join(CLEARED_SETTINGS)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many workers `-n auto` (the test command's addopts) starts: tests/parallel.py."""
    return parallel.worker_count()


def pytest_configure(config: pytest.Config) -> None:
    # In the controller (or a run without workers); the workers inherit the folder's variable.
    config.stash[_PORT_CLAIMS] = parallel.start_port_claims()


def pytest_unconfigure(config: pytest.Config) -> None:
    parallel.end_port_claims(config.stash.get(_PORT_CLAIMS, None))


def pytest_collection_finish(session: pytest.Session) -> None:
    from prerequisites import check

    check(session)


def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """In an xdist controller, once the first worker has collected (every worker collects the
    same tests) and before any test is sent out: the prerequisite check, then the sandbox image
    built once for all workers when Docker tests are selected."""
    from prerequisites import check_ids, docker_needed

    config = node.config  # type: ignore[attr-defined]
    if config.stash.get(_PREPARED, False):
        return
    config.stash[_PREPARED] = True
    check_ids(config.rootpath, ids)
    if docker_needed(config.rootpath, ids):
        _ensure_sandbox_image()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # store_settings: each store; tests of stored bytes also with the bytes in a bucket.
    if "store_settings" in metafunc.fixturenames:
        bytes_too = getattr(metafunc.module, "BLOBS_IN_A_BUCKET", False)
        metafunc.parametrize("store_settings", STORES_OF_BYTES if bytes_too else STORES, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # One import path for test helpers: `tests.fixtures_x`. A bare `fixtures_x` import would load
    # the module a second time (two copies of its state and classes).
    bare = sorted(m for m in sys.modules if m.startswith(("fixtures_", "chromium")))
    assert not bare, f"import test helpers as tests.<module>, not {bare}"
    misfits: list[str] = []
    for item in items:
        # What the test needs: a tier marker of its own or of a fixture's parameter
        # (store_settings' PostgreSQL case), or the PostgreSQL cluster.
        needs = {m.name for m in item.iter_markers() if m.name in MARKERS}
        if "pg_cluster" in getattr(item, "fixturenames", ()):
            needs.add("postgres")
        wrong = misfit(item.path, needs)
        if wrong is not None:
            misfits.append(wrong)
        for name in folder_markers(item.path) or ():
            item.add_marker(name)
    if misfits:
        raise pytest.UsageError(placement_error(misfits))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """A fast-tier test never reaches Docker, not even through a server or CLI it starts: for the
    whole of its setup, call and teardown (module-scoped fixtures included: they are set up inside
    the first test that uses them), DOCKER_HOST points at a socket that does not exist, and the
    processes the test starts inherit it. A Docker-tier test sees the environment as it was. So one
    run of the suite checks this for every fast-tier test, instead of a second run of the fast tier
    with DOCKER_HOST pointed nowhere from outside."""
    if item.get_closest_marker("docker") is not None:
        return (yield)
    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = NO_DOCKER
    try:
        return (yield)
    finally:
        if saved is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = saved


@pytest.fixture(autouse=True)
def _no_docker_in_fast_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keep the tiers honest: without the marker, connecting to Docker in-process is an error.
    Tests with the marker get the sandbox image built first, when it is missing."""
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("sandbox_image_built")
    else:
        from rlm_mcp.sandbox.docker import docker_api

        def refuse(*args: object, **kwargs: object) -> None:
            raise RuntimeError(
                f"{request.node.nodeid} connects to Docker but has no `docker` marker: "
                "move its module to tests/docker (or tests/e2e), whose tests get the marker."
            )

        monkeypatch.setattr(docker_api, "connect_sync", refuse)
    yield


@pytest.fixture
def anyio_backend() -> str:
    # The server runs on asyncio (uvicorn, the MCP SDK's stdio loop); test on the same backend.
    return "asyncio"


@pytest.fixture(scope="session")
def sandbox_image_built() -> Iterator[None]:
    """The suite's command works on a fresh machine: build the sandbox image when it is missing
    (online if a registry answers, else offline when root and debootstrap allow). Docker not
    running is left to the Docker tests, which fail with the fix."""

    _ensure_sandbox_image()
    yield


def _ensure_sandbox_image() -> None:
    def log(line: str) -> None:
        print(f"[sandbox image] {line}", file=sys.__stderr__, flush=True)  # past pytest's capture

    try:
        with parallel.image_lock():  # one build at a time on this machine
            ensure_image(Settings(), log)
    except DockerUnavailableError:
        pass
    except SandboxError as exc:
        pytest.exit(f"{exc.cause} Fix: {exc.fix}", returncode=1)
