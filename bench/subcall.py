"""Per sub-call against the floor, in one run: what a sub-call costs rlm-mcp beyond what the
scripted server itself costs, on this machine at this moment.

    .venv/bin/python bench/subcall.py [--reps 5] [--batches 4] [--record] [--sizes 1,2,4,8,16,32] [--pin-lm]

The floor: bare chat-completion requests sent with rlm-mcp's own HTTP pool (lm/http.py, the one
its LM client uses: plain http through lm/plain_http.py to this loopback server) straight to the
zero-latency scripted server in a subprocess, `n` at a time on a pool of keep-alive connections,
timed per batch; the floor per request is a batch's wall / n.

rlm-mcp: one run per rep (real Docker sandbox, warm pool, run log written, in-process service)
whose one cell times `llm_query_batched` of `n` prompts inside the sandbox, `--batches` times:
the frame out, the gate and the bridge, the LM client, the scripted server, the frame back. Per
sub-call = a batch's wall / n. Both at n = 16 and n = 200 (the service's LM concurrency limit is
raised to n, so both sides keep n requests in flight).

The floor moves with the machine's load, so floor and rlm-mcp blocks alternate and the ratio
is taken per rep (median of rlm-mcp's batches / median of the floor's batches in the same rep).
Each block starts after the same 1.5 s pause (the previous run's sandbox removed, the pool
refilled), so neither side shares its CPUs with Docker's daemons.
Prints medians with min/max across reps, the CPU ratio (rlm-mcp's whole process per sub-call over
the floor's client per request) and the load average at the start and the end; `--record` writes
bench/results/subcall.json. `--sizes` measures other batch sizes (`--record` refuses them: the
file is the 16/200 table) and, with three sizes or more, fits a batch's wall time as
fixed + n x per call on each side (least squares over the per-rep medians): what a batch costs
once and what each of its calls costs. The process sets the garbage collector as `rlm-mcp serve` does
(rlm_mcp/cli/collector.py), for both sides: they share it. Never fails on a timing.

`--pin-lm` (Linux, two CPUs or more; `--record` then writes bench/results/subcall_pinned.json): the scripted LM runs on the last
CPU and this process's event-loop thread on the others, for both sides. On a 2-vCPU machine the
kernel wakes the scripted LM on the CPU of the loop that wrote to it, which is still busy with
the rest of the batch, so the two take turns on one CPU while the other idles; pinned, they run
side by side, as a real model server on a machine of its own does
(bench/results/subcall-batch-2026-11-30.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.run's service
from bench.results_file import ResultFile
from bench.run import DEFAULT_SUB_CALL_LIMIT, bench_service
from rlm_mcp.cli.collector import tune_for_serving
from rlm_mcp.lm.http import HttpPool
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.service.caller import Caller
from rlm_mcp.service.limits import RunOverrides

SIZES = (16, 200)


SUB_ANSWER = "ok"  # the scripted server's answer to every sub-call (`script`, `many_and_one`), checked by `cell`


def cell(n: int, batches: int) -> str:
    """A root reply whose cell times `batches` batched calls of n prompts and answers the times,
    or, at the first batch with an answer other than the scripted one (a refused or failed
    sub-call, answered at once: its time would be no sub-call's), why not (`cell_times`)."""
    return (
        "```repl\nimport json, time\ntimes = []\n"
        f"for b in range({batches}):\n"
        "    t = time.perf_counter()\n"
        f'    r = llm_query_batched(["q%d %d" % (b, i) for i in range({n})])\n'
        "    times.append(time.perf_counter() - t)\n"
        f"    bad = [a for a in r if a != {SUB_ANSWER!r}]\n"
        f"    if bad or len(r) != {n}:\n"
        f'        times = "batch %d: %d of %d answers not {SUB_ANSWER!r}, the first: %r" % (b, len(bad), len(r), bad[:1])\n'
        "        break\n"
        'answer["content"] = json.dumps(times)\nanswer["ready"] = True\n```'
    )


def cell_times(answer: object) -> list[float]:
    """The seconds of each batch that `cell`'s run answered; exits with the cell's reason when a
    batch had an answer that was not the scripted one."""
    times = json.loads(str(answer))
    if isinstance(times, str):
        raise SystemExit(f"the bench's cell: {times} (a sub-call refused or failed: its answer says why)")
    return [float(t) for t in times]


def sub_call_limit(n: int, batches: int) -> int:
    """`RLM_MCP_MAX_SUB_CALLS_PER_RUN` for a run of `batches` batches of n: the setting's default
    unless the run sends more (at the default, 2,000, an eleventh 200-way batch is refused)."""
    return max(DEFAULT_SUB_CALL_LIMIT, n * batches)


def many_and_one(n: int, batches: int) -> dict[str, object]:
    """The scripted LM of the benches that run two cells alternately (`bench/subcall_parts.py`,
    `bench/subcall_procs.py`): "many:" times `batches` batches of n, "one:" a single batch."""
    return {
        "root_by_query": [
            {"match": "many:", "replies": [cell(n, batches)]},
            {"match": "one:", "replies": [cell(n, 1)]},
        ],
        "sub_default": SUB_ANSWER,
        "max_model_len": 65536,
    }


def script(batches: int, sizes: tuple[int, ...] = SIZES) -> dict[str, object]:
    return {
        "root_by_query": [{"match": f"batch of {n}:", "replies": [cell(n, batches)]} for n in sizes],
        "sub_default": SUB_ANSWER,
        "max_model_len": 65536,
    }


async def floor_batches(url: str, n: int, batches: int, pool: HttpPool) -> tuple[list[float], float]:
    """Seconds per request of `batches` rounds of n bare requests in flight at once, and this
    process's CPU seconds per request."""
    body = json.dumps(
        {"model": "rlm-v0.1", "messages": [{"role": "user", "content": "q0 0"}], "max_tokens": 4096}
    ).encode()

    async def one() -> None:
        reply = await pool.request("POST", f"{url}/chat/completions", json_body=body)
        assert reply.status_code == 200, reply.status_code

    out = []
    cpu0 = time.process_time()
    for _ in range(batches):
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)
        out.append((time.perf_counter() - started) / n)
    return out, (time.process_time() - cpu0) / (n * batches)


