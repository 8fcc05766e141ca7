"""The fast channel's parts without Docker: where it is used, the handshake both ends speak,
the raw frame reader, and what the orphan reaper may remove."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from rlm_mcp.config import SandboxSettings
from rlm_mcp.sandbox.docker import fastchan
from rlm_mcp.sandbox.docker.attach import RawDemux
from rlm_mcp.sandbox.docker.engine import EngineInfo
from rlm_mcp.sandbox.docker.fastchan import ChannelRoot, FastChannel, FastChannels, unavailable_reason
from rlm_mcp.sandbox.frames import ProtocolViolation
from rlm_mcp.sandbox.guest.fastchan import open_fast_channel
from rlm_mcp.sandbox.liveness import ProcessLiveness

DOCKER = EngineInfo(product="Docker", version="27", runtime="runc")


@pytest.mark.parametrize(
    ("setting", "engine", "docker_host", "why"),
    [
        ("auto", DOCKER, None, None),
        ("auto", DOCKER, "unix:///var/run/docker.sock", None),
        ("off", DOCKER, None, "RLM_MCP_SANDBOX_FAST_CHANNEL=off"),
        ("auto", DOCKER, "tcp://10.0.0.2:2376", "not a local unix socket (tcp://)"),
        ("auto", DOCKER, "ssh://me@box", "not a local unix socket (ssh://)"),
        ("auto", EngineInfo(product="Podman", version="4", runtime="crun"), "unix:///run/podman/podman.sock", None),
        ("auto", EngineInfo(product="Podman", version="4", runtime="crun", rootless=True), None, "rootless Podman"),
        ("auto", EngineInfo(product="Podman", version="4", runtime="crun", selinux=True), None, "SELinux"),
        ("auto", EngineInfo(product="Docker", version="27", runtime="runsc"), None, "gVisor"),
        ("auto", EngineInfo(product="Docker", version="27", runtime="runc", desktop=True), None, "Docker Desktop"),
        ("auto", None, None, "not known"),
    ],
)
def test_where_the_fast_channel_is_used(
    setting: str, engine: EngineInfo | None, docker_host: str | None, why: str | None
) -> None:
    reason = unavailable_reason(SandboxSettings(sandbox_fast_channel=setting), engine, docker_host)
    assert (reason is None) == (why is None)
    if why is not None:
        assert reason is not None and why in reason


def test_the_backend_decides_once_the_engine_is_known_and_says_each_fallback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channels = FastChannels(SandboxSettings())
    channels.decide(None)
    assert not channels.enabled  # not before the engine is known
    channels.decide(DOCKER)
    assert channels.enabled and "unix socket" in channels.describe()
    caplog.set_level("INFO", "rlm_mcp.sandbox")
    channels.fell_back("the kernel could not connect")
    channels.fell_back("the kernel could not connect")
    channels.disable("Docker refused the bind mount")
    assert not channels.enabled and "Docker refused the bind mount" in channels.describe()
    assert len(caplog.messages) == 2
    channels.close()


def test_the_directories_are_private(tmp_path: Path) -> None:
    root = ChannelRoot()
    chan = FastChannel(root.new_dir())
    try:
        assert chan.dir.parent.stat().st_mode & 0o777 == 0o700
        assert chan.dir.stat().st_mode & 0o777 == 0o711
        assert chan.path.stat().st_mode & 0o777 == 0o666
    finally:
        chan.remove_dir()
        assert not chan.dir.exists()
        parent = chan.dir.parent
        root.close()
        assert not parent.exists()


async def _handshake(token: str | None = None) -> tuple[FastChannel, Any, list[socket.socket]]:
    root = ChannelRoot()
    chan = FastChannel(root.new_dir())
    connected: list[socket.socket] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(chan.accept, connected.append)
            kernel_end = await anyio.to_thread.run_sync(open_fast_channel, str(chan.path), token or chan.token, 5.0)
    finally:
        chan.close_listener()
        root.close()
    return chan, kernel_end, connected


@pytest.mark.anyio
async def test_the_handshake_with_the_right_token() -> None:
    chan, (sock, ok, why), connected = await _handshake()
    assert ok and why is None and sock is not None
    assert connected == [chan.conn] and chan.refused is None
    assert not chan.path.exists()  # unlinked: nothing else can connect
    with pytest.raises(OSError):
        socket.socket(socket.AF_UNIX).connect(str(chan.path))
    # Frames flow both ways on the accepted connection.
    assert chan.conn is not None
    chan.conn.sendall(b"ping")
    assert sock.recv(4) == b"ping"
    sock.close()
    chan.conn.close()


@pytest.mark.anyio
async def test_a_wrong_token_is_closed_without_an_answer() -> None:
    chan, (sock, ok, why), connected = await _handshake("f" * fastchan.TOKEN_HEX)
    assert not ok and why == "the host refused the connection"
    assert sock is not None  # kept open by the kernel, unused
    assert connected == [] and chan.conn is None and chan.refused and "token" in chan.refused
    assert not chan.path.exists()
    sock.close()


@pytest.mark.anyio
async def test_an_accept_given_up_as_the_kernel_connects_takes_nothing() -> None:
    """The host gives up its accept (the kernel's boot is abandoned) in the loop turn in which the
    kernel's connection arrives: nothing is accepted, and nothing fails inside the loop (on Python
    3.11 `loop.sock_accept` accepted anyway, raised InvalidStateError there and leaked the socket)."""
    loop = asyncio.get_running_loop()
    failures: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: failures.append(context))
    root = ChannelRoot()
    chan = FastChannel(root.new_dir())
    kernel_end = socket.socket(socket.AF_UNIX)
    try:
        accepting = loop.create_task(chan.accept(lambda conn: None))
        await anyio.lowlevel.checkpoint()  # it waits on the listener now
        kernel_end.connect(str(chan.path))  # in the backlog: the listener is readable
        loop.call_soon(accepting.cancel)  # in the next loop turn, ahead of the listener's readiness
        await asyncio.wait([accepting])
        assert accepting.cancelled()
        for _ in range(3):  # whatever that turn queued has run
            await anyio.lowlevel.checkpoint()
        assert failures == []
        chan.close_listener()
        kernel_end.settimeout(10)
        try:  # nobody accepted it: the listener's close ends it, no leaked socket holds it open
            assert kernel_end.recv(1) == b""
        except ConnectionResetError:
            pass
    finally:
        loop.set_exception_handler(handler)
        kernel_end.close()
        chan.remove_dir()
        root.close()


def test_the_kernel_end_without_a_socket() -> None:
    sock, ok, why = open_fast_channel(str(Path(tempfile.gettempdir()) / "rlm-mcp-no-such-socket"), "x", 1.0)
    assert sock is None and not ok and why is not None and "could not connect" in why


def _frame(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def test_the_raw_reader_splits_frames_and_applies_the_caps() -> None:
    demux = RawDemux(1 << 20, lambda size: True)
    stream = _frame({"type": "log", "id": 1, "message": "a"}) + _frame({"type": "ready", "id": 2})
    payloads, used = demux.feed(stream[:7])
    assert payloads == [] and used == 7
    payloads, used = demux.feed(stream[7:])
    assert [json.loads(p)["type"] for p in payloads] == ["log", "ready"] and used == len(stream) - 7
    assert demux.stderr == b""
    with pytest.raises(ProtocolViolation):
        RawDemux(1 << 20, lambda size: True).feed(b"\xff\xff\xff\xff")
    refusing = RawDemux(1 << 20, lambda size: False)
    payloads, used = refusing.feed(stream)
    assert payloads == [] and refusing.frames.waiting and used < len(stream)


def test_the_reaper_removes_only_socket_directories_of_our_shape(tmp_path: Path) -> None:
    root = ChannelRoot()
    first, second = root.new_dir(), root.new_dir()
    fastchan.remove_orphan_dir({fastchan.LABEL_CHANNEL_DIR: str(first)})
    assert not first.exists() and second.parent.exists()  # the parent stays while not empty
    fastchan.remove_orphan_dir({fastchan.LABEL_CHANNEL_DIR: str(second)})
    assert not second.parent.exists()
    elsewhere = tmp_path / "keep" / "me"
    elsewhere.mkdir(parents=True)
    fastchan.remove_orphan_dir({fastchan.LABEL_CHANNEL_DIR: str(elsewhere)})
    fastchan.remove_orphan_dir({})
    assert elsewhere.exists()
    # A label that climbs out of a parent of our shape names the temporary directory: left alone.
    third = root.new_dir()
    bystander = third.parent.parent / f"{fastchan.ROOT_PREFIX}bystander-{os.getpid()}"
    bystander.mkdir()
    try:
        for label in (f"{third.parent}/..", f"{third}/../..", "relative/path"):
            fastchan.remove_orphan_dir({fastchan.LABEL_CHANNEL_DIR: label})
        assert third.exists() and bystander.exists()
    finally:
        bystander.rmdir()
    root.close()


def test_a_refused_bind_mount_is_recognised() -> None:
    import docker.errors

    class Answer:
        status_code = 400
        reason = "Bad Request"

    desktop = docker.errors.APIError("x", Answer(), explanation="Mounts denied: The path /tmp/rlm is not shared")
    other = docker.errors.APIError("x", Answer(), explanation="No such image: nope")
    assert fastchan.is_refused_mount(desktop)
    assert not fastchan.is_refused_mount(other)
    assert not fastchan.is_refused_mount(OSError("mount"))


def test_a_gone_servers_socket_parent_is_removed_and_a_live_ones_kept() -> None:
    live = ChannelRoot()
    mine = live.new_dir().parent
    assert mine.name.startswith(fastchan.own_root_prefix())
    gone_pid = subprocess.Popen(["true"])  # once waited for, a pid no process has
    gone_pid.wait()
    base = fastchan.root_base()
    gone = Path(tempfile.mkdtemp(prefix=f"{fastchan.ROOT_PREFIX}{gone_pid.pid}-12345-", dir=base))
    (gone / "tmpcontainer").mkdir()
    reused = Path(
        tempfile.mkdtemp(prefix=f"{fastchan.ROOT_PREFIX}{os.getpid()}-1-", dir=base)
    )  # our pid, another start
    other_shape = Path(tempfile.mkdtemp(prefix=f"{fastchan.ROOT_PREFIX}bystander-", dir=base))
    try:
        fastchan.remove_dead_roots(ProcessLiveness())
        assert not gone.exists() and not reused.exists()
        assert mine.is_dir() and other_shape.is_dir()
    finally:
        for path in (gone, reused, other_shape):
            shutil.rmtree(path, ignore_errors=True)
        live.close()
