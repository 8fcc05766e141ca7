"""The fast tier never reaches Docker through a process it starts either: tests/conftest.py points
DOCKER_HOST at a socket that does not exist for a fast-tier test's setup, call and teardown, so a
server or CLI the test (or a module-scoped fixture) starts inherits it. This replaced a second run
of the fast tier with DOCKER_HOST set from outside (.ci/run)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures_e2e import cli_env, minimal_env
from tests.fixtures_http import server_env
from tests.tiers import NO_DOCKER


@pytest.fixture(scope="module")
def docker_host_at_module_setup() -> Iterator[str | None]:
    # A module-scoped fixture is set up inside the first test that uses it: the guard covers it.
    yield os.environ.get("DOCKER_HOST")
    assert os.environ.get("DOCKER_HOST") == NO_DOCKER  # and its teardown


def test_a_fast_tier_test_and_its_fixtures_see_no_docker(docker_host_at_module_setup: str | None) -> None:
    assert docker_host_at_module_setup == NO_DOCKER
    assert os.environ["DOCKER_HOST"] == NO_DOCKER
    assert NO_DOCKER.startswith("unix:///nonexistent/")


def test_a_process_the_test_starts_inherits_it() -> None:
    seen = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('DOCKER_HOST'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert seen == NO_DOCKER


def test_docker_py_finds_no_daemon_there() -> None:
    import docker

    with pytest.raises(docker.errors.DockerException):
        docker.from_env(timeout=5).ping()


def test_the_environments_built_for_servers_and_clis_carry_it(tmp_path: Path) -> None:
    # They start from an empty environment: without DOCKER_HOST, the process would fall back to
    # the default socket, a running daemon on a machine that has one.
    for env in (cli_env(tmp_path), server_env(tmp_path), minimal_env("http://127.0.0.1:9/v1", tmp_path, [tmp_path])):
        assert env["DOCKER_HOST"] == NO_DOCKER