async def bench(reps: int, batches: int, record: bool, sizes: tuple[int, ...] = SIZES, pin_lm: bool = False) -> None:
    loads = [_load()]
    per_rep: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}  # (floor, ours) per rep
    cpu: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}  # CPU of this process, same
    limit = sub_call_limit(max(sizes), batches)
    async with bench_service(
        script(batches, sizes), max_concurrent_lm_calls=max(sizes), max_sub_calls_per_run=limit
    ) as service:
        url: str = service.lm.settings.base_url
        if pin_lm:
            _pin_scripted_lm()
        local = Caller(service, LOCAL_OWNER)
        context = await local.load_context(text="hello " * 1000)

        async def ours(n: int) -> tuple[list[float], float]:
            """Seconds per sub-call of the cell's batches, and this process's CPU seconds per
            sub-call over the whole run (its one root call and cell included: a bound)."""
            await anyio.sleep(1.5)  # the warm pool refills only while no sandbox is in use
            cpu0 = time.process_time()
            result = await local.complete(f"batch of {n}: go", context.context_id, RunOverrides(), _quiet)
            cpu = time.process_time() - cpu0
            assert result.status == "completed", result
            return [t / n for t in cell_times(result.answer)], cpu / (n * batches)

        pool = HttpPool(headers={}, timeout_s=600, connect_s=10, trust_env=False)  # as a loopback endpoint's
        try:
            for n in sizes:  # warm-up: connections opened, model discovered, pool filled
                await floor_batches(url, n, 1, pool)
                await ours(n)
            for rep in range(reps):
                for n in sizes:
                    # The same pause as rlm-mcp's runs get: the previous run's sandbox is removed and
                    # the warm pool refilled in it, so Docker's daemons do not share the floor's CPUs
                    # (bench/results/subcall-16-2026-11-30.md, section 2).
                    await anyio.sleep(1.5)
                    floor, floor_cpu = await floor_batches(url, n, batches, pool)
                    mine, mine_cpu = await ours(n)
                    per_rep[n].append((statistics.median(floor), statistics.median(mine)))
                    cpu[n].append((floor_cpu, mine_cpu))
                print(f"rep {rep + 1}/{reps} done", file=sys.stderr)
        finally:
            await pool.aclose()
    load = f"load average {loads[0]} at the start, {_load()} at the end"
    pinned = "; the scripted LM on a CPU of its own, the event loop on the other" if pin_lm else ""
    out = ResultFile(
        "subcall_pinned" if pin_lm else "subcall",
        "Per sub-call against the floor (bare requests from rlm-mcp's HTTP pool to the same scripted server, same run"
        + pinned
        + ")",
        ["batch", "floor per request", "rlm-mcp per sub-call", "rlm-mcp / floor", "host CPU per call: floor, rlm-mcp"],
        note=f"{reps} reps of {batches} batches, floor and rlm-mcp alternating; median [min, max] across reps; {load}",
    )
    print(f"\n{'batch':<8}{'floor ms/request':<26}{'rlm-mcp ms/sub-call':<26}{'ratio (per rep)':<24}host CPU ms/call")
    for n in sizes:
        floors = [f * 1000 for f, _ in per_rep[n]]
        mine = [m * 1000 for _, m in per_rep[n]]
        ratios = [m / f for f, m in per_rep[n]]
        cells = [f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]" for v in (floors, mine, ratios)]
        floor_cpu = statistics.median(f * 1000 for f, _ in cpu[n])
        mine_cpu = statistics.median(m * 1000 for _, m in cpu[n])
        host = f"{floor_cpu:.2f}, {mine_cpu:.2f} ms"
        print(f"{n:<8}{cells[0] + ' ms':<26}{cells[1] + ' ms':<26}{cells[2]:<24}{host} ({mine_cpu / floor_cpu:.2f}x)")
        out.add(f"{n}-way", cells[0] + " ms", cells[1] + " ms", cells[2] + "×", host)
    print(load)
    if len(sizes) >= 3:
        for side, pick in (("floor", 0), ("rlm-mcp", 1)):
            fixed, per_call = fit_batches({n: [p[pick] for p in per_rep[n]] for n in sizes})
            print(f"fit, {side:<8} a batch of n = {fixed * 1000:.2f} ms + n x {per_call * 1000:.3f} ms")
    if record:
        print(f"written: {out.write()}")


