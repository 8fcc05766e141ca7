"""The sandbox section: what one sandbox may use and how many run. `SandboxManager` and the
backends (rlm_mcp/sandbox/) take this section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from rlm_mcp.config.values import SECTION_CONFIG, parse_size

DEFAULT_IMAGE = "rlm-mcp-sandbox:0.2"  # the version moves with what the image holds (0.2: python3-dill)

# What fits in one sandbox (sandbox/manager.py checks each run's contexts against it): 85% of its
# memory limit, less what the kernel itself takes; a text context needs about twice its size there
# while it loads (its chunks, then the joined string).
SANDBOX_USABLE_SHARE = 0.85
SANDBOX_KERNEL_BYTES = 48 << 20
TEXT_MEMORY_FACTOR = 2


def sandbox_usable_bytes(memory: str) -> int:
    """Bytes of contexts a sandbox with this memory limit (`1g`) can hold."""
    return int(parse_size(memory) * SANDBOX_USABLE_SHARE) - SANDBOX_KERNEL_BYTES


class SandboxSettings(BaseModel):
    """RLM_MCP_ settings of the sandboxes (`settings.sandbox`)."""

    model_config = SECTION_CONFIG

    sandbox_backend: Literal["docker"] = Field(
        "docker", description="What makes the sandboxes (docs/architecture.md, Backends); Docker only so far."
    )
    sandbox_image: str = Field(DEFAULT_IMAGE, description="Docker image the sandboxes run.")
    sandbox_runtime: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="OCI runtime of the sandboxes, e.g. runsc (gVisor); default: the engine's default (runc).",
    )
    sandbox_fast_channel: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "The sandboxes' frames over a unix socket shared with the container (auto: with a local engine, "
            "Docker or root Podman, and runc) or only over the attach stream (off); docs/architecture.md, Fast channel."
        ),
    )
    sandbox_memory: str = Field("1g", description="Memory limit (= memory+swap) of one sandbox.")
    sandbox_cpus: float = Field(1.0, gt=0, description="CPU quota of one sandbox.")
    sandbox_total_cpus: float | None = Field(
        None,
        gt=0,
        description="CPUs all sandboxes in use share (each gets min(sandbox_cpus, total / N)); default: the Docker host's.",
    )
    sandbox_pids: int = Field(128, ge=16, description="Process/thread limit of one sandbox.")
    sandbox_tmpfs: str = Field("256m", description="Size of the writable /tmp in a sandbox.")
    sandbox_shm: str = Field("64m", description="Size of /dev/shm in a sandbox.")
    sandbox_user: str = Field("1000:1000", description="uid:gid the sandbox code runs as.")
    cell_timeout_s: float = Field(60.0, gt=0, description="Running time of one cell (LM waits excluded).")
    cell_wall_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Wall-clock ceiling of one cell, LM waits included (the running-time limit's backstop).",
    )
    cell_output_bytes: int = Field(1 << 20, description="Captured output kept per cell (head and tail).")
    # The sandbox's LM gate is the one owner of this bound (sandbox/lm_gate.py); the engine reads it.
    max_prompts_per_batch: int = Field(512, description="Prompts one llm_query_batched call may carry.")
    pool_size: int = Field(2, ge=0, le=32, description="Warm, kernel-ready sandboxes kept started.")
    max_sandboxes: int = Field(8, ge=1, description="Sandboxes this server runs at once.")
    instance_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Owner label of this server's sandboxes; default: random per start. Never share one.",
    )

    @field_validator("sandbox_memory", "sandbox_tmpfs", "sandbox_shm", mode="after")
    @classmethod
    def _check_size(cls, value: str) -> str:
        parse_size(value)  # fail at start-up, not at the first sandbox
        return value
