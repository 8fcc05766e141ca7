"""`rlm-mcp webhooks list|redeliver`: the webhook outbox, read by an operator (every owner's
deliveries; the store the settings select). A redelivery keeps the delivery's `webhook-id`, so a
receiver that already has it can tell."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from rlm_mcp.config import Settings
from rlm_mcp.errors import BadArgumentError
from rlm_mcp.owners import EVERY_OWNER

LIST_LIMIT = 200


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


async def webhooks_list(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import make_stores

    async with make_stores(settings) as stores:
        if stores.webhooks is None:
            return 0
        rows = await stores.webhooks.list(EVERY_OWNER, LIST_LIMIT)
    print(f"{'WEBHOOK ID':<30} {'STATE':<9} {'TRIES':>5} {'LAST':>5} {'CREATED (UTC)':<19}  URL / LAST ERROR")
    for d in rows:
        last = str(d.last_status) if d.last_status is not None else "-"
        note = f" ({d.last_error})" if d.last_error and d.state != "delivered" else ""
        print(f"{d.webhook_id:<30} {d.state:<9} {d.attempts:>5} {last:>5} {_when(d.created_at):<19}  {d.url}{note}")
    return 0


async def webhooks_redeliver(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.assembly import make_stores

    async with make_stores(settings) as stores:
        if stores.webhooks is None or not await stores.webhooks.redeliver(args.webhook_id, EVERY_OWNER, time.time()):
            raise BadArgumentError(
                f"No webhook delivery '{args.webhook_id}'.", "`rlm-mcp webhooks list` shows the deliveries kept."
            )
    print(f"{args.webhook_id} is due now: a running server delivers it")
    return 0