def fit_batches(per_call: dict[int, list[float]]) -> tuple[float, float]:
    """Least squares of a batch's wall (n x the per-call medians of each rep) on n: the seconds a
    batch costs once and the seconds each call in it costs."""
    points = [(n, n * value) for n, values in per_call.items() for value in values]
    mean_n = statistics.fmean(n for n, _ in points)
    mean_w = statistics.fmean(w for _, w in points)
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    slope = sum((n - mean_n) * (w - mean_w) for n, w in points) / spread
    return mean_w - slope * mean_n, slope


def _pin_scripted_lm() -> None:
    """The scripted LM (this process's child) on the last CPU, this thread (the event loop) on the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin-lm needs two CPUs or more")
    children: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        children += [int(pid) for pid in (task / "children").read_text().split()]
    lm = [pid for pid in children if b"rlm_mcp.testing.scripted_lm" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    if len(lm) != 1:
        raise SystemExit(f"--pin-lm: found {len(lm)} scripted LM processes, not 1")
    os.sched_setaffinity(lm[0], {cpus[-1]})
    os.sched_setaffinity(0, set(cpus[:-1]))
    print(f"scripted LM (pid {lm[0]}) on CPU {cpus[-1]}, the event loop on {cpus[:-1]}", file=sys.stderr)


def batch_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every per-batch profile of the sub-call path takes: the batch's width, batches
    a run, runs of each cell (bench/subcall_parts.py, bench/subcall_procs.py)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--n", type=int, default=16, help="sub-calls a batch")
    parser.add_argument("--batches", type=int, default=8, help="batches a run")
    parser.add_argument("--reps", type=int, default=4, help="runs of each cell")
    return parser


def _load() -> str:
    """The 1-minute load average: the floor moves with it, so it is printed beside the figures."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


async def _quiet(progress: float, total: float | None, message: str) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--record", action="store_true", help="write bench/results/subcall.json")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="batch sizes, comma-separated (three or more: a fit)"
    )
    parser.add_argument(
        "--pin-lm", action="store_true", help="the scripted LM on a CPU of its own, the event loop on the others"
    )
    args = parser.parse_args()
    sizes = tuple(int(n) for n in args.sizes.split(","))
    if args.record and sizes != SIZES:
        parser.error(f"--record writes the {SIZES} table; leave --sizes out")
    tune_for_serving()  # as `rlm-mcp serve` does before serving: this process stands for a server
    anyio.run(bench, args.reps, args.batches, args.record, sizes, args.pin_lm)


if __name__ == "__main__":
    main()
