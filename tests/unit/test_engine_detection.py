"""Issue 24: what the engine behind DOCKER_HOST can do, read from its /version and /info answers.

The answers (tests/fixtures_sandbox.py) are the fields Docker 20.10 and Podman 4.3 really send
(checked on this project's CI machine kind); the rootless cgroup v1 ones are what those engines
send when run as a user there, which CI (root) cannot be. The real engines are probed in test_sandbox_gvisor.py.
"""

from __future__ import annotations

from typing import Any

import docker
import docker.errors
import pytest

from rlm_mcp.errors import SandboxError
from rlm_mcp.sandbox.docker.engine import (
    check_engine,
    engine_info,
    engine_ulimits,
    pids_limit,
    update_failure,
)
from rlm_mcp.sandbox.docker.faults import stopped_while_removed, update_unsupported
from rlm_mcp.sandbox.docker.hardening import create_kwargs
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_sandbox import DOCKER_INFO, DOCKER_VERSION, PODMAN_INFO, PODMAN_VERSION


def test_docker_and_podman_are_told_apart_and_described() -> None:
    settings = make_settings()
    docker_engine = engine_info(DOCKER_VERSION, DOCKER_INFO, settings.sandbox)
    podman = engine_info(PODMAN_VERSION, PODMAN_INFO, settings.sandbox)
    assert (docker_engine.product, docker_engine.runtime, docker_engine.podman) == ("Docker", "runc", False)
    assert (podman.product, podman.version, podman.podman) == ("Podman", "4.3.1", True)
    assert podman.describe() == "Podman 4.3.1, runtime runc, cgroup v1"
    runsc = engine_info(DOCKER_VERSION, DOCKER_INFO, make_settings(sandbox_runtime="runsc").sandbox)
    assert runsc.describe() == "Docker 20.10.24+dfsg1, runtime runsc, cgroup v1"
    for engine in (docker_engine, podman, runsc):
        check_engine(engine, make_settings(sandbox_runtime=engine.runtime).sandbox)  # rootful, limits: fine
    assert not podman.selinux  # a labelling engine says so among its security options
    labelled = {**PODMAN_INFO, "SecurityOptions": ["name=seccomp,profile=default", "name=selinux"]}
    assert engine_info(PODMAN_VERSION, labelled, settings.sandbox).selinux


@pytest.mark.parametrize(
    ("version", "info"),
    [
        (PODMAN_VERSION, {**PODMAN_INFO, "Rootless": True}),  # rootless Podman
        (DOCKER_VERSION, {**DOCKER_INFO, "SecurityOptions": ["name=seccomp", "name=rootless"]}),  # rootless Docker
    ],
)
def test_rootless_on_cgroup_v1_is_refused_with_the_reason_and_the_fix(
    version: dict[str, Any], info: dict[str, Any]
) -> None:
    engine = engine_info(version, info, make_settings().sandbox)
    assert engine.rootless
    with pytest.raises(SandboxError) as caught:
        check_engine(engine, make_settings().sandbox)
    assert "cgroup v1 cannot enforce the sandbox's memory, pids and CPU limits" in caught.value.cause
    assert "podman system service" in (caught.value.fix or "") and "cgroup v2" in (caught.value.fix or "")
    # The same engine on cgroup v2 applies the limits: allowed.
    check_engine(engine_info(version, {**info, "CgroupVersion": "2"}, make_settings().sandbox), make_settings().sandbox)


def test_an_engine_that_says_it_cannot_apply_a_limit_is_refused() -> None:
    engine = engine_info(DOCKER_VERSION, {**DOCKER_INFO, "PidsLimit": False}, make_settings().sandbox)
    with pytest.raises(SandboxError, match="cannot apply pids limits"):
        check_engine(engine, make_settings().sandbox)


