"""The webhook outbox's port: a run end's delivery to its callback, kept until delivered.

One row per run end (its `webhook_id` is the Standard Webhooks `webhook-id`, the same on every
retry), written through the run-end hook and delivered at least once by any process's
deliverer (`service.webhooks`): a deliverer claims due rows for a lease, so two never post the
same row at once, and one that dies mid-delivery leaves the row to the next after the lease.
Two implementations keep the same rules: `store.webhooks.SqliteWebhookOutbox` (embedded) and
`store.pg.webhooks.PgWebhookOutbox` (team mode, shared by every front and worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from rlm_mcp.owners import OwnerScope

__all__ = ["Attempt", "Delivery", "DeliveryState", "WebhookOutboxPort"]

# pending: due at `next_at` (or being delivered, under a claim); delivered; failed: attempts spent.
DeliveryState = Literal["pending", "delivered", "failed"]


@dataclass(frozen=True)
class Delivery:
    # The fields are the outbox tables' columns, by name and in order (`store.webhooks.COLUMNS`).
    webhook_id: str
    run_id: str
    owner: str
    url: str
    body: str  # the JSON body, as signed and sent
    state: DeliveryState
    attempts: int
    created_at: float
    next_at: float
    last_status: int | None = None
    last_error: str | None = None
    delivered_at: float | None = None


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt came to, as `WebhookOutboxPort.record` writes it back to its row:
    one value, so the port and both stores name the outcome's fields once."""

    state: DeliveryState
    attempts: int  # the row's attempt count, this one included
    next_at: float  # when a pending delivery is due again
    status: int | None  # the HTTP status the receiver answered, if it answered
    error: str | None
    now: float  # when it was recorded: the row's `delivered_at` when `state` is "delivered"


class WebhookOutboxPort(Protocol):
    async def add(self, delivery: Delivery) -> bool:
        """Keep a new delivery; False (and nothing written) when its run end already has one."""
        ...

    async def claim(self, now: float, lease_s: float, limit: int) -> list[Delivery]:
        """Up to `limit` pending deliveries due by `now`, none claimed by another deliverer
        whose lease runs on; each is claimed until `now + lease_s`."""
        ...

    async def record(self, webhook_id: str, attempt: Attempt) -> None:
        """What an attempt came to (its claim is released)."""
        ...

    async def list(self, owner: OwnerScope, limit: int) -> list[Delivery]:
        """`owner`'s deliveries, the newest first (EVERY_OWNER: the operator's view)."""
        ...

    async def redeliver(self, webhook_id: str, owner: OwnerScope, now: float) -> bool:
        """Make a delivery pending and due now (its id kept); False when `owner` has no such delivery."""
        ...

    async def prune(self, before: float) -> int:
        """Remove delivered and failed deliveries created before `before`; how many."""
        ...
