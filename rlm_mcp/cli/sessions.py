"""`rlm-mcp sessions list|close`: the kept sessions stored in the data dir (service/session_files.py);
in team mode (RLM_MCP_DATABASE_URL), the CLI's own sessions in the team database."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING

import anyio

from rlm_mcp.config import Settings, TeamDatabase
from rlm_mcp.errors import NotFoundError
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER
from rlm_mcp.service.views import session_usage
from rlm_mcp.usage import Usage
from rlm_mcp.visible import visible_line

if TYPE_CHECKING:
    from rlm_mcp.service.team_sessions import TeamSessions


@asynccontextmanager
async def _team_sessions(settings: Settings, database: TeamDatabase) -> AsyncIterator[TeamSessions]:
    # The assembly loads every layer: imported when a command runs, not by `--help` (start-up time).
    from rlm_mcp.assembly import team_sessions
    from rlm_mcp.store.factory import team_stores

    async with team_stores(settings.store, database, replica=False, blobs=settings.blobs) as stores:
        yield team_sessions(settings, stores)


async def _team_list(settings: Settings, database: TeamDatabase) -> int:
    async with _team_sessions(settings, database) as team:
        listed = await team.list(owner=LOCAL_OWNER)
    if not listed:
        print("No kept sessions open. Keep one with `rlm-mcp run --keep-session ...`.")
    for s in listed:
        started = datetime.fromtimestamp(float(s.created_at or 0)).strftime("%Y-%m-%d %H:%M:%S")
        runs, contexts = len(s.runs), s.contexts_bound
        snapshot = f"{s.snapshot_bytes:,} bytes" if s.snapshot_bytes is not None else "no snapshot yet"
        print(visible_line(f"{s.session_id}  {started}  {runs} runs  {contexts} contexts  {snapshot}"))
    return 0


async def _team_close(settings: Settings, database: TeamDatabase, session_id: str) -> int:
    async with _team_sessions(settings, database) as team:
        await team.close(session_id, owner=LOCAL_OWNER)
    print(f"closed {session_id}")
    return 0


async def sessions_list(args: argparse.Namespace, settings: Settings) -> int:
    if (database := settings.deployment.database) is not None:
        return await _team_list(settings, database)
    # The stores and the assembly load when the command runs, not with the parser (start-up time).
    from rlm_mcp.assembly import make_stores
    from rlm_mcp.service import session_files

    records = await anyio.to_thread.run_sync(session_files.peek, settings.store.data_dir)
    if not records:
        print("No kept sessions stored. Keep one with `rlm-mcp run --keep-session ...`.")
        return 0
    async with make_stores(settings) as stores:
        for r in sorted(records, key=lambda r: float(r.get("created_at") or 0)):
            started = datetime.fromtimestamp(float(r.get("created_at") or 0)).strftime("%Y-%m-%d %H:%M:%S")
            run_ids, contexts = list(r.get("run_ids") or []), len(r.get("bound_context_ids") or [])
            used = await session_usage(run_ids, lambda i: stores.runs.read_summary(i, owner=EVERY_OWNER))
            line = (
                f"{r['session_id']}  {started}  {len(run_ids)} runs  {contexts} contexts  {r['snapshot_bytes']:,} bytes"
            )
            print(visible_line(f"{line}  {_usage_text(used)}"))
    return 0


def _usage_text(usage: Usage) -> str:
    """The tokens its runs used, and their cost where the price table (RLM_MCP_MODEL_PRICES) has one."""
    total = usage.total
    text = f"{total.prompt_tokens:,}+{total.completion_tokens:,} tokens"
    if total.cached_prompt_tokens:
        text += f" ({total.cached_prompt_tokens:,} cached)"
    return text + (f"  ${total.cost_usd:.4f}" if total.cost_usd is not None else "")


async def sessions_close(args: argparse.Namespace, settings: Settings) -> int:
    session_id = args.session_id
    if (database := settings.deployment.database) is not None:
        return await _team_close(settings, database, session_id)
    from rlm_mcp.service import session_files  # (start-up time: see sessions_list)

    if not await anyio.to_thread.run_sync(session_files.close, settings.store.data_dir, session_id, str(LOCAL_OWNER)):
        raise NotFoundError(f"No stored session '{session_id}'.", "List them with `rlm-mcp sessions list`.")
    print(f"closed {session_id}")
    return 0
