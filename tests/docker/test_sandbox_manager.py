"""Pool, ownership, orphan reaping, host death, cancellation, and a TCP Docker engine."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import docker.errors
import pytest

from rlm_mcp.errors import ImageMissingError, TooLargeError
from rlm_mcp.sandbox.docker.backend import DockerBackend
from rlm_mcp.sandbox.docker.engine import engine_ulimits
from rlm_mcp.sandbox.docker.hardening import LABEL_OWNER
from rlm_mcp.sandbox.docker.lean_calls import calls
from rlm_mcp.sandbox.liveness import LABEL_PID, ProcessLiveness
from rlm_mcp.sandbox.manager import BACKGROUND_REMOVALS, SandboxManager
from rlm_mcp.testing.sandboxes import docker_client, pool_ready, reap_orphans
from rlm_mcp.testing.servers import close_pipes
from tests.fixtures_sandbox import (
    container_id,
    engine_of,
    no_bridge,
    ready_manager,
    sandbox_settings,
    text_context,
    wait_for,
)
from tests.paths import REPO

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]


def owner_containers(client, owner: str, *, all: bool = True) -> list[dict]:
    return client.api.containers(all=all, filters={"label": f"{LABEL_OWNER}={owner}"})


async def test_pool_warm_acquire_never_reused_and_refilled(tmp_path: Path) -> None:
    async with ready_manager(pool_size=1) as mgr:
        assert await wait_for(lambda: pool_ready(mgr) == 1)
        pooled = mgr._pool._ready[0]
        async with mgr.open([]) as sb1:
            assert sb1.container is pooled  # taken warm
            await sb1.execute("mine = 1", no_bridge)
            assert await wait_for(lambda: pool_ready(mgr) == 1)  # refilled in the background
            async with mgr.open([]) as sb2:
                assert sb2.container is not sb1.container
                r = await sb2.execute("print('mine' in globals())", no_bridge)
                assert r.stdout == "False\n"
        # After release, the used containers are gone (removed in the background), never handed out again.
        assert pooled not in mgr._pool._ready
        assert not pooled.closed  # not on the run's way out: closed with its removal, in the background
        assert await wait_for(lambda: pooled.closed)
        client = await docker_client(mgr)
        assert await wait_for(
            lambda: container_id(pooled) not in {c["Id"] for c in owner_containers(client, mgr.owner_id)}
        )


async def test_owners_are_separate_and_exit_cleans_up(tmp_path: Path) -> None:
    async with ready_manager(pool_size=1) as other:
        client = await docker_client(other)
        assert await wait_for(lambda: pool_ready(other) == 1)
        async with other.open([]) as busy:
            async with ready_manager(pool_size=1) as mine:
                assert mine.owner_id != other.owner_id
                async with mine.open([]) as sb:
                    await sb.execute("x = 1", no_bridge)
                await reap_orphans(mine)
            # `mine` is closed: none of its containers are left, the other's live ones are untouched.
            assert owner_containers(client, mine.owner_id) == []
            r = await busy.execute("print('alive')", no_bridge)
            assert r.stdout == "alive\n"
            assert len(owner_containers(client, other.owner_id, all=False)) >= 2
        owner = other.owner_id
    assert owner_containers(client, owner) == []
    client.close()


def dead_process_stamp() -> dict[str, str]:
    """The liveness stamp of a process that has exited (and been waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE)
    out, _ = proc.communicate()
    stamp = dict(ProcessLiveness().stamp())
    stamp[LABEL_PID] = out.decode().strip()
    return stamp