def test_a_runtime_the_engine_lacks_is_refused_with_how_to_register_it() -> None:
    settings = make_settings(sandbox_runtime="runsc")
    with pytest.raises(SandboxError) as caught:
        check_engine(engine_info(PODMAN_VERSION, PODMAN_INFO, settings.sandbox), settings.sandbox)
    assert "'runsc' (RLM_MCP_SANDBOX_RUNTIME) is not registered with Podman; it has crun, runc" in caught.value.cause
    assert '"runtimeArgs": ["--network=none"]' in (caught.value.fix or "")
    assert "kill -HUP" in (caught.value.fix or "") and "without a restart" in (caught.value.fix or "")


def test_the_runtime_setting_is_validated() -> None:
    with pytest.raises(ValueError):
        make_settings(sandbox_runtime="runsc --debug")


class _Client:
    """Just enough of docker-py's low-level client for `create_host_config` (a real function)."""

    def __init__(self) -> None:
        self.api = docker.APIClient(base_url="unix:///nonexistent", version="1.41")  # connects to nothing


def test_the_container_gets_the_runtime_and_the_engines_limits() -> None:
    settings = make_settings(sandbox_runtime="runsc", sandbox_pids=64)
    docker_engine = engine_info(DOCKER_VERSION, DOCKER_INFO, settings.sandbox)
    host = create_kwargs(_Client(), settings.sandbox, "owner", "name", docker_engine)["host_config"]
    assert host["Runtime"] == "runsc"
    assert host["PidsLimit"] == 64 * 16 + 256 == pids_limit(docker_engine, settings.sandbox)
    plain = make_settings(sandbox_pids=64)
    host = create_kwargs(
        _Client(), plain.sandbox, "owner", "name", engine_info(PODMAN_VERSION, PODMAN_INFO, plain.sandbox)
    )["host_config"]
    assert "Runtime" not in host and host["PidsLimit"] == 64
    assert {u["Name"] for u in host["Ulimits"]} == {"nofile", "nproc"}  # Podman would raise both past its own
    runc = engine_info(DOCKER_VERSION, DOCKER_INFO, plain.sandbox)
    assert [u["Name"] for u in engine_ulimits(runc, plain.sandbox)] == ["nofile"]  # Docker: as before
    # gVisor: the guest's own limit is its nproc (the pids cgroup also holds gVisor's threads).
    gvisor = {u["Name"]: u for u in engine_ulimits(docker_engine, settings.sandbox)}
    assert gvisor["nproc"] == {"Name": "nproc", "Soft": 64, "Hard": 64}


def test_a_failed_update_is_told_apart_from_a_vanished_container() -> None:
    runsc = docker.errors.APIError(
        "500 Server Error",
        explanation="Cannot update container " + "a" * 64 + ": /var/lib/docker/runtimes/runsc did not terminate",
    )
    podman = docker.errors.APIError("404 Client Error", explanation="Not Found")
    gone = docker.errors.NotFound("404 Client Error", explanation="No such container: abc")
    assert update_unsupported(runsc) and update_unsupported(podman)
    assert not update_unsupported(gone)
    # A sandbox that exited while its quota was being updated (test_sandbox_cpu saw runc say so):
    # the container stopped, the engine can still update running ones.
    exited = docker.errors.APIError(
        "500 Server Error",
        explanation="Cannot update container "
        + "b" * 64
        + ": runc did not terminate successfully: exit status 1: container not running",
    )
    assert not update_unsupported(exited)
    assert not update_unsupported(docker.errors.APIError("409", explanation="Container abc is not running"))
    assert not update_unsupported(ConnectionResetError(104, "Connection reset by peer"))
    engine = engine_info(DOCKER_VERSION, DOCKER_INFO, make_settings(sandbox_runtime="runsc").sandbox)
    reason = update_failure(runsc, engine)
    assert reason.startswith("Docker with runtime runsc cannot update a running container's CPU quota")
    assert "<id>" in reason and "a" * 64 not in reason


def test_podmans_removal_race_is_recognised() -> None:
    race = docker.errors.APIError(
        "500 Server Error",
        explanation="cannot remove container abc as it could not be stopped: sending SIGKILL to container abc: "
        "container state improper: stopped",
    )
    assert stopped_while_removed(race)
    assert not stopped_while_removed(docker.errors.NotFound("404", explanation="No such container: abc"))
