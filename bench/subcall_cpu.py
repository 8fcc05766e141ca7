"""Thread CPU per sub-call against the floor's per request, during the batches only: the steadiest
figure of `bench/subcall.py`'s setup on a shared machine.

    .venv/bin/python bench/subcall_cpu.py [--n 200] [--reps 3] [--batches 8] [--profile PREFIX]
    .venv/bin/python bench/subcall_cpu.py --canned [--n 16] [--reps 15] [--batches 50]

Same service, script and floor as bench/subcall.py (a real sandbox, the scripted LM in a
subprocess, bare requests from rlm-mcp's own HTTP pool n at a time), but what is timed is the event loop thread's own
CPU (`time.thread_time`) while a batch is in flight: around each floor batch, and around the
sub-call bridge's handling of each n-prompt batch (the LM client, the bridge, the events, the
accounting; not the sandbox's frames, which another process writes). Wall times on a loaded
2-core machine follow whoever else holds the cores; this follows only what this thread did.

`--profile PREFIX` also writes cProfile data with the thread-CPU clock, enabled only during those
batches (PREFIX.ours, PREFIX.floor; read with `pstats`): a wall-clock sampler on a loaded machine
charges a waiting thread to wherever it stopped, this does not. Profiled times are inflated by the
profiler's cost per call, so read shares, not microseconds. Never fails on a timing.

`--canned`: no sandbox, no server. The sub-call bridge answers `n`-prompt batches in this
process, each request answered by a canned 200 reply one loop turn after it is made (the HTTP
pool's `request` replaced), through the LM client, the usage, the metrics, the `llm_call` and
`sub_calls` events and a run log on disk: the thread CPU of everything between the bridge and
the request, per sub-call (min and median over reps). What the machine's other load does to it is
small next to the full bench's spread, so two trees compare within a few per cent.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.run's service
from bench.run import bench_service
from bench.subcall import SIZES, _load, _quiet, cell_times, floor_batches, script, sub_call_limit
from rlm_mcp.cli.collector import tune_for_serving
from rlm_mcp.engine.bridge import SubCallBridge
from rlm_mcp.lm.http import HttpPool
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides


async def bench(n: int, reps: int, batches: int, profile: str | None) -> None:
    ours_cpu: list[float] = []
    floor_cpu: list[float] = []
    ours_prof = cProfile.Profile(time.thread_time) if profile else None
    floor_prof = cProfile.Profile(time.thread_time) if profile else None
    timing = False  # off during the warm-up
    bridge_call = SubCallBridge.__call__

    async def timed_call(self: SubCallBridge, request: Any) -> list[str]:
        if not timing or len(request.prompts) != n:
            return await bridge_call(self, request)
        if ours_prof:
            ours_prof.enable()
        started = time.thread_time()
        try:
            return await bridge_call(self, request)
        finally:
            ours_cpu.append((time.thread_time() - started) / n)
            if ours_prof:
                ours_prof.disable()

    SubCallBridge.__call__ = timed_call  # type: ignore[method-assign]
    load_before = _load()
    limit = sub_call_limit(max(SIZES), batches)
    async with bench_service(
        script(batches), max_concurrent_lm_calls=max(SIZES), max_sub_calls_per_run=limit
    ) as service:
        url: str = service.lm.settings.base_url
        local = Caller(service, LOCAL_OWNER)
        context = await local.load_context(text="hello " * 1000)

        async def ours() -> None:
            await anyio.sleep(1.5)  # the warm pool refills only while no sandbox is in use
            result = await local.complete(f"batch of {n}: go", context.context_id, RunOverrides(), _quiet)
            assert result.status == "completed", result
            cell_times(result.answer)  # every sub-call answered

        pool = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=False)  # as a loopback endpoint's
        try:
            await floor_batches(url, n, 1, pool)  # warm-up: connections, model, pool
            await ours()
            timing = True
            for _ in range(reps):
                for _ in range(batches):
                    if floor_prof:
                        floor_prof.enable()
                    started = time.thread_time()
                    await floor_batches(url, n, 1, pool)
                    floor_cpu.append((time.thread_time() - started) / n)
                    if floor_prof:
                        floor_prof.disable()
                await ours()
        finally:
            await pool.aclose()
    floor, mine = statistics.median(floor_cpu) * 1e6, statistics.median(ours_cpu) * 1e6
    print(
        f"{n}-way, thread CPU during the batches: floor {floor:.0f} µs per request, rlm-mcp {mine:.0f} µs "
        f"per sub-call, {mine / floor:.2f}x (medians of {len(floor_cpu)} and {len(ours_cpu)} batches); "
        f"load average {load_before} at the start, {_load()} at the end"
    )
    if ours_prof and floor_prof:
        ours_prof.dump_stats(f"{profile}.ours")
        floor_prof.dump_stats(f"{profile}.floor")
        print(f"profiles: {profile}.ours, {profile}.floor")


_CANNED = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"rlm-v0.1","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}'
)


async def canned(n: int, reps: int, batches: int) -> None:
    """Thread CPU per sub-call of the bridge's and the LM client's own work (see `--canned`)."""
    import tempfile

    from multidict import CIMultiDict, CIMultiDictProxy

    from rlm_mcp.engine.tree import RunTree
    from rlm_mcp.engine.turn import RunContext
    from rlm_mcp.engine.types import RunProgress
    from rlm_mcp.lm.client import LMClient
    from rlm_mcp.lm.http import HttpReply
    from rlm_mcp.ports import LMRequest
    from rlm_mcp.ports.run_values import RunLimits
    from rlm_mcp.store.runs import RunLog
    from rlm_mcp.testing.settings import make_settings

    headers = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"}))

    async def answer(self: HttpPool, method: str, url: str, **_: Any) -> HttpReply:
        await anyio.lowlevel.checkpoint()  # the reply comes a loop turn later, as a socket's would
        return HttpReply(url, 200, headers, _CANNED)

    HttpPool.request = answer  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        settings = make_settings(
            folder, base_url="http://127.0.0.1:9/v1", model="rlm-v0.1", max_model_len=65536, max_concurrent_lm_calls=n
        )
        log = RunLog(folder, created_at=time.time(), max_event_bytes=1 << 20, max_log_bytes=1 << 40)
        await log.open()
        limits = RunLimits(max_iterations=10, max_depth=1, timeout_s=1e6, token_budget=None, max_errors=3)
        progress = RunProgress(run_id="run-1", max_iterations=10)
        tree = RunTree(
            progress=progress,
            limits=limits,
            deadline=anyio.current_time() + 1e6,
            sink=log.append,
            call_sink=log.append_call,  # as the service's run takes each LM call's event
            max_sub_calls=1 << 40,
            max_prompts_per_batch=1 << 20,
            max_concurrent_children=4,
        )
        tree.open_cells["run-1"] = (1, 0)  # as in a cell: the events name it
        request = LMRequest(kind="llm", prompts=[f"q0 {i}" for i in range(n)], model=None)
        per_call: list[float] = []
        async with LMClient(settings.lm) as lm:
            ctx = RunContext(
                settings=settings.engine, lm=lm, tree=tree, depth=0, run_id="run-1", progress=progress, limits=limits
            )

            async def no_child(prompt: str, depth: int) -> str:
                return ""

            bridge = SubCallBridge(ctx, run_child=no_child)
            for _ in range(20):  # warm-up: the pool, the model's window, the metrics' series
                await bridge(request)
            for _ in range(reps):
                started = time.thread_time()
                for _ in range(batches):
                    answers = await bridge(request)
                per_call.append((time.thread_time() - started) / (batches * n))
            assert answers == ["ok"] * n, answers[:3]
        await log.aclose()
    print(
        f"{n}-way, canned replies, thread CPU per sub-call: min {min(per_call) * 1e6:.1f} µs, median "
        f"{statistics.median(per_call) * 1e6:.1f} µs ({reps} reps of {batches} batches); load average {_load()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, choices=SIZES)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--profile", metavar="PREFIX", help="also write thread-CPU cProfile data")
    parser.add_argument(
        "--canned", action="store_true", help="no sandbox or server: the bridge and the LM client alone (see above)"
    )
    args = parser.parse_args()
    tune_for_serving()  # as bench/subcall.py does: this process stands for a server
    if args.canned:
        anyio.run(canned, args.n, args.reps, args.batches)
    else:
        anyio.run(bench, args.n, args.reps, args.batches, args.profile)


if __name__ == "__main__":
    main()
