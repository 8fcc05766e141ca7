"""Does a load's speed tell one token that another stored the same bytes? (run by hand:
`.venv/bin/python bench/team_dedupe.py`; needs PostgreSQL's server binaries unless `--url`
names a running database.)

Before round four, team mode kept one copy of each content, and a load of bytes another owner
had stored skipped writing the chunk rows: 2.5-3.4x faster than a load of new bytes, a
confirmation-of-file oracle. Now each owner holding a content has its own copy of the rows
(`rlm_mcp/store/pg/blobs.py`); only the owner's own bytes are deduplicated. For `--rounds` fresh
contents of `--mib` MiB (stored beforehand by owner C) this times, through one replica: owner A
loading new bytes, owner B loading C's bytes, in random order per round, then B loading them
again (its own copy, the one case still skipped). Each load starts after `sync`, so no load pays
for the write-back of the one before. It prints the medians and the ratio new / another owner's
(about 1 when nothing leaks).

Figures (2 vCPU VM shared with other builds at load 8-12, PostgreSQL 15 on loopback, 16 MiB,
9 rounds; medians of one run each):

    before (one copy per content):  new 241 ms, another owner's 71 ms, own 63 ms: 3.42x
    after (one copy per holder):    new 254 ms, another owner's 236 ms, own 116 ms: 1.08x
                                    new 626 ms, another owner's 646 ms, own 164 ms: 0.97x
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlm_mcp.assembly import make_stores
from rlm_mcp.owners import Owner
from rlm_mcp.testing.settings import make_settings

A, B, C = Owner("token-bench-a"), Owner("token-bench-b"), Owner("token-bench-c")


async def bench(url: str, mib: int, rounds: int, tmp: Path) -> None:
    settings = make_settings(tmp, data_dir=tmp / "replica", database_url=url, store_max_bytes=1 << 40)
    times: dict[str, list[float]] = {"new bytes": [], "another owner's bytes": [], "the owner's own bytes": []}
    async with make_stores(settings, replica=True) as stores:

        async def load(data: bytes, owner: Owner, name: str) -> float:
            # Each load starts with no dirty pages: else a temp file's write-back throttling, set
            # by whatever the previous load left (a new cache file, or one replaced), decides.
            await anyio.to_thread.run_sync(os.sync)
            t0 = time.perf_counter()
            await stores.contexts.put_bytes(data, name=name, format="text", source={}, owner=owner)
            return time.perf_counter() - t0

        await load(secrets.token_hex(1 << 19).encode(), A, "warm-up")
        held = [secrets.token_hex(mib << 19).encode() for _ in range(rounds)]
        for i, data in enumerate(held):  # stored by owner C beforehand
            await load(data, C, f"c{i}")
        for i, data in enumerate(held):
            fresh = secrets.token_hex(mib << 19).encode()
            steps = [("new bytes", fresh, A), ("another owner's bytes", data, B)]
            random.shuffle(steps)  # neither kind always goes first
            for key, payload, owner in steps:
                times[key].append(await load(payload, owner, f"{key} {i}"))
            times["the owner's own bytes"].append(await load(data, B, f"b{i} again"))
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"{rounds} rounds of {mib} MiB, median load time:")
    for key, value in medians.items():
        print(f"  {key:<24} {value * 1000:8.1f} ms")
    ratio = medians["new bytes"] / medians["another owner's bytes"]
    print(f"new / another owner's: {ratio:.2f}x (about 1: the speed does not tell)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="postgresql:// URL of a database to use (default: a private cluster)")
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            anyio.run(bench, args.url, args.mib, args.rounds, Path(tmp))
            return
        from tests.fixtures_postgres import Cluster

        cluster = Cluster()
        try:
            cluster.start()
            cluster.sql("CREATE DATABASE bench")
            anyio.run(bench, cluster.url("bench"), args.mib, args.rounds, Path(tmp))
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
