"""Booting a kernel over a fresh channel, for any backend: its source, `init`, then `ready`.

The backend starts the image's python3 with the bootstrap command (`guest/bootstrap.py`); from
then on the kernel protocol is the same everywhere. How a failed boot is explained (out of
memory, killed from outside, a lost connection) is the backend's, from the channel's `ExitInfo`.
"""

from __future__ import annotations

import anyio

from rlm_mcp.config import SandboxSettings
from rlm_mcp.ports.kernel import ChannelEvent, InitFrame, KernelChannel
from rlm_mcp.sandbox.guest.bootstrap import kernel_payload

BOOT_TIMEOUT_S = 30.0  # the kernel reports ready within this long, or the sandbox is dropped
ANSWER_MAX_BYTES = 8 << 20  # the answer a cell may leave (the kernel caps it, the host checks it)


CHANNEL_CONNECT_S = 2.0  # how long the kernel tries a fast channel `init` offers before its fallback


async def boot_kernel(
    channel: KernelChannel,
    settings: SandboxSettings,
    channel_path: str | None = None,
    channel_token: str | None = None,
) -> ChannelEvent:
    """Send the kernel's source and its `init` frame (offering the fast channel at `channel_path`
    with its one-use token, when given); return the first event back, a `ReadyFrame` when it
    booted. Raises TimeoutError past BOOT_TIMEOUT_S, BrokenPipeError when its input closed."""
    await channel.send_raw(kernel_payload())
    await channel.send(
        InitFrame(
            id=channel.new_id(),
            output_bytes=settings.cell_output_bytes,
            max_batch=settings.max_prompts_per_batch,
            answer_max_bytes=ANSWER_MAX_BYTES,
            channel_path=channel_path,
            channel_token=channel_token,
            channel_timeout_s=CHANNEL_CONNECT_S if channel_path else None,
        )
    )
    with anyio.fail_after(BOOT_TIMEOUT_S):
        return await channel.receive()
