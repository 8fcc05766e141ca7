"""The deliverer: claims due deliveries from the outbox and posts them, signed, to their
callbacks; records each attempt. At least once: a delivery is marked delivered only after a 2xx
answer, so a deliverer that dies mid-post leaves it to the next claim (its lease lapses) and the
receiver may see the same `webhook-id` twice (Standard Webhooks: receivers deduplicate by it).

A failing receiver never touches a run: the outbox row was written at the run's end, and this
loop runs on its own task. Backoff: 5 s after the first failure, doubling, at most an hour;
after RLM_MCP_WEBHOOK_MAX_ATTEMPTS the delivery is `failed` (redeliver it by hand:
`rlm-mcp webhooks redeliver`). Delivered and failed records are removed after the retention.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import anyio

from rlm_mcp.access import WebhookGrant
from rlm_mcp.config import EventSettings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.ports.webhooks import Attempt, Delivery, WebhookOutboxPort
from rlm_mcp.service.loaders.addresses import AddressPolicy
from rlm_mcp.service.webhooks.signing import headers
from rlm_mcp.service.webhooks.targets import pin

log = logging.getLogger("rlm_mcp.webhooks")

FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 3600.0
BATCH = 16
PRUNE_EVERY_S = 600.0


def backoff_s(attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt."""
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** max(0, attempts - 1))


class Deliverer:
    def __init__(
        self,
        outbox: WebhookOutboxPort,
        grants: Mapping[str, WebhookGrant],
        settings: EventSettings,
        policy: AddressPolicy,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._outbox = outbox
        self._grants = grants
        self._settings = settings
        self._policy = policy
        self._clock = clock
        self._last_prune = 0.0

    async def run(self) -> None:
        """Deliver until cancelled; an outbox that cannot be read now is tried again next poll."""
        while True:
            try:
                await self.deliver_due()
            except RlmMcpError as exc:  # the database is away: the rows wait
                log.warning("webhook deliveries could not be read: %s", exc)
            await anyio.sleep(self._settings.webhook_poll_s)

    async def deliver_due(self) -> int:
        """Claim and post every due delivery once; how many were attempted."""
        now = self._clock()
        if now - self._last_prune >= PRUNE_EVERY_S:
            self._last_prune = now
            await self._outbox.prune(now - self._settings.webhook_retention_days * 86400)
        lease = self._settings.webhook_timeout_s * 3
        due = await self._outbox.claim(now, lease, BATCH)
        if due:
            async with anyio.create_task_group() as tg:
                for delivery in due:
                    tg.start_soon(self.attempt, delivery)
        return len(due)

    async def attempt(self, delivery: Delivery) -> None:
        """Post one delivery and record what came of it."""
        # httpx is imported by the first delivery, not with the module: most processes never post
        # one, and it (with its command line's click, rich and pygments) is a large start-up cost.
        import httpx

        attempts = delivery.attempts + 1
        status: int | None = None
        error: str | None = None
        grant = self._grants.get(delivery.owner)
        try:
            if grant is None or not grant.secrets:
                raise RlmMcpError("the owner has no webhook secret any more")
            status = await self._post(delivery, grant)
            if 200 <= status < 300:
                await self._record(delivery, "delivered", attempts, None, status, None)
                return
            error = f"answered HTTP {status}"
        except (RlmMcpError, OSError, httpx.HTTPError) as exc:
            error = str(exc) or type(exc).__name__
        final = attempts >= self._settings.webhook_max_attempts
        log.info("webhook %s for run %s, attempt %d: %s", delivery.webhook_id, delivery.run_id, attempts, error)
        await self._record(delivery, "failed" if final else "pending", attempts, backoff_s(attempts), status, error)

    async def _record(
        self, d: Delivery, state: str, attempts: int, wait: float | None, status: int | None, error: str | None
    ) -> None:
        now = self._clock()
        with anyio.CancelScope(shield=True):  # the attempt happened: its record must land
            await self._outbox.record(
                d.webhook_id,
                Attempt(
                    state="delivered" if state == "delivered" else "failed" if state == "failed" else "pending",
                    attempts=attempts,
                    next_at=now + (wait or 0.0),
                    status=status,
                    error=error[:500] if error else None,
                    now=now,
                ),
            )

    async def _post(self, delivery: Delivery, grant: WebhookGrant) -> int:
        import httpx  # (see attempt)

        target = await pin(delivery.url, self._policy)
        body = delivery.body.encode()
        sent = headers(grant.secrets, delivery.webhook_id, int(self._clock()), body)
        sent["host"] = target.host_header
        timeout = httpx.Timeout(self._settings.webhook_timeout_s)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
            response = await client.post(
                target.url, content=body, headers=sent, extensions={"sni_hostname": target.sni}
            )
            return response.status_code
