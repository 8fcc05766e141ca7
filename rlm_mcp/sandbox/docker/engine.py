"""What the container engine behind `DOCKER_HOST` can do: Docker or Podman, which OCI runtime,
whether it can enforce the sandbox limits, and what its API lacks.

The sandboxes speak the Docker Engine API to whatever answers it: Docker with runc (the
default), Docker with gVisor's `runsc` (`RLM_MCP_SANDBOX_RUNTIME=runsc`), or Podman's
Docker-compatible service. They differ in ways that matter for safety, so they are read once
from the engine (`probe_sync`) and checked here, never guessed:

- Limits: a rootless engine on cgroup v1 (rootless Podman, rootless Docker) cannot apply the
  memory, pids or CPU limits. Sandboxes without them are not sandboxes: `check_limits` refuses,
  before the first sandbox and when `serve` starts.
- Runtime: the requested runtime must be registered with the engine, else the error says how;
  and each created container's runtime is read back (`check_container_runtime`), so an engine
  that lists none or ignores the request never runs a sandbox outside the boundary asked for.
- Podman sets each container's process and file limits to its own maximum unless told, and runc
  cannot raise them past the service's hard limits once the capabilities are dropped: the
  sandbox names both (`engine_ulimits`).
- Under gVisor the container's pids cgroup holds gVisor's own host threads (about 60 at rest)
  and, on the ptrace platform, a host stub process per guest process with a thread for each of
  gVisor's threads that ran it, outliving it briefly: host pids grow with guest processes times
  gVisor's threads (`bench/gvisor_pids.py`; bench/results/gvisor-pids-2026-12-02.md). A sandbox at
  `RLM_MCP_SANDBOX_PIDS` would have its gVisor kernel killed by the limit long before its code
  reached it, so the host limit gets room for them (`pids_limit`). That cgroup
  then no longer bounds the guest's processes, and gVisor's kernel died (exit status 2) when
  they filled it: the guest's own limit is its `nproc` ulimit at `RLM_MCP_SANDBOX_PIDS` (gVisor
  enforces it, so a fork past it fails in the cell, as under runc; `engine_ulimits`).
- Podman 4.3 on cgroup v1 never reports an out-of-memory kill (`OOMKilled` stays false and no
  `oom` event comes): a SIGKILLed kernel there is most likely the memory limit, and the model is
  told so (`ExitInfo.oom_unreported`).
- Podman refuses a forced removal of a container that stopped while it was being removed
  ("could not be stopped ... container state improper"); a second removal works
  (`faults.stopped_while_removed`).
- CPU quotas updated in place (`docker update`) exist under Docker with runc only: Debian's
  `runsc` (2022) has no `update` command and Podman's compatible API no `containers/{id}/update`.
  `faults.update_unsupported` tells that failure from a container that is merely gone; the CPU shares
  (sandbox/cpu.py) then keep each sandbox's fixed quota, and say so.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import SandboxError

log = logging.getLogger("rlm_mcp.sandbox")

# RLIMIT_NPROC counts every process of the sandbox's uid on the host, so it is a backstop only
# (the pids cgroup limit bounds one sandbox); kept at the usual pid_max so runc may set it.
PODMAN_NPROC = 32768
# The host pids of a gVisor sandbox: per guest process (its stub and the stub's threads), and room
# for gVisor's own threads. The limit only bounds gVisor's host threads (the guest is held by its
# nproc limit), so it is generous: a gVisor kernel that meets it dies and takes the cell with it.
GVISOR_PIDS_PER_GUEST = 16
GVISOR_PIDS_ROOM = 256

ROOTLESS_V1_FIX = (
    "Run the engine as root (`sudo podman system service` and DOCKER_HOST=unix:///run/podman/podman.sock, or "
    "rootful Docker), or boot the host with cgroup v2 (systemd.unified_cgroup_hierarchy=1) with the memory, "
    "pids and cpu controllers delegated to your user."
)


@dataclass(frozen=True)
class EngineInfo:
    """The facts about one engine that the sandboxes depend on (from its version and info)."""

    product: str  # "Docker" | "Podman"
    version: str
    runtime: str  # the OCI runtime sandboxes will use
    runtimes: tuple[str, ...] = ()
    rootless: bool = False
    cgroup_version: str = ""
    missing_limits: tuple[str, ...] = field(default=())  # limits the engine says it cannot apply
    desktop: bool = False  # Docker Desktop: the engine runs in a VM (no host unix sockets inside)
    selinux: bool = False  # the engine labels containers (SELinux): a host socket needs relabelling

    @property
    def podman(self) -> bool:
        return self.product == "Podman"

    def describe(self) -> str:
        parts = [f"{self.product} {self.version}", f"runtime {self.runtime}"]
        if self.cgroup_version:
            parts.append(f"cgroup v{self.cgroup_version}")
        if self.rootless:
            parts.append("rootless")
        return ", ".join(parts)


def engine_info(version: dict[str, Any], info: dict[str, Any], settings: SandboxSettings) -> EngineInfo:
    """Read the engine's `/version` and `/info` answers (plain data: testable on any dict)."""
    names = [str(c.get("Name", "")) for c in version.get("Components") or [] if isinstance(c, dict)]
    podman = any("podman" in n.lower() for n in names) or "podman" in str(version.get("Platform", "")).lower()
    security = [str(s) for s in info.get("SecurityOptions") or []]
    rootless = info.get("Rootless") is True or any("name=rootless" in s for s in security)
    runtimes = info.get("Runtimes")
    default = str(info.get("DefaultRuntime") or "runc")
    missing = tuple(
        name
        for key, name in (("MemoryLimit", "memory"), ("PidsLimit", "pids"), ("CpuCfsQuota", "CPU quota"))
        if info.get(key) is False
    )
    return EngineInfo(
        product="Podman" if podman else "Docker",
        version=str(version.get("Version") or "?"),
        runtime=settings.sandbox_runtime or default,
        runtimes=tuple(sorted(runtimes)) if isinstance(runtimes, dict) else (),
        rootless=rootless,
        cgroup_version=str(info.get("CgroupVersion") or ""),
        missing_limits=missing,
        desktop="docker desktop" in str(info.get("OperatingSystem") or "").lower(),
        selinux=any("name=selinux" in s for s in security),
    )


