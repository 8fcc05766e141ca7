"""`rlm-mcp sessions list|close`: the kept sessions stored in the data dir (service/session_files.py)."""

from __future__ import annotations

import argparse
from datetime import datetime

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.errors import NotFoundError
from rlm_mcp.service import session_files
from rlm_mcp.visible import visible_line


async def sessions_list(args: argparse.Namespace, settings: Settings) -> int:
    records = await anyio.to_thread.run_sync(session_files.peek, settings.data_dir)
    if not records:
        print("No kept sessions stored. Keep one with `rlm-mcp run --keep-session ...`.")
    for r in sorted(records, key=lambda r: float(r.get("created_at") or 0)):
        started = datetime.fromtimestamp(float(r.get("created_at") or 0)).strftime("%Y-%m-%d %H:%M:%S")
        runs, contexts = len(r.get("run_ids") or []), len(r.get("bound_context_ids") or [])
        line = f"{r['session_id']}  {started}  {runs} runs  {contexts} contexts  {r['snapshot_bytes']:,} bytes"
        print(visible_line(line))
    return 0


async def sessions_close(args: argparse.Namespace, settings: Settings) -> int:
    session_id = args.session_id
    if not await anyio.to_thread.run_sync(session_files.discard, settings.data_dir, session_id):
        raise NotFoundError(f"No stored session '{session_id}'.", "List them with `rlm-mcp sessions list`.")
    print(f"closed {session_id}")
    return 0
