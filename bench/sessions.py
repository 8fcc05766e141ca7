"""Kept sessions: a follow-up that reuses an expensive variable, against a fresh run that must
build it again, with a scripted LM that takes a fixed time per call.

    .venv/bin/python bench/sessions.py [--mib 20] [--delay 0.5] [--repeat 3] [--image TAG]
    .venv/bin/python bench/sessions.py snapshots [--sizes 1,10,100] [--image TAG]

Each run's first turn is the expensive part: an index of every word of a `--mib` MiB context
(built in the sandbox). Scenario "fresh": a run that builds the index, then answers from it
(2 root calls; a new sandbox, the context loaded). Scenario "warm follow-up": the same question
in a kept session whose first run built the index: it answers at once (1 root call; the live
REPL, nothing loaded). Scenario "restore follow-up": the same, after the session's sandbox was
given back (as under slot pressure): a fresh sandbox, the context reloaded, the namespace
restored from the snapshot. Also reported: what opening the session cost, and the memory the
idle session's sandbox holds (Docker's view of its container).

`snapshots`: the snapshot's size and the time to take it and to restore it into a fresh sandbox,
for namespaces of 1, 10 and 100 MiB (lists of 2 KiB strings). Never fails on a timing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import cast

import anyio
import docker

from rlm_mcp.assembly import build_service
from rlm_mcp.config import Settings
from rlm_mcp.engine.snapshot import restore_snapshot, take_snapshot
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports import LMRequest
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides
from rlm_mcp.service.sessions import SessionManager
from rlm_mcp.testing import scripted_lm_process

BUILD = "```repl\nindex = {}\nfor i, w in enumerate(context.split()):\n    index.setdefault(w, []).append(i)\nprint(len(index))\n```"
ANSWER = '```repl\nanswer["content"] = str(len(index["w7"]))\nanswer["ready"] = True\n```'


async def quiet(progress: float, total: float | None, message: str) -> None:
    return None


def idle_memory(container: str) -> float:
    """MiB the container uses now (Docker's memory_stats.usage)."""
    client = docker.from_env()
    try:
        stats = client.api.stats(container, stream=False)
        return float(stats.get("memory_stats", {}).get("usage", 0)) / 2**20
    finally:
        client.close()


def with_image(settings: Settings, image: str | None) -> Settings:
    """`settings` running the sandboxes on `image` when one is given (else the configured one)."""
    return settings.model_copy(update={"sandbox_image": image}) if image else settings


async def no_calls(request: LMRequest) -> list[str]:
    return ["-"] * len(request.prompts)


async def snapshots(sizes: list[int], image: str | None) -> None:
    print(f"snapshot size and times (dill inside the sandbox); machine: {platform.node()} {platform.machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        settings = with_image(Settings(data_dir=Path(tmp) / "data", pool_size=0, sandbox_memory="4g"), image)
        chunk = settings.sandbox.cell_output_bytes // 2
        async with SandboxManager(settings.sandbox) as manager:
            for mib in sizes:
                async with manager.open([], kept=True) as box:
                    await box.execute(f"data = [('%08d' % i) * 256 for i in range({mib} * 512)]", no_calls)
                    t = time.perf_counter()
                    snap = await take_snapshot(
                        box, Path(tmp) / "snap", max_bytes=1 << 31, chunk_chars=chunk, deadline_s=3600.0
                    )
                    took = time.perf_counter() - t
                async with manager.open([], kept=True) as fresh:
                    t = time.perf_counter()
                    lost = await restore_snapshot(fresh, snap, chunk_chars=chunk)
                    restored = time.perf_counter() - t
                    check = await fresh.execute("print(len(data), len(data[0]))", no_calls)
                assert not lost and check.stdout.strip() == f"{mib * 512} 2048", (lost, check)
                print(
                    f"namespace {mib:>4} MiB: snapshot {snap.size / 2**20:8.1f} MiB, "
                    f"take {took:7.2f} s, restore into a fresh sandbox {restored:7.2f} s"
                )


async def bench(mib: int, delay: float, repeat: int, image: str | None) -> None:
    words = (" ".join(f"w{i % 5000}" for i in range(20000)) + " ") * 1
    text = (words * (mib * 2**20 // len(words) + 1))[: mib * 2**20]
    script = {
        "root_by_query": [
            {"match": "BUILD-THEN-ANSWER", "replies": [BUILD, ANSWER]},
            {"match": "ANSWER-FROM-INDEX", "replies": [ANSWER]},
        ],
        "delay_s": {"root": delay, "sub": delay},
        "max_model_len": 65536,
    }
    instance = f"bench-sessions-{int(time.time())}"
    with tempfile.TemporaryDirectory() as tmp, scripted_lm_process(script) as url:
        settings = with_image(
            Settings(
                base_url=url,
                data_dir=Path(tmp) / "data",
                allowed_roots=[Path(tmp)],
                pool_size=1,
                instance_id=instance,
                sandbox_memory="2g",
            ),
            image,
        )
        async with build_service(settings) as service:
            local = Caller(service, LOCAL_OWNER)
            ctx = await local.load_context(text=text)
            cid = ctx.context_id
            await local.complete("BUILD-THEN-ANSWER warm-up", cid, RunOverrides(), quiet)
            fresh, opened, warm, restored = [], [], [], []
            memory: list[float] = []
            for _ in range(repeat):
                t = time.perf_counter()
                r = await local.complete("BUILD-THEN-ANSWER", cid, RunOverrides(), quiet)
                fresh.append(time.perf_counter() - t)
                assert r.status == "completed", r
                t = time.perf_counter()
                r, sid = await local.complete_in_session(
                    "BUILD-THEN-ANSWER", cid, RunOverrides(), quiet, keep_session=True
                )
                opened.append(time.perf_counter() - t)
                assert r.status == "completed" and sid is not None, r
                channel = getattr(
                    cast(SessionManager, service.sessions).get(sid, owner=LOCAL_OWNER).repl.sandbox, "container", None
                )
                if channel is not None:
                    memory.append(await anyio.to_thread.run_sync(idle_memory, channel.name))
                t = time.perf_counter()
                r, _ = await local.complete_in_session("ANSWER-FROM-INDEX", None, RunOverrides(), quiet, session_id=sid)
                warm.append(time.perf_counter() - t)
                assert r.status == "completed", r
                if await service.sessions.reclaim() and await service.sessions.list(owner=LOCAL_OWNER):
                    t = time.perf_counter()  # its sandbox was given back, its snapshot kept
                    r, _ = await local.complete_in_session(
                        "ANSWER-FROM-INDEX", None, RunOverrides(), quiet, session_id=sid
                    )
                    restored.append(time.perf_counter() - t)
                    assert r.status == "completed", r
                    await local.close_session(sid)

    def row(name: str, walls: list[float]) -> str:
        return f"{name:<34} median {statistics.median(walls):7.3f} s  [{min(walls):.3f}, {max(walls):.3f}]"

    print(f"kept sessions, {mib} MiB context, LM delay {delay * 1000:.0f} ms per call, {repeat} repeats")
    print(f"machine: {platform.node()} {platform.machine()}, {platform.python_version()}")
    print(row("fresh run (build index + answer)", fresh))
    print(row("session's first run (same work)", opened))
    print(row("warm follow-up (index reused)", warm))
    if restored:
        print(row("restore follow-up (from snapshot)", restored))
    else:
        print("restore follow-up (from snapshot)   not measured: the image has no dill (no snapshot kept)")
    print(f"speed-up of the follow-up over a fresh run: {statistics.median(fresh) / statistics.median(warm):.2f}x")
    held = f"{statistics.median(memory):.1f} MiB" if memory else "unknown"
    print(f"memory held by the idle session's sandbox (docker stats, median): {held}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", nargs="?", choices=["follow-up", "snapshots"], default="follow-up")
    parser.add_argument("--mib", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="1,10,100", help="snapshots: namespace sizes in MiB")
    parser.add_argument("--image", default=None, help="the sandbox image (default: RLM_MCP_SANDBOX_IMAGE's)")
    args = parser.parse_args()
    if args.mode == "snapshots":
        anyio.run(snapshots, [int(x) for x in args.sizes.split(",")], args.image)
    else:
        anyio.run(bench, args.mib, args.delay, args.repeat, args.image)


if __name__ == "__main__":
    main()
