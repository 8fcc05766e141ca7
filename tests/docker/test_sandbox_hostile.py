"""Issue #3: every hostile cell ends with a clear message, and the next cell works normally."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.ports import CellResult
from rlm_mcp.sandbox.session import KernelSandbox
from tests.fixtures_sandbox import FakeBridge, no_bridge, ready_manager, text_context

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

CONTEXT = "the secret word is: pineapple"


async def assert_healthy(sb: KernelSandbox) -> None:
    """A normal cell gives the right answer afterwards (contexts present)."""
    r = await sb.execute("n = sum(range(10))\nprint(n, context.split()[-1])\nFINAL(n)", no_bridge)
    assert r.error is None, r.error
    assert r.stdout == "45 pineapple\n"
    assert r.answer == {"content": "45", "ready": True}


def assert_restarted(r: CellResult) -> None:
    assert r.restarted and r.error and r.notice
    assert "all variables were lost; contexts reloaded" in r.notice


# Cells that kill their container: each must be replaced, with a clear reason.
KILLERS = {
    "c_loop": ("sum(range(10**13))", "did not stop when interrupted"),
    "memory": ("x = bytearray(400 * 2**20)\nx[::4096] = b'1' * len(x[::4096])", "ran out of memory"),
    "os_exit": ("import os\nos._exit(1)", "exited (exit status 1"),
    "self_kill": ("import os\nos.kill(os.getpid(), 9)", "killed by signal 9"),
    "garbage_frame": (
        "import gc, os\nk = [o for o in gc.get_objects() if type(o).__name__ == 'Kernel'][0]\n"
        "os.write(k.proto_out, b'\\x00\\x00\\x00\\x05hello')\nimport time; time.sleep(5)",
        "broke the host protocol",
    ),
    "unknown_frame": (
        "import gc\nk = [o for o in gc.get_objects() if type(o).__name__ == 'Kernel'][0]\n"
        "k.send({'type': 'take_over', 'id': 1})\nimport time; time.sleep(5)",
        "unknown frame type",
    ),
    "huge_frame": (
        "import gc, os\nk = [o for o in gc.get_objects() if type(o).__name__ == 'Kernel'][0]\n"
        "os.write(k.proto_out, b'\\xff\\xff\\xff\\xff')\nimport time; time.sleep(5)",
        "the cap is",
    ),
    "protocol_fds": (
        # the fast channel's socket included (it is opened after the kernel's other fds)
        "import os\nfor fd in range(3, 64):\n    try: os.close(fd)\n    except OSError: pass",
        "The sandbox",
    ),
}


@pytest.mark.usefixtures("fast_channel")
@pytest.mark.parametrize("case", sorted(KILLERS))
async def test_container_killers(case: str, tmp_path: Path) -> None:
    code, reason = KILLERS[case]
    async with ready_manager() as mgr, mgr.open([text_context(tmp_path, CONTEXT)]) as sb:
        await sb.execute("keep = 1", no_bridge)
        r = await sb.execute(code, no_bridge)
        assert_restarted(r)
        assert r.notice is not None and reason in r.notice, r.notice
        r2 = await sb.execute("print('keep' in globals())", no_bridge)
        assert r2.stdout == "False\n"
        await assert_healthy(sb)


async def test_survivable_hostile_cells(tmp_path: Path) -> None:
    async with ready_manager(cell_output_bytes=64 * 1024) as mgr, mgr.open([text_context(tmp_path, CONTEXT)]) as sb:
        await sb.execute("keep = 'kept'", no_bridge)

        r = await sb.execute("while True:\n    pass", no_bridge)  # interruptible busy loop
        assert r.timed_out and not r.restarted and r.error and r.error.startswith("TimeoutError")

        r = await sb.execute("import sys\nsys.exit()", no_bridge)
        assert r.error and r.error.startswith("SystemExit") and not r.restarted

        r = await sb.execute(
            "import os\nos.write(1, bytes(range(256)) * 4)\nos.write(2, b'\\xff\\xfe\\x00')", no_bridge
        )
        assert r.error is None and not r.restarted and len(r.stdout) > 0

        r = await sb.execute("import os\nos.close(0); os.close(1); os.close(2)\nprint('still here')", no_bridge)
        assert r.error is None and r.stdout == "still here\n"
        r = await sb.execute("import os\nos.write(1, b'fd1 again\\n')", no_bridge)
        assert r.stdout == "fd1 again\n"

        r = await sb.execute("for _ in range(40):\n    print('x' * 10**6)", no_bridge)  # 40 MB of output
        assert r.error is None and len(r.stdout) < 80 * 1024 and "bytes of output dropped" in r.stdout

        r = await sb.execute(
            "import threading, time\n_stop = threading.Event()\n"
            "def spam():\n    while not _stop.is_set():\n        print('bg' * 1000)\n        time.sleep(0.001)\n"
            "threading.Thread(target=spam, daemon=True).start()\ntime.sleep(0.05)",
            no_bridge,
        )
        assert r.error is None
        # print() writes its text and its newline separately and the thread may write between
        # them, so look for a delimited marker, not "fg\n".
        r = await sb.execute("import time\ntime.sleep(0.2)\nprint('<fg>')", no_bridge)
        assert r.error is None and len(r.stdout) <= 80 * 1024 and "<fg>" in r.stdout
        r = await sb.execute("_stop.set()\ntime.sleep(0.05)", no_bridge)
        assert r.error is None

        r = await sb.execute(
            "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))", no_bridge
        )
        assert r.error and r.error.startswith("OSError")
        r = await sb.execute(
            "import urllib.request\nurllib.request.urlopen('http://deb.debian.org', timeout=2)", no_bridge
        )
        assert r.error and "URLError" in r.error

        r = await sb.execute("open('/etc/evil', 'w').write('x')", no_bridge)
        assert r.error and (r.error.startswith("OSError") or r.error.startswith("PermissionError"))
        assert "Read-only file system" in r.error or "Permission denied" in r.error

        r = await sb.execute(
            "f = open('/tmp/fill', 'wb')\nwhile True:\n    f.write(b'0' * 2**20)\n    f.flush()", no_bridge
        )
        assert r.error and "No space left on device" in r.error and not r.restarted
        r = await sb.execute("import os\nos.remove('/tmp/fill')\nprint(keep)", no_bridge)
        assert r.stdout == "kept\n"
        await assert_healthy(sb)


async def test_fork_bomb(tmp_path: Path) -> None:
    async with ready_manager() as mgr, mgr.open([text_context(tmp_path, CONTEXT)]) as sb:
        r = await sb.execute("import os\nwhile True:\n    os.fork()", no_bridge)
        assert r.error  # BlockingIOError at the pids limit, a timeout, or a restart
        await assert_healthy(sb)
        r = await sb.execute(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", no_bridge
        )
        assert r.error
        await assert_healthy(sb)


@pytest.mark.usefixtures("fast_channel")
async def test_sub_call_flood(tmp_path: Path) -> None:
    bridge = FakeBridge()
    # How many calls a run may make is the engine's rule (the bridge answers the rest with
    # errors); here the sandbox's own bounds: the kernel survives a flood, batches are capped.
    async with (
        ready_manager(max_prompts_per_batch=20, cell_timeout_s=60) as mgr,
        mgr.open([text_context(tmp_path, CONTEXT)]) as sb,
    ):
        r = await sb.execute(
            "out = [llm_query(str(i)) for i in range(2000)]\n"
            "print(sum(o.startswith('echo:') for o in out), sum(o.startswith('Error:') for o in out))",
            bridge,
        )
        assert r.error is None, r.error
        assert r.stdout == "2000 0\n"
        assert bridge.prompts == 2000
        r = await sb.execute("llm_query_batched(['p'] * 21)", bridge)
        assert r.error and "at most 20 prompts" in r.error
        await assert_healthy(sb)


async def test_no_host_env_inside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_TEST_FAKE_SECRET", "hunter2-do-not-leak")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-host-key")
    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, CONTEXT)]) as sb:
        r = await sb.execute(
            "import os\nenv = dict(os.environ)\nprint(sorted(env))\n"
            "print(open('/proc/1/environ', 'rb').read() if os.access('/proc/1/environ', os.R_OK) else b'')\n"
            "print(os.getuid(), os.getgid())",
            no_bridge,
        )
        assert "hunter2" not in r.stdout and "sk-fake" not in r.stdout and "RLM_TEST" not in r.stdout
        assert r.stdout.splitlines()[-1] == "1000 1000"


# Cells that used to crash the kernel (or overflow the frame cap) while it built the cell's
# result: the REPL must survive them with its variables, and report an error.
SURVIVABLE = {
    "non_str_global": ("globals()[1] = 2\nx = 5", None),
    "str_raises": ("class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise E()", "E"),
    "class_raises": (
        "class P:\n    @property\n    def __class__(self):\n        raise RuntimeError('boom')\np = P()",
        None,
    ),
    # A 64 MB error text (message + traceback) overflowed the frame cap: protocol violation.
    "huge_error": ("raise ValueError('x' * 32_000_000)", "ValueError"),
}


@pytest.mark.parametrize("case", sorted(SURVIVABLE))
async def test_kernel_survives_odd_cells(case: str, tmp_path: Path) -> None:
    code, error = SURVIVABLE[case]
    async with ready_manager(pool_size=0) as mgr, mgr.open([text_context(tmp_path, CONTEXT)]) as sb:
        await sb.execute("keep = 1", no_bridge)
        r = await sb.execute(code, no_bridge)
        assert not r.restarted, r.notice
        if error is None:
            assert r.error is None, r.error
        else:
            assert r.error is not None and r.error.startswith(error), (r.error or "")[:300]
            assert len(r.error) < 2 * (1 << 20)
        r2 = await sb.execute("print('keep' in globals())", no_bridge)
        assert r2.stdout == "True\n" and not r2.restarted
        await assert_healthy(sb)