async def test_reaping_removes_only_stopped_sandboxes_of_dead_owners(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        async with mgr.open([]) as live:
            # A stopped container stamped by a process that has exited: an orphan.
            cid = client.api.create_container(
                mgr.settings.sandbox_image,
                command=["true"],
                labels={LABEL_OWNER: "dead-owner", "rlm-mcp.role": "sandbox", **dead_process_stamp()},
                host_config=client.api.create_host_config(
                    ulimits=engine_ulimits(engine_of(mgr), mgr.settings)
                ),  # Podman needs them
            )["Id"]
            await anyio.to_thread.run_sync(client.api.start, cid)
            await anyio.to_thread.run_sync(lambda: client.api.wait(cid, timeout=20))
            await reap_orphans(mgr)
            # Gone, or going: another server on this daemon may be removing the same orphan.
            assert await wait_for(lambda: not client.api.containers(all=True, filters={"id": cid}))
            r = await live.execute("print(1)", no_bridge)
            assert r.stdout == "1\n"


NEIGHBOUR_SCRIPT = textwrap.dedent(
    """
    import sys
    import anyio
    from tests.fixtures_sandbox import sandbox_settings
    from rlm_mcp.sandbox.docker.container import KernelContainer
    from rlm_mcp.sandbox.docker.docker_api import connect_sync
    from rlm_mcp.sandbox.docker.engine import probe_sync

    async def main():
        client = connect_sync()
        settings = sandbox_settings(pool_size=0)
        container = await KernelContainer.start(client, settings, sys.argv[1], probe_sync(client, settings))
        client.api.kill(container.id)  # stopped, not removed: its server may still read why
        client.api.wait(container.id, timeout=20)
        print(container.id, flush=True)
        sys.stdin.readline()  # alive until the test lets it go

    anyio.run(main)
    """
)


async def test_a_live_neighbours_stopped_sandbox_survives_our_start(tmp_path: Path) -> None:
    """Issue 19 item 3: a server starting on the same daemon never removes the stopped sandbox
    of another server that is still running; once that server has exited, it does."""
    owner = "neighbour-" + os.urandom(4).hex()
    proc = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR_SCRIPT, owner],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    client = None
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    try:
        cid = (await anyio.to_thread.run_sync(stdout.readline)).decode().strip()
        assert cid, "the neighbour could not start its sandbox"
        async with ready_manager(pool_size=0) as mgr:  # start-up reaping runs here
            client = await docker_client(mgr)
            await reap_orphans(mgr)
            found = client.api.containers(all=True, filters={"id": cid})
            assert [c["State"] for c in found] == ["exited"]
            stdin.close()
            await anyio.to_thread.run_sync(proc.wait)
            await reap_orphans(mgr)
            # Gone, or going: once its owner is gone any server on this daemon may remove it.
            assert await wait_for(lambda: not client.api.containers(all=True, filters={"id": cid}))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        close_pipes(proc)
        if client is not None:
            for info in owner_containers(client, owner):
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(info["Id"], force=True)


