"""The fast channel (rlm_mcp/sandbox/docker/fastchan.py): frames over a unix socket shared with
the container, the attach stream as fallback. Key sandbox tests elsewhere run in both modes
(the `fast_channel` fixture); these are the channel's own."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from rlm_mcp.config import SandboxSettings
from rlm_mcp.ports.kernel import ChannelEvent, KernelChannel
from rlm_mcp.sandbox.boot import boot_kernel
from rlm_mcp.sandbox.docker import container as container_module
from rlm_mcp.sandbox.docker import fastchan
from rlm_mcp.sandbox.docker.container import KernelContainer
from rlm_mcp.sandbox.session import KernelSandbox
from tests.fixtures_sandbox import FakeBridge, no_bridge, ready_manager, text_context, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

FALLBACK = "sandbox frames use the Docker attach stream"


def kernel_of(sb: KernelSandbox) -> KernelContainer:
    assert isinstance(sb.container, KernelContainer)
    return sb.container


async def test_frames_travel_over_the_socket_and_nothing_is_left_behind(tmp_path: Path) -> None:
    text = "fast line 0123456789\n" * 2_500_000  # ~52 MB: it goes over the socket with sendfile
    async with ready_manager(pool_size=0, sandbox_memory="1g") as manager:
        async with manager.open([text_context(tmp_path, text)]) as sb:
            channel = kernel_of(sb)
            assert channel.channel == "socket"
            chan = channel._chan
            assert chan is not None and chan.conn is not None
            assert not chan.path.exists()  # unlinked once the kernel connected
            assert chan.path.parent.stat().st_mode & 0o777 == 0o711
            assert chan.path.parent.parent.stat().st_mode & 0o777 == 0o700
            code = (
                "import hashlib\nprint(hashlib.sha256(context.encode()).hexdigest())\n"
                "b = llm_query_batched([f'p{i}' for i in range(16)])\nprint(len(b), b[0] == b[15])\n"
                "print('z' * 3_000_000)"
            )
            r = await sb.execute(code, FakeBridge())
            assert r.error is None, r.error
            lines = r.stdout.split("\n")
            assert lines[0] == hashlib.sha256(text.encode()).hexdigest()
            assert lines[1] == "16 False"
            assert "bytes of output dropped" in r.stdout  # the big output was capped and still arrived
            directory = chan.dir
        assert await wait_for(lambda: not directory.exists())  # removed with its container (in the background)
        root = directory.parent
    assert not root.exists()  # the server's private parent goes with the backend


async def test_nothing_inside_can_connect_again(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0) as manager, manager.open([]) as sb:
        assert kernel_of(sb).channel == "socket"
        r = await sb.execute(
            "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect('/run/rlm/k')\nexcept OSError as e:\n    print(type(e).__name__)",
            no_bridge,
        )
        assert r.stdout == "FileNotFoundError\n"
        r = await sb.execute("import os\nprint(os.access('/run/rlm', os.W_OK))", no_bridge)
        assert r.stdout == "False\n"


async def test_a_wrong_token_is_refused_and_the_attach_stream_carries_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever presents a wrong token is closed without an answer; the kernel, refused, stays on
    the trusted attach stream (nothing read from the refused socket counts)."""

    async def wrong_token(
        channel: KernelChannel, settings: SandboxSettings, path: str | None = None, token: str | None = None
    ) -> ChannelEvent:
        return await boot_kernel(channel, settings, path, "0" * fastchan.TOKEN_HEX if token else None)

    monkeypatch.setattr(container_module, "boot_kernel", wrong_token)
    caplog.set_level(logging.INFO, "rlm_mcp.sandbox")
    async with ready_manager(pool_size=0) as manager, manager.open([]) as sb:
        channel = kernel_of(sb)
        assert channel.channel == "attach"
        assert channel._chan is not None and channel._chan.refused and channel._chan.conn is None
        assert not channel._chan.path.exists()
        bridge = FakeBridge()
        r = await sb.execute("print(llm_query_batched(['a', 'b', 'c', 'd']))", bridge)
        assert r.error is None, r.error
        assert r.stdout == "['echo:a', 'echo:b', 'echo:c', 'echo:d']\n"  # the round trip, over attach
        assert bridge.prompts == 4
    assert any(FALLBACK in m and "host refused" in m for m in caplog.messages), caplog.messages


async def test_a_socket_the_kernel_cannot_reach_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fastchan.FastChannel, "inside_path", property(lambda self: "/run/rlm/missing"))
    caplog.set_level(logging.INFO, "rlm_mcp.sandbox")
    async with ready_manager(pool_size=0) as manager:
        for _ in range(2):
            async with manager.open([]) as sb:
                assert kernel_of(sb).channel == "attach"
                r = await sb.execute("print('still here')", no_bridge)
                assert r.stdout == "still here\n"
    said = [m for m in caplog.messages if FALLBACK in m]
    assert len(said) == 1 and "could not connect" in said[0], said  # once, with the reason


async def test_a_refused_mount_creates_the_sandbox_again_without_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A relative mount target: Docker refuses the bind mount, as Docker Desktop refuses a path
    # that is not shared with its VM.
    monkeypatch.setattr(container_module, "MOUNT_AT", "relative/rlm")
    caplog.set_level(logging.INFO, "rlm_mcp.sandbox")
    async with ready_manager(pool_size=0) as manager:
        async with manager.open([]) as sb:
            assert kernel_of(sb).channel == "attach" and kernel_of(sb)._chan is None
            assert (await sb.execute("print(1)", no_bridge)).stdout == "1\n"
        async with manager.open([]) as sb:  # remembered: not tried again
            assert kernel_of(sb)._chan is None
    said = [m for m in caplog.messages if FALLBACK in m]
    assert len(said) == 1 and "bind mount" in said[0], said


@pytest.mark.usefixtures("fast_channel")
async def test_the_setting_decides(fast_channel: str) -> None:
    async with ready_manager(pool_size=0) as manager, manager.open([]) as sb:
        assert kernel_of(sb).channel == ("socket" if fast_channel == "auto" else "attach")
