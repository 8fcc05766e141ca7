"""Team mode's bytes in the database's rows vs an S3 bucket (run by hand:
`.venv/bin/python bench/blobs.py [--mib 1024]`; starts a private PostgreSQL cluster and a
SeaweedFS server, as the tests do, so it needs PostgreSQL's server binaries and the test group).

For each store, in a fresh process each (so its peak RSS is the step's own): loading a `--mib`
MiB text file into the store (ingest, then the rows or a streamed multipart upload), a second
replica's first fetch of it into its cache (the rows or a streamed get, digest-checked), and the
database's size afterwards; then `--owners` owners each loading the same `--owner-mib` MiB (one
copy per owner either way: the database's size tells where they went), and a `--snapshot-mib`
MiB session snapshot saved and restored. Writes bench/results/blobs.json.

With `--many N` (and `--many-mib M`) it runs only the other scenario: one owner loads N distinct
M MiB text contexts one after another in one process (total time, peak RSS, the database's size
after), into bench/results/blobs_many.json, so the two scenarios keep their own dates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def _child(
    step: str, url: str, blob_url: str | None, path: Path, data_dir: Path, context_id: str, files: list[Path]
) -> None:
    from rlm_mcp.assembly import make_stores
    from rlm_mcp.owners import Owner
    from rlm_mcp.store.pg.contexts import PgContextStore
    from rlm_mcp.testing.settings import make_settings

    settings = make_settings(
        data_dir.parent, data_dir=data_dir, database_url=url, blob_url=blob_url, store_max_bytes=1 << 40
    ).model_copy(update={"max_context_bytes": 1 << 40})
    async with make_stores(settings, replica=True) as stores:
        t0 = time.perf_counter()
        if step == "owners":
            for i in range(int(context_id)):
                await stores.contexts.put_file(path, name="same", format="text", source={}, owner=Owner(f"owner-{i}"))
        elif step == "snapshot":
            from rlm_mcp.store.pg import Database, bucket_of
            from rlm_mcp.store.pg.sessions import PgSessionStore

            assert isinstance(stores.lifecycle, Database)
            sessions = PgSessionStore(stores.lifecycle, bucket_of(stores))
            await sessions.open("ses_bench", "bench", "run_bench", cap=4, max_age_s=86400)
            t0 = time.perf_counter()
            assert await sessions.save_snapshot("ses_bench", 0, path, owner_cap=1 << 40) is None
            saved = time.perf_counter() - t0
            t0 = time.perf_counter()
            os.makedirs(data_dir, exist_ok=True)
            await sessions.read_snapshot_into("ses_bench", data_dir / "restored.bin")
            context_id = f"{saved:.1f}"
        elif step == "many":
            for i, one in enumerate(files):
                await stores.contexts.put_file(one, name=f"many-{i}", format="text", source={}, owner=Owner("bench"))
            context_id = str(len(files))
        elif step == "load":
            info = await stores.contexts.put_file(path, name="big", format="text", source={}, owner=Owner("bench"))
            context_id = info.context_id
        else:
            assert isinstance(stores.contexts, PgContextStore)
            async with stores.contexts.in_use([context_id], owner=Owner("bench")):
                pass
        seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "rss_mib": _peak_rss_mib(), "context_id": context_id}))


def _peak_rss_mib() -> float:
    """VmHWM, this process's own peak: ru_maxrss would carry the parent's peak across fork and exec."""
    hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(hwm.split()[1]) / 1024


def _run(
    step: str, url: str, blob_url: str | None, path: Path, data_dir: Path, context_id: str = ""
) -> dict[str, object]:
    argv = [sys.executable, __file__, "--child", step, "--url", url, "--file", str(path), "--data-dir", str(data_dir)]
    argv += ["--context-id", context_id] + (["--blob-url", blob_url] if blob_url else [])
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=os.environ.copy())
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _db_mib(url: str) -> str:
    out = subprocess.run(
        ["psql", url, "-Atc", "SELECT pg_database_size(current_database())"], check=True, capture_output=True, text=True
    )
    return f"{int(out.stdout.strip()) / (1 << 20):.0f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--child")
    parser.add_argument("--url")
    parser.add_argument("--blob-url")
    parser.add_argument("--file")
    parser.add_argument("--data-dir")
    parser.add_argument("--context-id", default="")
    parser.add_argument("--owners", type=int, default=20)
    parser.add_argument("--owner-mib", type=int, default=100)
    parser.add_argument("--snapshot-mib", type=int, default=100)
    parser.add_argument("--many", type=int, default=0, help="run only the many-contexts scenario, with this many")
    parser.add_argument("--many-mib", type=int, default=10)
    args = parser.parse_args()
    if args.child:
        path = Path(args.file)
        files = sorted(path.iterdir()) if args.child == "many" else []  # listed before the clock starts
        asyncio.run(_child(args.child, args.url, args.blob_url, path, Path(args.data_dir), args.context_id, files))
        return
    if args.many:
        _many(args.many, args.many_mib)
        return

    from bench.results_file import ResultFile
    from tests.fixtures_bucket import BUCKET, SeaweedFS
    from tests.fixtures_postgres import Cluster

    cluster, weed = Cluster(), SeaweedFS()
    result = ResultFile(
        "blobs",
        f"A {args.mib} MiB context, {args.owners} owners' {args.owner_mib} MiB and a {args.snapshot_mib} MiB snapshot through team mode's rows and through an S3 bucket",
        [
            "store",
            "load (s)",
            "load peak RSS (MiB)",
            "first fetch on a second replica (s)",
            "fetch peak RSS (MiB)",
            "database size after (MiB)",
            f"{args.owners} owners load the same {args.owner_mib} MiB (s)",
            "database size after (MiB)",
            f"{args.snapshot_mib} MiB snapshot save / restore (s)",
            "snapshot peak RSS (MiB)",
        ],
        note="PostgreSQL and SeaweedFS (weed mini) on loopback on the same machine; each step in a fresh process",
    )
    try:
        cluster.start()
        weed.start()
        os.environ.update(weed.env())
        with tempfile.TemporaryDirectory(prefix="rlm-bench-blobs-") as tmp:
            line = b"the quick brown fox jumps over the lazy dog 0123456789\n"
            big, same, snap = Path(tmp) / "big.txt", Path(tmp) / "same.txt", Path(tmp) / "snap.bin"
            for path, mib in ((big, args.mib), (same, args.owner_mib)):
                with open(path, "wb") as fh:
                    for _ in range((mib << 20) // len(line)):
                        fh.write(line)
            snap.write_bytes(os.urandom(args.snapshot_mib << 20))
            for name, blob_url in (("rows", None), ("bucket", f"s3://{BUCKET}/bench")):
                cluster.sql(f"CREATE DATABASE bench_{name}")
                url = cluster.url(f"bench_{name}")
                loaded = _run("load", url, blob_url, big, Path(tmp) / f"{name}-a")
                fetched = _run("fetch", url, blob_url, big, Path(tmp) / f"{name}-b", str(loaded["context_id"]))
                size = _db_mib(url)
                owners = _run("owners", url, blob_url, same, Path(tmp) / f"{name}-o", str(args.owners))
                owners_size = _db_mib(url)
                snapped = _run("snapshot", url, blob_url, snap, Path(tmp) / f"{name}-s")
                result.add(
                    name,
                    f"{float(loaded['seconds']):.1f}",  # type: ignore[arg-type]
                    f"{float(loaded['rss_mib']):.0f}",  # type: ignore[arg-type]
                    f"{float(fetched['seconds']):.1f}",  # type: ignore[arg-type]
                    f"{float(fetched['rss_mib']):.0f}",  # type: ignore[arg-type]
                    size,
                    f"{float(owners['seconds']):.1f}",  # type: ignore[arg-type]
                    owners_size,
                    f"{snapped['context_id']} / {float(snapped['seconds']):.1f}",  # type: ignore[arg-type]
                    f"{float(snapped['rss_mib']):.0f}",  # type: ignore[arg-type]
                )
                print(result.rows[-1], flush=True)
        print(result.write())
    finally:
        weed.close()
        cluster.close()


def _many(count: int, mib: int) -> None:
    from bench.results_file import ResultFile
    from tests.fixtures_bucket import BUCKET, SeaweedFS
    from tests.fixtures_postgres import Cluster

    cluster, weed = Cluster(), SeaweedFS()
    result = ResultFile(
        "blobs_many",
        f"{count} distinct {mib} MiB contexts loaded one after another through team mode's rows and through an S3 bucket",
        [
            "store",
            f"{count} \u00d7 {mib} MiB loaded (s)",
            "per context (s)",
            "peak RSS (MiB)",
            "database size after (MiB)",
        ],
        note="PostgreSQL and SeaweedFS (weed mini) on loopback on the same machine; one owner, one fresh process per store",
    )
    try:
        cluster.start()
        weed.start()
        os.environ.update(weed.env())
        with tempfile.TemporaryDirectory(prefix="rlm-bench-blobs-") as tmp:
            folder = Path(tmp) / "many"
            folder.mkdir()
            line = b"the quick brown fox jumps over the lazy dog 0123456789\n"
            body = line * ((mib << 20) // len(line) - 1)
            for i in range(count):
                # A first line of its own per file: distinct bytes, so no load is a copy of another.
                (folder / f"{i:05d}.txt").write_bytes(f"context {i:05d} of {count}\n".encode() + body)
            for name, blob_url in (("rows", None), ("bucket", f"s3://{BUCKET}/bench")):
                cluster.sql(f"CREATE DATABASE bench_many_{name}")
                url = cluster.url(f"bench_many_{name}")
                loaded = _run("many", url, blob_url, folder, Path(tmp) / f"{name}-m")
                seconds = float(loaded["seconds"])  # type: ignore[arg-type]
                result.add(
                    name,
                    f"{seconds:.1f}",
                    f"{seconds / count:.2f}",
                    f"{float(loaded['rss_mib']):.0f}",  # type: ignore[arg-type]
                    _db_mib(url),
                )
                print(result.rows[-1], flush=True)
        print(result.write())
    finally:
        weed.close()
        cluster.close()


if __name__ == "__main__":
    main()
