"""Team mode benchmark (run by hand: `.venv/bin/python bench/team.py`). Needs PostgreSQL's
server binaries (Debian's `postgresql`) unless `--url` names a running database.

Measures one context of `--mib` MiB stored through replica A into the database (ingest: hash,
UTF-8 check, then 1 MiB bytea rows) and fetched out to replica B, which has never seen it (its
cache is cold), plus a second use on B (cache hit). Prints the throughput of each step and the
process's peak RSS growth, which stays near a chunk: no step holds the whole context.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlm_mcp.assembly import make_stores
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.testing.settings import make_settings


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def bench(url: str, mib: int, tmp: Path) -> None:
    source = tmp / "context.txt"
    line = b"a line of a large text context, with some words in it \n"

    def write_source() -> None:  # in pieces: the bench's own memory must not hide the store's
        with open(source, "wb") as fh:
            for _ in range(mib):
                fh.write(line * ((1 << 20) // len(line)))

    await anyio.to_thread.run_sync(write_source)
    size = source.stat().st_size
    a_settings = make_settings(tmp, data_dir=tmp / "a", database_url=url, store_max_bytes=8 * size)
    b_settings = make_settings(tmp, data_dir=tmp / "b", database_url=url, store_max_bytes=8 * size)
    async with make_stores(a_settings, replica=True) as a, make_stores(b_settings, replica=True) as b:
        rss0 = _rss_mib()
        t0 = time.perf_counter()
        info = await a.contexts.put_file(source, name="bench", format="text", source={}, owner=LOCAL_OWNER)
        t_in = time.perf_counter() - t0
        rss_in = _rss_mib()
        t0 = time.perf_counter()
        async with b.contexts.in_use([info.context_id], owner=LOCAL_OWNER):
            t_out = time.perf_counter() - t0
        rss_out = _rss_mib()
        t0 = time.perf_counter()
        async with b.contexts.in_use([info.context_id], owner=LOCAL_OWNER):
            t_hit = time.perf_counter() - t0
        await a.contexts.delete(info.context_id, owner=LOCAL_OWNER)
    mb = size / (1 << 20)
    print(f"context: {mb:.1f} MiB")
    print(f"into the database via replica A: {t_in:.2f} s ({mb / t_in:.0f} MiB/s)")
    print(f"out to cold replica B:           {t_out:.2f} s ({mb / t_out:.0f} MiB/s)")
    print(f"second use on B (cache hit):     {t_hit * 1000:.1f} ms")
    print(f"peak RSS growth: {rss_in - rss0:.0f} MiB storing, {rss_out - rss_in:.0f} MiB fetching")
    gib = 1024 / mb
    print(f"1 GiB, extrapolated: ~{t_in * gib:.0f} s in, ~{t_out * gib:.0f} s out (linear in size)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="postgresql:// URL of a database to use (default: a private cluster)")
    parser.add_argument("--mib", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            anyio.run(bench, args.url, args.mib, Path(tmp))
            return
        from tests.fixtures_postgres import Cluster

        cluster = Cluster()
        try:
            cluster.start()
            cluster.sql("CREATE DATABASE bench")
            anyio.run(bench, cluster.url("bench"), args.mib, Path(tmp))
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
