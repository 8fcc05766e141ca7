"""Webhooks: a run's end delivered to the callback URL its request named (docs/events-and-webhooks.md).

- `Webhooks.check`: a request's `webhook_url`, against its owner's allow-list (`targets.py`);
- `Webhooks.on_run_end`: the run-end hook's subscriber; writes the outbox row (one per run end,
  `webhook-id` `msg_<run_id>`, the same on every retry), a thin body by default;
- `Webhooks` as a context manager runs this process's deliverer (`deliverer.py`) while the
  service runs: every process with the outbox delivers, so a run's end reaches its callback
  even when the front that accepted the run is gone.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType

import anyio
from anyio.abc import TaskGroup

from rlm_mcp.access import WebhookGrant
from rlm_mcp.config import EventSettings
from rlm_mcp.owners import OwnerScope
from rlm_mcp.ports.runs import RunEnded
from rlm_mcp.ports.webhooks import Delivery, WebhookOutboxPort
from rlm_mcp.service.loaders.addresses import AddressPolicy
from rlm_mcp.service.webhooks.deliverer import Deliverer
from rlm_mcp.service.webhooks.targets import check_callback

log = logging.getLogger("rlm_mcp.webhooks")

__all__ = ["EVENT_TYPE", "Webhooks", "webhook_body", "webhook_id"]

EVENT_TYPE = "run.ended"


def webhook_id(run_id: str) -> str:
    """A run end's one `webhook-id`: derived from the run, so every writer and retry agrees."""
    return f"msg_{run_id}"


def webhook_body(ended: RunEnded, now: float, max_bytes: int) -> str:
    """The thin body: the event type, its time, the run id and how it ended (the receiver
    fetches the answer with its own token); cut to the type and run id past `max_bytes`."""
    stamp = datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z")
    body = json.dumps(
        {"type": EVENT_TYPE, "timestamp": stamp, "data": {"run_id": ended.run_id, "status": ended.status}}
    )
    if len(body.encode()) > max_bytes:
        body = json.dumps({"type": EVENT_TYPE, "data": {"run_id": ended.run_id}})
    return body


class Webhooks:
    def __init__(
        self,
        outbox: WebhookOutboxPort | None,
        grants: Mapping[str, WebhookGrant],
        settings: EventSettings,
        policy: AddressPolicy,
    ) -> None:
        self.outbox = outbox
        self._grants = grants
        self._settings = settings
        self.deliverer = Deliverer(outbox, grants, settings, policy) if outbox is not None else None
        self._tasks: TaskGroup | None = None

    def check(self, owner: OwnerScope, url: str) -> str:
        """The callback URL if `owner` may name it; the refusal (an RlmMcpError) otherwise."""
        return check_callback(url, self._grants.get(str(owner)))

    async def on_run_end(self, ended: RunEnded) -> None:
        """The run-end hook: write the run end's delivery (nothing when it asked for none).
        Only the row is written here; posting it is the deliverer's, on its own task."""
        url = ended.record.request.webhook_url
        if not url or self.outbox is None:
            return
        now = time.time()
        added = await self.outbox.add(
            Delivery(
                webhook_id=webhook_id(ended.run_id),
                run_id=ended.run_id,
                owner=str(ended.owner),
                url=url,
                body=webhook_body(ended, now, self._settings.webhook_max_payload_bytes),
                state="pending",
                attempts=0,
                created_at=now,
                next_at=now,
            )
        )
        if not added:
            log.info("run %s's end already has its webhook delivery", ended.run_id)

    async def __aenter__(self) -> Webhooks:
        if self.deliverer is not None and any(g.secrets for g in self._grants.values()):
            self._tasks = anyio.create_task_group()
            await self._tasks.__aenter__()
            self._tasks.start_soon(self.deliverer.run)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            tasks.cancel_scope.cancel()
            await tasks.__aexit__(None, None, None)
