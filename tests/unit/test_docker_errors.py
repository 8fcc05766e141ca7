"""The one mapping of Docker failures to user-facing errors (sandbox/docker_api.docker_errors)."""

from __future__ import annotations

import docker.errors
import pytest
import requests.exceptions

from rlm_mcp.errors import DockerUnavailableError, SandboxError
from rlm_mcp.sandbox.docker.docker_api import DOCKER_FIX, docker_errors


def test_an_unreachable_daemon_says_docker_is_not_running() -> None:
    with pytest.raises(DockerUnavailableError) as raised, docker_errors():
        raise requests.exceptions.ConnectionError("('Connection aborted.', FileNotFoundError(2, 'No such file'))")
    assert "Docker is not running" in str(raised.value) and DOCKER_FIX in str(raised.value)


def test_the_version_probe_failure_counts_as_unreachable() -> None:
    with pytest.raises(DockerUnavailableError), docker_errors(lambda exc: SandboxError("refused")):
        raise docker.errors.DockerException("Error while fetching server API version: ...")


def test_a_refused_request_is_phrased_by_the_caller() -> None:
    def refused(exc: Exception) -> SandboxError:
        return SandboxError(f"Docker refused: {exc}")

    with pytest.raises(SandboxError, match="Docker refused: .*no space"), docker_errors(refused):
        raise docker.errors.APIError("500 Server Error: no space left on device")


def test_a_refused_request_without_a_phrasing_propagates_unchanged() -> None:
    with pytest.raises(docker.errors.APIError), docker_errors():
        raise docker.errors.APIError("409 Conflict")


def test_other_errors_pass_through() -> None:
    with pytest.raises(ValueError), docker_errors(lambda exc: SandboxError("refused")):
        raise ValueError("a bug, not Docker")
    with pytest.raises(SandboxError, match="already phrased"), docker_errors(lambda exc: SandboxError("refused")):
        raise SandboxError("already phrased")
