"""Team mode's bytes in the database's rows vs an S3 bucket (run by hand:
`.venv/bin/python bench/blobs.py [--mib 1024]`; starts a private PostgreSQL cluster and a
SeaweedFS server, as the tests do, so it needs PostgreSQL's server binaries and the test group).

For each store, in a fresh process each (so its peak RSS is the step's own): loading a `--mib`
MiB text file into the store (ingest, then the rows or a streamed multipart upload), a second
replica's first fetch of it into its cache (the rows or a streamed get, digest-checked), and the
database's size afterwards. Writes bench/results/blobs.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def _child(step: str, url: str, blob_url: str | None, path: Path, data_dir: Path, context_id: str) -> None:
    from rlm_mcp.owners import Owner
    from rlm_mcp.store.factory import make_stores
    from rlm_mcp.store.pg.contexts import PgContextStore
    from rlm_mcp.testing.settings import make_settings

    settings = make_settings(
        data_dir.parent, data_dir=data_dir, database_url=url, blob_url=blob_url, store_max_bytes=1 << 40
    ).model_copy(update={"max_context_bytes": 1 << 40})
    async with make_stores(settings, replica=True) as stores:
        t0 = time.perf_counter()
        if step == "load":
            info = await stores.contexts.put_file(path, name="big", format="text", source={}, owner=Owner("bench"))
            context_id = info.context_id
        else:
            assert isinstance(stores.contexts, PgContextStore)
            async with stores.contexts.in_use([context_id], owner=Owner("bench")):
                pass
        seconds = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mib": rss_mib, "context_id": context_id}))


def _run(
    step: str, url: str, blob_url: str | None, path: Path, data_dir: Path, context_id: str = ""
) -> dict[str, object]:
    argv = [sys.executable, __file__, "--child", step, "--url", url, "--file", str(path), "--data-dir", str(data_dir)]
    argv += ["--context-id", context_id] + (["--blob-url", blob_url] if blob_url else [])
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=os.environ.copy())
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--child")
    parser.add_argument("--url")
    parser.add_argument("--blob-url")
    parser.add_argument("--file")
    parser.add_argument("--data-dir")
    parser.add_argument("--context-id", default="")
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(args.child, args.url, args.blob_url, Path(args.file), Path(args.data_dir), args.context_id))
        return

    from bench.results_file import ResultFile
    from tests.fixtures_bucket import BUCKET, SeaweedFS
    from tests.fixtures_postgres import Cluster

    cluster, weed = Cluster(), SeaweedFS()
    result = ResultFile(
        "blobs",
        f"A {args.mib} MiB context through team mode's rows and through an S3 bucket",
        [
            "store",
            "load (s)",
            "load peak RSS (MiB)",
            "first fetch on a second replica (s)",
            "fetch peak RSS (MiB)",
            "database size after (MiB)",
        ],
        note="PostgreSQL and SeaweedFS (weed mini) on loopback on the same machine; each step in a fresh process",
    )
    try:
        cluster.start()
        weed.start()
        os.environ.update(weed.env())
        with tempfile.TemporaryDirectory(prefix="rlm-bench-blobs-") as tmp:
            big = Path(tmp) / "big.txt"
            line = b"the quick brown fox jumps over the lazy dog 0123456789\n"
            with open(big, "wb") as fh:
                for _ in range((args.mib << 20) // len(line)):
                    fh.write(line)
            for name, blob_url in (("rows", None), ("bucket", f"s3://{BUCKET}/bench")):
                cluster.sql(f"CREATE DATABASE bench_{name}")
                url = cluster.url(f"bench_{name}")
                loaded = _run("load", url, blob_url, big, Path(tmp) / f"{name}-a")
                fetched = _run("fetch", url, blob_url, big, Path(tmp) / f"{name}-b", str(loaded["context_id"]))
                size = subprocess.run(
                    ["psql", url, "-Atc", "SELECT pg_database_size(current_database())"],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                result.add(
                    name,
                    f"{float(loaded['seconds']):.1f}",  # type: ignore[arg-type]
                    f"{float(loaded['rss_mib']):.0f}",  # type: ignore[arg-type]
                    f"{float(fetched['seconds']):.1f}",  # type: ignore[arg-type]
                    f"{float(fetched['rss_mib']):.0f}",  # type: ignore[arg-type]
                    f"{int(size) / (1 << 20):.0f}",
                )
                print(result.rows[-1], flush=True)
        print(result.write())
    finally:
        weed.close()
        cluster.close()


if __name__ == "__main__":
    main()