@pytest.mark.usefixtures("fast_channel")
async def test_cancellation_kills_the_container(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        async with mgr.open([]) as sb:
            with anyio.move_on_after(0.5):
                await sb.execute("import time\ntime.sleep(30)", no_bridge)
            assert sb.container is None
            assert await wait_for(lambda: owner_containers(client, mgr.owner_id) == [])  # removed in the background
            r = await sb.execute("print('back')", no_bridge)  # a fresh container takes over
            assert r.stdout == "back\n" and r.restarted


async def test_a_start_cancelled_while_the_cpu_probe_is_asked_removes_its_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first sandbox asks once whether CPU limits change in place; a run cancelled while its
    # new container waited for that answer left the container to nobody until the server stopped.
    asked = anyio.Event()

    async def unanswered(self: DockerBackend, channel: object, cpus: float) -> None:
        asked.set()
        await anyio.sleep_forever()

    monkeypatch.setattr(DockerBackend, "set_cpus", unanswered)
    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        opened: list[object] = []

        async def open_one() -> None:
            async with mgr.open([]) as sb:
                opened.append(sb)

        async with anyio.create_task_group() as tg:
            tg.start_soon(open_one)
            with anyio.fail_after(60):
                await asked.wait()
            assert len(owner_containers(client, mgr.owner_id)) == 1
            tg.cancel_scope.cancel()
        assert opened == []
        assert await wait_for(lambda: owner_containers(client, mgr.owner_id) == [])  # before the manager stops


async def test_check_fits(tmp_path: Path) -> None:
    mgr = SandboxManager(sandbox_settings(sandbox_memory="256m").sandbox)
    small = text_context(tmp_path, "x" * 1000)
    mgr.check_fits([small])
    big = small.__class__(path=small.path, format="text", kind="str", chars=200 << 20, bytes=200 << 20)
    with pytest.raises(TooLargeError, match="RLM_MCP_SANDBOX_MEMORY"):
        mgr.check_fits([big])


@pytest.fixture
def tcp_docker() -> Iterator[str]:
    """A loopback TCP port forwarded to the local Docker socket (a remote engine stand-in)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def relay(client: socket.socket, upstream: socket.socket) -> None:
        # Both directions, then both sockets closed (not left to the collector) once both end.
        with client, upstream:
            pumps = [
                threading.Thread(target=pump, args=pair, daemon=True)
                for pair in ((client, upstream), (upstream, client))
            ]
            for p in pumps:
                p.start()
            for p in pumps:
                p.join()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect("/var/run/docker.sock")
            threading.Thread(target=relay, args=(client, upstream), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"tcp://127.0.0.1:{port}"
    stop.set()
    listener.close()


async def test_tcp_docker_host(tcp_docker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", tcp_docker)
    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, "over tcp")]) as sb:
        r = await sb.execute("print(context)\nFINAL(llm_query('q'))", lambda req: _echo(req))
        assert r.stdout == "over tcp\n" and r.answer == {"content": "echo:q", "ready": True}


async def _echo(req):
    return [f"echo:{p}" for p in req.prompts]


async def test_docker_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlm_mcp.errors import DockerUnavailableError

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    async with SandboxManager(sandbox_settings().sandbox) as mgr:
        with pytest.raises(DockerUnavailableError, match="Docker is not running"):
            await mgr.ensure_ready()


async def test_image_missing() -> None:
    async with SandboxManager(sandbox_settings(sandbox_image="rlm-mcp-no-such-image:0").sandbox) as mgr:
        with pytest.raises(ImageMissingError, match="rlm-mcp image build"):
            await mgr.ensure_ready()


async def test_a_start_after_the_image_is_gone_says_how_to_build_it() -> None:
    # A start does not look at the image first: Docker's refusal of the create says it is gone.
    ready = DockerBackend(sandbox_settings().sandbox)
    backend = DockerBackend(sandbox_settings(sandbox_image="rlm-mcp-no-such-image:0").sandbox)
    try:
        await ready.check_ready()
        backend.engine = ready.engine  # as `check_ready` found it before the image went
        with pytest.raises(ImageMissingError, match="rlm-mcp image build"):
            await backend.start("rlm-mcp-test-no-image")
    finally:
        ready.close()
        backend.close()


async def test_kill_stops_the_container_even_when_remove_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the daemon does not answer the remove, dropping our attach connection must still stop it."""
    from rlm_mcp.sandbox.docker.container import KernelContainer

    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        owner = "killfail-" + os.urandom(4).hex()
        c = await KernelContainer.start(client, mgr.settings, owner, engine_of(mgr))
        try:
            monkeypatch.setattr(c, "_remove_sync", lambda: None)  # the daemon "times out" on the remove
            await c.kill()
            assert await wait_for(lambda: not owner_containers(client, owner, all=False), timeout=10)
        finally:
            # Stopped, it is an orphan: a neighbour server's start-up reaping may have removed it.
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(c.id, force=True)


async def test_a_removal_docker_does_not_answer_is_left_to_its_thread_at_the_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A removal call that hangs holds its caller no longer than the bound (a thread's call cannot
    be cancelled: the bound used to start counting only once Docker answered), and says so."""
    from rlm_mcp.sandbox.docker import container as container_module
    from rlm_mcp.sandbox.docker.container import KernelContainer

    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        owner = "hungremove-" + os.urandom(4).hex()
        c = await KernelContainer.start(client, mgr.settings, owner, engine_of(mgr))
        answered = threading.Event()
        real_remove = c._remove_sync
        try:
            monkeypatch.setattr(container_module, "REMOVE_WAIT_S", 0.5)
            monkeypatch.setattr(c, "_remove_sync", lambda: answered.wait(60))  # Docker never answers
            with caplog.at_level(logging.WARNING, logger="rlm_mcp.sandbox"), anyio.fail_after(30):
                await c.kill()
            assert not answered.is_set()  # returned while the call still hung
            assert f"sandbox {c.name}: Docker did not answer its removal within 0.5 s" in caplog.text
        finally:
            answered.set()
            real_remove()


async def test_no_leak_when_create_answer_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow daemon creates the container but the client times out: it must still be removed."""
    import requests.exceptions

    from rlm_mcp.errors import SandboxError
    from rlm_mcp.sandbox.docker.container import KernelContainer

    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        owner = "lostcreate-" + os.urandom(4).hex()
        api = calls(client)  # where a sandbox's create goes (lean_calls.py)
        real = api.create_container

        def create(*args, **kwargs):
            real(*args, **kwargs)
            raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=30)")

        monkeypatch.setattr(api, "create_container", create)
        with pytest.raises((SandboxError, requests.exceptions.ReadTimeout, Exception)):
            await KernelContainer.start(client, mgr.settings, owner, engine_of(mgr))
        monkeypatch.undo()
        try:
            assert owner_containers(client, owner) == []
        finally:
            for info in owner_containers(client, owner):
                client.api.remove_container(info["Id"], force=True)


async def test_used_containers_are_removed_after_the_run_returns_and_on_exit(tmp_path: Path) -> None:
    async with ready_manager(pool_size=0) as mgr:
        client = await docker_client(mgr)
        used = []
        # More runs than background removal slots: past the bound a run removes its own container.
        for _ in range(BACKGROUND_REMOVALS + 2):
            async with mgr.open([]) as sb:
                used.append(sb.container)
        # All of it, under one deadline: the engine may list a container as gone (Podman does)
        # before its removal call has returned and the manager has let go of it; a container
        # removed in the background is closed there too.
        assert await wait_for(
            lambda: (
                all(c is not None and c.closed for c in used)
                and owner_containers(client, mgr.owner_id) == []
                and not mgr._live
            )
        )
        # A run that ends as the manager exits: its removal still completes before the exit returns.
        async with mgr.open([]) as sb:
            last = sb.container
        owner = mgr.owner_id
    assert last is not None and last.closed
    assert owner_containers(client, owner) == []
    client.close()
