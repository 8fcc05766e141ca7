"""The stdio transport's write end (server/stdio_out.py): answers written on the event loop,
whole and in order, without blocking it when the client reads slowly; fd 1 kept off the wire
while serving, as the SDK's own transport keeps it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import anyio
import pytest

from rlm_mcp.server.stdio_out import PipeOut, wire_is_a_stream

pytestmark = pytest.mark.anyio

GUARD_S = 30  # a hang guard only


def test_stray_output_while_serving_goes_to_stderr_and_the_wire_comes_back() -> None:
    script = textwrap.dedent(
        """
        import os, subprocess, sys
        import anyio
        from rlm_mcp.server.stdio_out import PipeOut, claimed_stdout

        async def main():
            with claimed_stdout() as wire:
                out = PipeOut(wire)
                await out.write('{"id": 1}')
                await out.write("\\n")
                await out.flush()
                print("stray print", flush=True)
                os.write(1, b"stray write\\n")
                subprocess.run(["echo", "stray child"], check=True)
                await out.write('{"id": 2}\\n')
                await out.flush()
            print("after", flush=True)

        anyio.run(main)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=GUARD_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"id": 1}\n{"id": 2}\nafter\n'
    for stray in ("stray print", "stray write", "stray child"):
        assert stray in done.stderr


async def test_a_full_pipe_stalls_only_the_writer_and_every_byte_arrives_in_order() -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # as claimed() leaves the wire
    message = b"".join(b"%08d," % i for i in range(200_000)) + b"\n"  # 1.8 MB, past any pipe buffer
    out = PipeOut(write_end)
    flushed = anyio.Event()

    async def answer() -> None:
        await out.write(message.decode())
        await out.flush()
        flushed.set()

    def read_all() -> bytes:
        got = bytearray()
        while len(got) < len(message):
            got += os.read(read_end, 1 << 16)
        return bytes(got)

    try:
        with anyio.fail_after(GUARD_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer)
                # The writer waits for room in the pipe; the event loop is free meanwhile.
                await anyio.wait_all_tasks_blocked()
                assert not flushed.is_set()
                got = await anyio.to_thread.run_sync(read_all)
        assert flushed.is_set() and got == message
    finally:
        os.close(read_end)
        os.close(write_end)


def test_only_a_pipe_or_a_socket_is_served_by_this_transport() -> None:
    read_end, write_end = os.pipe()
    try:
        assert wire_is_a_stream(write_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    with open(os.devnull, "wb") as null:
        assert not wire_is_a_stream(null.fileno())
    assert not wire_is_a_stream(999_999)  # not open
