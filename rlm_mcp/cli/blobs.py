"""`rlm-mcp blobs move [--dry-run]`: move a team's context bytes and snapshots from the database's
rows to the bucket of RLM_MCP_BLOB_URL while the team serves (`store/pg/blob_move.py`), with a
progress bar; resumable (run it again after an interruption)."""

from __future__ import annotations

import argparse

from rlm_mcp.config import Settings
from rlm_mcp.errors import RlmMcpError


def _size(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


async def blobs_move(args: argparse.Namespace, settings: Settings) -> int:
    if settings.deployment.embedded:
        raise RlmMcpError("`rlm-mcp blobs move` is for team mode.", "Set RLM_MCP_DATABASE_URL (and RLM_MCP_BLOB_URL).")
    if settings.blobs.location is None:
        raise RlmMcpError(
            "RLM_MCP_BLOB_URL is not set: there is no bucket to move the bytes to.",
            "Set RLM_MCP_BLOB_URL=s3://bucket/prefix and the AWS_* variables (docs/object-storage.md).",
        )
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from rlm_mcp.assembly import make_stores  # here, not at the top: it loads every layer (start-up time)
    from rlm_mcp.store.pg import Database, bucket_of
    from rlm_mcp.store.pg.blob_move import move, plan

    async with make_stores(settings) as stores:
        db, bucket = stores.lifecycle, bucket_of(stores)
        assert isinstance(db, Database) and bucket is not None  # team mode with a bucket, checked above
        todo = await plan(db)
        print(
            f"{todo.contents} content(s), {_size(todo.content_bytes)} in objects (one per holding owner), and "
            f"{todo.snapshots} snapshot(s), {_size(todo.snapshot_bytes)}, are in the database's rows."
        )
        if args.dry_run or not todo.total_bytes:
            print("Nothing moved (--dry-run)." if args.dry_run else "Nothing to move.")
            return 0
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        ) as bar:
            task = bar.add_task(f"to {bucket.where}", total=todo.total_bytes)
            done = await move(db, bucket, lambda n: bar.advance(task, n))
    print(
        f"Moved {done.contents} content(s) and {done.snapshots} snapshot(s) to {bucket.where}. The database gives "
        "the space back only after VACUUM FULL rlm_blob_chunks, rlm_session_snapshots (or pg_repack): see "
        "docs/object-storage.md."
    )
    return 0
