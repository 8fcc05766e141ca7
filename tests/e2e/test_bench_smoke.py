"""rlm-mcp's own benchmarks run end to end on small sizes (a smoke: they print their figures;
no timing is ever asserted). The side-by-side with the reference library stays a by-hand run."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import REPO

BENCH = REPO / "bench"


def run_bench(*argv: str) -> str:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_latency_bench_prints_its_ratio() -> None:
    out = run_bench(str(BENCH / "latency.py"), "--delay", "0.02", "--limit", "4", "--repeat", "1")
    assert "ratio wall/ideal" in out


def test_lm_bench_prints_throughput() -> None:
    out = run_bench(str(BENCH / "lm.py"), "--calls", "20")
    assert out.count("LMClient, concurrency") == 3 and out.count("server floor") == 2
    assert out.count("calls/s") == 5 and "server saw 99 chat requests" in out  # 20 + 16 raw, 3 x (20 + 1)


def test_stdio_side_of_the_comparison_runs_every_scenario() -> None:
    out = run_bench(str(BENCH / "compare_reference.py"), "--ours-only", "--reps", "1", "--big-mib", "2", "--gap", "0")
    for row in (
        "one-turn run (1 KiB)",
        "further turn, measured",
        "further turn, derived",
        "sub-call (16-way)",
        "turn at 50 MiB",
    ):
        assert row in out


def test_scale_and_soak_benches_run_over_both_transports() -> None:
    out = run_bench(
        str(BENCH / "scale.py"), "scale", "--transport", "http", "--runs", "2", "--single", "1", "--turns", "2"
    )
    assert "server CPU per turn" in out and "slowest/fastest" in out
    out = run_bench(str(BENCH / "scale.py"), "soak", "--sequential", "2", "--concurrent", "2", "--settle", "0")
    assert "RSS" in out and "slope" in out and "containers 2 -> 2" in out


def test_sandbox_bench_prints_every_figure() -> None:
    out = run_bench(str(BENCH / "sandbox.py"), "--mib", "1", "--calls", "20")
    for row in ("cold start", "warm acquire", "trivial cell", "bridge overhead", "16-way", "1 MiB context load"):
        assert row in out


def test_attach_bench_prints_both_readers_side_by_side() -> None:
    out = run_bench(str(BENCH / "attach.py"), "--reps", "1", "--cells", "5", "--batches", "3")
    for row in ("trivial cell, wall", "trivial cell, CPU", "16-way batch cell, wall", "16-way batch cell, CPU"):
        assert row in out and "loop/thread" in out


def test_prefix_bench_runs_the_whole_trajectory() -> None:
    out = run_bench(str(BENCH / "prefix.py"))
    assert "rlm-mcp run: completed, 30 turns" in out and "append-only ceiling" in out


def test_subcall_cpu_bench_times_the_bridge_alone_on_canned_replies() -> None:
    out = run_bench(str(BENCH / "subcall_cpu.py"), "--canned", "--n", "16", "--reps", "1", "--batches", "2")
    assert "16-way, canned replies, thread CPU per sub-call" in out


def test_subcall_bench_prints_the_floor_beside_each_batch_size() -> None:
    out = run_bench(str(BENCH / "subcall.py"), "--reps", "1", "--batches", "1")
    assert "floor ms/request" in out and "host CPU ms/call" in out
    assert sum(1 for line in out.splitlines() if line.split()[:1] in (["16"], ["200"])) == 2


def test_lm_env_bench_prints_each_variant() -> None:
    out = run_bench(str(BENCH / "lm_env.py"), "--calls", "20", "--reps", "1")
    assert out.count("loop rounds") == 4 and "load average" in out


def test_lm_floor_bench_prints_each_batch_shape_over_its_ideal() -> None:
    out = run_bench(str(BENCH / "lm_floor.py"), "--reps", "1", "--sub-delay", "0.01")
    assert sum(1 for line in out.splitlines() if "wall / ideal" in line) == 2 and "load average" in out


def test_lm_time_bench_prints_wall_over_ideal_for_every_trajectory() -> None:
    out = run_bench(
        str(BENCH / "lm_time.py"),
        *("--reps", "1", "--big-mib", "2", "--gap", "0", "--root-delay", "0.02", "--sub-delay", "0.01"),
    )
    for row in ("one_1k", "ten_1m", "batch_1m", "five_50m", "fan_200", "children_d2"):
        assert any(line.startswith(row + " ") for line in out.splitlines()), row


def test_team_publish_bench_prints_cpu_per_publish() -> None:
    out = run_bench(str(BENCH / "team_publish.py"), "--publishes", "30")
    assert "us CPU per publish" in out and "30 publishes" in out
