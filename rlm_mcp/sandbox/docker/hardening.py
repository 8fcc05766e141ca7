"""The container configuration: every hardening option in one place."""

from __future__ import annotations

from typing import Any

from rlm_mcp.config import SandboxSettings, parse_size
from rlm_mcp.sandbox.docker.engine import EngineInfo, engine_ulimits, pids_limit
from rlm_mcp.sandbox.guest.bootstrap import command
from rlm_mcp.sandbox.liveness import ProcessLiveness

LABEL_OWNER = "rlm-mcp.owner"
LABEL_ROLE = "rlm-mcp.role"
ROLE_SANDBOX = "sandbox"
CPU_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # Docker's smallest CPU quota


def cpu_quota(cpus: float) -> int:
    """Docker's CPU quota (microseconds per period) for `cpus` CPUs."""
    return max(int(cpus * CPU_PERIOD_US), MIN_QUOTA_US)


def create_kwargs(
    client: Any, settings: SandboxSettings, owner_id: str, name: str, engine: EngineInfo | None = None
) -> dict[str, Any]:
    """Keyword arguments of the low-level `client.api.create_container` for one sandbox."""
    memory = parse_size(settings.sandbox_memory)
    host_config = client.api.create_host_config(
        read_only=True,
        tmpfs={"/tmp": f"rw,nosuid,nodev,size={parse_size(settings.sandbox_tmpfs)},mode=1777"},
        shm_size=parse_size(settings.sandbox_shm),
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=pids_limit(engine, settings),
        mem_limit=memory,
        memswap_limit=memory,  # equal: no swap on top of the memory limit
        # A quota, not nano_cpus: Docker can update a quota in place (see cpu.py), never nano_cpus.
        cpu_period=CPU_PERIOD_US,
        cpu_quota=cpu_quota(settings.sandbox_cpus),
        network_mode="none",
        init=True,  # tini reaps zombies and forwards signals; the kernel is its child
        ulimits=engine_ulimits(engine, settings),
        runtime=settings.sandbox_runtime,  # None: the engine's default (runc)
        log_config={"Type": "none", "Config": {}},  # stdout is the protocol: do not store it
    )
    return {
        "image": settings.sandbox_image,
        "command": command(),
        "user": settings.sandbox_user,
        "working_dir": "/tmp",
        # stdin_open without detach makes docker-py set AttachStdin/out/err and StdinOnce, so
        # the container stops by itself when the host's attach connection goes away.
        "stdin_open": True,
        "tty": False,
        "detach": False,
        "environment": {},  # nothing from the host; the image provides HOME, PATH, ...
        "network_disabled": True,
        # The creating process's stamp: reaping removes a stopped sandbox only once it is gone.
        "labels": {LABEL_OWNER: owner_id, LABEL_ROLE: ROLE_SANDBOX, **ProcessLiveness().stamp()},
        "name": name,
        "host_config": host_config,
        "use_config_proxy": False,  # else proxy settings (credentials too) leak in
    }
