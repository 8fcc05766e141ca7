"""`rlm-mcp contexts list|delete` and `runs list|show|export|html|view`: what the stores hold,
read by an operator (every owner's records; the store the settings select)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from rlm_mcp.config import Settings
from rlm_mcp.owners import EVERY_OWNER

if TYPE_CHECKING:
    from rlm_mcp.events import LoggedEvent
    from rlm_mcp.ports.runs import RunRecord


async def contexts_list(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import make_stores
    from rlm_mcp.cli.run import contexts_table

    async with make_stores(settings) as stores:
        for line in contexts_table(await stores.contexts.list(owner=EVERY_OWNER)):  # every owner's
            print(line)
    return 0


async def contexts_delete(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import make_stores

    async with make_stores(settings) as stores:
        await stores.contexts.get(args.context_id, owner=EVERY_OWNER)
        await stores.contexts.delete(args.context_id, owner=EVERY_OWNER)
    print(f"deleted {args.context_id}")
    return 0


async def runs_list(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import make_stores
    from rlm_mcp.cli.run import runs_table

    async with make_stores(settings) as stores:
        for line in runs_table(await stores.runs.list(owner=EVERY_OWNER)):
            print(line)
    return 0


async def runs_show(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import make_stores

    async with make_stores(settings) as stores:
        record = await stores.runs.read_summary(args.run_id, owner=EVERY_OWNER)
    print(json.dumps(record.to_stored(), indent=2))
    return 0


async def runs_view(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import make_stores
    from rlm_mcp.viewer.local import view

    return await view(
        make_stores(settings),
        args.run_id,
        url=args.url,
        output=args.output,
        open_browser=not args.no_open,
        max_records=settings.runs.run_max_records,
        auth_token=settings.server.auth_token,
    )


async def _run_record(settings: Settings, run_id: str) -> tuple[RunRecord, list[LoggedEvent]]:
    """The operator's view of one run: its record and events, from whichever store is set."""
    from rlm_mcp.assembly import make_stores

    async with make_stores(settings) as stores:
        record = await stores.runs.read_summary(run_id, owner=EVERY_OWNER)
        return record, await stores.runs.read_events(run_id, owner=EVERY_OWNER)


async def runs_html(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli.run import write_page
    from rlm_mcp.viewer import render_run_html

    summary, events = await _run_record(settings, args.run_id)
    written = await write_page(render_run_html(summary, events), args.run_id, args.output)
    if written is not None:
        print(f"wrote {written}")
    return 0


async def runs_export(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.events import to_json
    from rlm_mcp.viewer.export import chat_jsonl

    run_ids = [args.run_id]
    if args.run_id.startswith("ses_"):  # a kept session: every run of it, in the order they ran
        run_ids = await _session_runs(settings, args.run_id)
        if not run_ids:
            print(f"No run records of session {args.run_id}. List runs with `rlm-mcp runs list`.", file=sys.stderr)
            return 1
    for run_id in run_ids:
        summary, events = await _run_record(settings, run_id)
        if args.format == "chat":
            sys.stdout.write(chat_jsonl(summary, events))
            continue
        for event in events:
            print(json.dumps(to_json(event), default=str))
    return 0


async def _session_runs(settings: Settings, session_id: str) -> list[str]:
    """The runs of a kept session, oldest first (their records carry the session id)."""
    from rlm_mcp.assembly import make_stores

    async with make_stores(settings) as stores:
        records = await stores.runs.list(settings.runs.run_max_records, owner=EVERY_OWNER)
    mine = [r for r in records if r.request.session_id == session_id]
    return [r.run_id for r in sorted(mine, key=lambda r: r.created_at)]
