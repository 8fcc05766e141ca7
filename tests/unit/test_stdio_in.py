"""The stdio transport's read end (server/stdio_in.py): requests read on the event loop, line
by line as the SDK's own text wrapper gives them, without blocking the loop while the client is
quiet; fd 0 kept off the wire while serving, as the SDK's own transport keeps it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import anyio
import pytest

from rlm_mcp.server.stdio_in import READ_BYTES, PipeIn

pytestmark = pytest.mark.anyio

GUARD_S = 30  # a hang guard only


async def _lines(fd: int) -> list[str]:
    with anyio.fail_after(GUARD_S):
        return [line async for line in PipeIn(fd)]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def _read_all_of(*writes: bytes) -> list[str]:
    """The lines `PipeIn` reads from a pipe given `writes`, each sent once the reader waits."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)  # as claimed() leaves the wire
    got: list[str] = []

    async def read() -> None:
        got.extend(await _lines(read_end))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            for data in writes:
                await anyio.wait_all_tasks_blocked()  # the reader waits on the loop, not in a thread
                await anyio.to_thread.run_sync(_write_all, write_end, data)  # past the pipe's buffer too
            os.close(write_end)
            write_end = -1
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    return got


async def test_lines_split_across_reads_and_several_in_one_read_each_come_whole() -> None:
    got = await _read_all_of(b'{"id": 1', b'}\n{"id": 2}\n{"id"', b": 3}\n")
    assert got == ['{"id": 1}\n', '{"id": 2}\n', '{"id": 3}\n']


async def test_lines_are_what_the_sdks_text_wrapper_gives() -> None:
    # CRLF and a lone CR end lines (universal newlines), a bad byte is replaced, a character
    # split across two reads is whole, and a last line without its newline still comes.
    euro = "€".encode()
    got = await _read_all_of(b"a\r\nb\rc\xff\n" + euro[:1], euro[1:] + b"\nlast")
    assert got == ["a\n", "b\n", "c\ufffd\n", "€\n", "last"]


async def test_a_line_longer_than_one_read_comes_whole() -> None:
    line = "x" * (3 * READ_BYTES + 17)
    got = await _read_all_of(line.encode() + b"\n", b"next\n")
    assert got == [line + "\n", "next\n"]


async def test_an_empty_wire_ends_at_once() -> None:
    assert await _read_all_of() == []


def test_a_child_process_cannot_read_the_wire_while_serving_and_the_wire_comes_back() -> None:
    script = textwrap.dedent(
        """
        import os, stat, subprocess
        import anyio
        from rlm_mcp.server.stdio_in import PipeIn, claimed_stdin

        def fd0():
            return "pipe" if stat.S_ISFIFO(os.fstat(0).st_mode) else "other"

        async def main():
            with claimed_stdin() as wire:
                child = subprocess.run(["cat"], capture_output=True, check=True)  # fd 0: the null device
                print("child", repr(child.stdout), fd0(), flush=True)
                print("lines", [line async for line in PipeIn(wire)], flush=True)
            print("after", fd0(), os.get_blocking(0), flush=True)

        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input="one\ntwo\n", capture_output=True, text=True, timeout=GUARD_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "child b'' other\nlines ['one\\n', 'two\\n']\nafter pipe True\n"