def check_engine(engine: EngineInfo, settings: SandboxSettings) -> None:
    """Refuse an engine that would run sandboxes without their limits, or lacks the runtime asked for."""
    check_limits(engine)
    wanted = settings.sandbox_runtime
    if wanted and engine.runtimes and wanted not in engine.runtimes:
        raise SandboxError(
            f"The container runtime {wanted!r} (RLM_MCP_SANDBOX_RUNTIME) is not registered with {engine.product}; "
            f"it has {', '.join(engine.runtimes)}.",
            runtime_fix(wanted),
        )


def expected_runtime(engine: EngineInfo | None, settings: SandboxSettings) -> str | None:
    """The runtime every sandbox must get: the one asked for (RLM_MCP_SANDBOX_RUNTIME), or the
    engine's default where that is gVisor (the boundary the operator relies on); None: runc's."""
    if settings.sandbox_runtime:
        return settings.sandbox_runtime
    return engine.runtime if engine is not None and is_gvisor(engine, settings) else None


def check_container_runtime(inspected: dict[str, Any], engine: EngineInfo | None, settings: SandboxSettings) -> None:
    """Refuse a created container whose runtime (its inspection's HostConfig.Runtime) is not the
    one expected: an engine that lists no runtimes, or ignores the request, must not run a
    sandbox outside the boundary asked for."""
    wanted = expected_runtime(engine, settings)
    if wanted is None:
        return
    got = str((inspected.get("HostConfig") or {}).get("Runtime") or "")
    if got.rsplit("/", 1)[-1] == wanted:
        return
    product = engine.product if engine is not None else "The container engine"
    raise SandboxError(
        f"{product} created the sandbox with runtime {got or '(none reported)'!r}, not {wanted!r}"
        f"{' (RLM_MCP_SANDBOX_RUNTIME)' if settings.sandbox_runtime else ' (its default)'}: it would run outside "
        "the boundary asked for, so it was removed.",
        "Use an engine that honours the runtime: " + runtime_fix(wanted),
    )


