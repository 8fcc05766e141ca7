"""Round trips through a real sandbox: output, errors, answer, variables, contexts, sub-LM calls."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from rlm_mcp.ports import ContextSpec
from tests.fixtures_sandbox import FakeBridge, json_context, no_bridge, ready_manager, text_context

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]


@pytest.mark.usefixtures("fast_channel")
async def test_round_trip(tmp_path: Path) -> None:
    async with ready_manager() as manager, manager.open([text_context(tmp_path, "hello world")]) as sb:
        r = await sb.execute(
            "x = 41\nimport sys, os\nprint('out', x + 1)\nprint('err', file=sys.stderr)\nos.write(1, b'fd1\\n')",
            no_bridge,
        )
        assert r.error is None
        assert r.stdout == "out 42\nfd1\n"
        assert r.stderr == "err\n"
        assert "x" in r.variables and "context" in r.variables and "context_0" in r.variables
        assert "llm_query" not in r.variables
        # As the reference REPL lists them: `answer` (a dict) first, then the contexts.
        assert r.variables[:3] == ["answer", "context_0", "context"]
        assert r.answer == {"content": "", "ready": False}  # as the reference starts it
        r = await sb.execute("def f():\n    return 1/0\nf()", no_bridge)
        assert r.error is not None and r.error.startswith("ZeroDivisionError: division by zero")
        assert "<cell-" in r.error and "rlm-kernel" not in r.error
        r = await sb.execute("print(x)", no_bridge)  # state persists between cells
        assert r.stdout == "41\n" and not r.restarted
        r = await sb.execute("y = (", no_bridge)
        assert r.error is not None and r.error.startswith("SyntaxError")


async def test_answer_variants(tmp_path: Path) -> None:
    async with ready_manager() as manager, manager.open([]) as sb:
        r = await sb.execute("answer['content'] = 'partial'", no_bridge)
        assert r.answer == {"content": "partial", "ready": False}
        r = await sb.execute("answer.update({'content': 7, 'ready': True})", no_bridge)
        assert r.answer == {"content": "7", "ready": True}
        r = await sb.execute("answer = {'content': None, 'ready': False}\nanswer['content'] = [1, 2]", no_bridge)
        assert r.answer == {"content": "[1, 2]", "ready": False}
        r = await sb.execute("answer['ready'] = True\nanswer['content'] = 'changed later in the cell'", no_bridge)
        assert r.answer == {"content": "changed later in the cell", "ready": True}
        r = await sb.execute("res = 'the final'\nFINAL_VAR('res')", no_bridge)
        assert r.answer == {"content": "the final", "ready": True}
        r = await sb.execute("FINAL(12)", no_bridge)
        assert r.answer == {"content": "12", "ready": True}
        r = await sb.execute("FINAL_VAR('missing')", no_bridge)
        assert r.error is not None and r.error.startswith("NameError")
        r = await sb.execute("print(SHOW_VARS())", no_bridge)
        assert "'res': 'str'" in r.stdout and "'answer'" not in r.stdout


async def test_contexts(tmp_path: Path) -> None:
    async with ready_manager() as manager:
        big = "line of text é ✓ \n" * 200_000  # ~3.8 MB, non-ASCII
        specs = [
            text_context(tmp_path, big, "big.txt"),
            json_context(tmp_path, [{"id": i, "v": "x" * 10} for i in range(1000)], "list.json"),
            json_context(tmp_path, {"a": 1, "b": [1, 2, 3]}, "dict.json"),
        ]
        async with manager.open(specs) as sb:
            r = await sb.execute(
                "print(context is context_0, len(context_0), type(context_1).__name__, len(context_1), "
                "context_1[5]['id'], type(context_2).__name__, context_2['b'])",
                no_bridge,
            )
            assert r.error is None, r.error
            assert r.stdout == f"True {len(big)} list 1000 5 dict [1, 2, 3]\n"


@pytest.mark.usefixtures("fast_channel")
async def test_context_bytes_arrive_exactly(tmp_path: Path) -> None:
    # Raw transfer: larger than the kernel's 4 MiB read, multi-byte characters across every read
    # boundary, invalid UTF-8 replaced as the host's reader always did, and an empty file.
    text = "ünïcödé ✓ 𝄞 line\n" * 400_000  # ~9 MB
    odd = tmp_path / "odd.txt"
    odd.write_bytes(b"ok \xff\xfe bytes \xe2\x9c")
    specs = [
        text_context(tmp_path, text, "big.txt"),
        ContextSpec(path=odd, format="text", kind="str", chars=10, bytes=odd.stat().st_size, name="odd.txt"),
        text_context(tmp_path, "", "empty.txt"),
    ]
    async with ready_manager() as manager, manager.open(specs) as sb:
        r = await sb.execute(
            "import hashlib\nprint(hashlib.sha256(context_0.encode()).hexdigest(), repr(context_1), repr(context_2))",
            no_bridge,
        )
    assert r.error is None, r.error
    expected_odd = b"ok \xff\xfe bytes \xe2\x9c".decode("utf-8", "replace")
    assert r.stdout == f"{hashlib.sha256(text.encode()).hexdigest()} {expected_odd!r} ''\n"


@pytest.mark.usefixtures("fast_channel")
async def test_llm_query_and_batch() -> None:
    async with ready_manager() as manager:
        bridge = FakeBridge()
        async with manager.open([]) as sb:
            r = await sb.execute(
                "a = llm_query('hi')\nb = llm_query_batched([f'p{i}' for i in range(16)])\n"
                "c = rlm_query('deep')\nd = rlm_query_batched(['x', 'y'])\nprint(a, b == [f'echo:p{i}' for i in range(16)], c, d)",
                bridge,
            )
            assert r.error is None, r.error
            assert r.stdout == "echo:hi True echo:deep ['echo:x', 'echo:y']\n"
            kinds = [(req.kind, len(req.prompts)) for req in bridge.requests]
            assert kinds == [("llm", 1), ("llm", 16), ("rlm", 1), ("rlm", 2)]
            # Several requests in flight at once, from user threads.
            r = await sb.execute(
                "from concurrent.futures import ThreadPoolExecutor\n"
                "with ThreadPoolExecutor(8) as ex:\n    out = list(ex.map(llm_query, [str(i) for i in range(32)]))\n"
                "print(out == [f'echo:{i}' for i in range(32)])",
                bridge,
            )
            assert r.stdout == "True\n", r.error


async def test_the_sandbox_passes_the_model_name_to_the_bridge() -> None:
    # Which model a request gets is the bridge's rule (tests/e2e/test_e2e_subcall_policy.py).
    async with ready_manager() as manager:
        bridge = FakeBridge()
        async with manager.open([]) as sb:
            r = await sb.execute("print(llm_query('a', model='any-name'))\nprint(llm_query('b'))", bridge)
            assert r.error is None, r.error
            assert r.stdout.splitlines() == ["echo:a", "echo:b"]
            assert [req.model for req in bridge.requests] == ["any-name", None]


async def test_fd_level_output_is_never_lost_at_the_end_of_a_cell(tmp_path: Path) -> None:
    # Bytes written with os.write go through a pipe drained by a thread; a cell's result must
    # still hold every one of them, however the threads interleave.
    async with ready_manager() as manager, manager.open([]) as sb:
        for i in range(300):
            r = await sb.execute(f"import os\nos.write(1, b'out {i}\\n')\nos.write(2, b'err {i}\\n')", no_bridge)
            assert (r.stdout, r.stderr) == (f"out {i}\n", f"err {i}\n"), i


@pytest.mark.parametrize("reader", ["loop", "thread"])
async def test_both_readers_of_the_attach_stream(reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain unix socket is read on the event loop; anything else (TLS, an SSH channel) by a
    thread, forced here. Both carry small frames, a big output (parsed aside on the loop path)
    and sub-calls; once retired the socket is closed and no longer watched by the loop."""
    from rlm_mcp.sandbox.docker import attach, container

    if reader == "thread":
        for module in (attach, container):
            monkeypatch.setattr(module, "plain_socket", lambda raw: None)
    async with ready_manager(pool_size=0) as manager, manager.open([]) as sb:
        channel = sb.container
        assert isinstance(channel, container.KernelContainer)
        assert isinstance(channel._reader, attach.LoopReader if reader == "loop" else attach.ThreadReader)
        raw = channel._raw
        fd = raw.fileno()
        r = await sb.execute("print('z' * 300_000)\nb = llm_query_batched(['p'] * 16)\nprint(len(b))", FakeBridge())
        assert r.error is None and r.stdout == "z" * 300_000 + "\n16\n", r.error
    assert raw.fileno() == -1  # the manager retired it
    assert not asyncio.get_running_loop().remove_reader(fd)