def check_limits(engine: EngineInfo) -> None:
    """Refuse an engine that cannot enforce the sandbox's memory, pids and CPU limits (also
    checked when `serve` starts: `DockerBackend.check_limits`)."""
    if engine.rootless and engine.cgroup_version == "1":
        raise SandboxError(
            f"Rootless {engine.product} on cgroup v1 cannot enforce the sandbox's memory, pids and CPU limits, "
            "so rlm-mcp will not start sandboxes there.",
            ROOTLESS_V1_FIX,
        )
    if engine.missing_limits:
        raise SandboxError(
            f"{engine.product} reports that it cannot apply {', '.join(engine.missing_limits)} limits, "
            "so rlm-mcp will not start sandboxes there.",
            ROOTLESS_V1_FIX if engine.rootless else "Enable the missing cgroup controllers on the engine's host.",
        )


def runtime_fix(runtime: str) -> str:
    if runtime == "runsc":
        return (
            'Register gVisor in /etc/docker/daemon.json: {"runtimes": {"runsc": {"path": "/usr/bin/runsc", '
            '"runtimeArgs": ["--network=none"]}}}, then `sudo kill -HUP $(pidof dockerd)` (runtimes reload '
            "without a restart), or unset RLM_MCP_SANDBOX_RUNTIME."
        )
    return "Register it in the engine's configuration (daemon.json `runtimes`), or unset RLM_MCP_SANDBOX_RUNTIME."


def probe_sync(client: Any, settings: SandboxSettings) -> EngineInfo:
    """The engine's facts (blocking: two API calls; call in a worker thread)."""
    return engine_info(client.version() or {}, client.info() or {}, settings)


def is_gvisor(engine: EngineInfo | None, settings: SandboxSettings) -> bool:
    runtime = settings.sandbox_runtime or (engine.runtime if engine is not None else "")
    return runtime == "runsc" or runtime.startswith("runsc-") or runtime == "gvisor"


def pids_limit(engine: EngineInfo | None, settings: SandboxSettings) -> int:
    """The container's pids cgroup limit: the setting, or under runsc room for gVisor's host threads
    (at 32 pids, a cell's forks met the former limit of 192 once in 6 sandboxes and killed gVisor's
    kernel: bench/results/gvisor-pids-2026-12-02.md)."""
    if is_gvisor(engine, settings):
        return settings.sandbox_pids * GVISOR_PIDS_PER_GUEST + GVISOR_PIDS_ROOM
    return settings.sandbox_pids


def engine_ulimits(engine: EngineInfo | None, settings: SandboxSettings) -> list[dict[str, Any]]:
    """Resource limits set on every sandbox (beyond the cgroup limits in hardening.py)."""
    limits: list[dict[str, Any]] = [{"Name": "nofile", "Soft": 1024, "Hard": 1024}]
    if is_gvisor(engine, settings):
        limits.append({"Name": "nproc", "Soft": settings.sandbox_pids, "Hard": settings.sandbox_pids})
    elif engine is not None and engine.podman:
        limits.append({"Name": "nproc", "Soft": PODMAN_NPROC, "Hard": PODMAN_NPROC})
    return limits


def update_failure(exc: BaseException, engine: EngineInfo | None) -> str:
    """Why in-place CPU updates do not work here, in a sentence (container ids left out)."""
    who = f"{engine.product} with runtime {engine.runtime}" if engine is not None else "the engine"
    lines = str(getattr(exc, "explanation", None) or exc).strip().splitlines()
    answer = re.sub(r"\b[0-9a-f]{64}\b", "<id>", lines[0] if lines else type(exc).__name__)
    return f"{who} cannot update a running container's CPU quota (it answered: {answer[:120]})"


def update_fix(engine: EngineInfo | None) -> str:
    if engine is not None and engine.podman:
        return "Use Docker, whose API updates quotas in place (Podman's compatible API cannot)"
    return "Use a runtime that updates quotas in place (runc, or a current gVisor release)"
