"""The queue's rules from the settings (`ports.queue.QueueRules`): what both implementations of
the queue port apply, with the waiting bounds' error and each owner's share written once
(`service.run_queue`, the rules embedded mode applies to its own slots)."""

from __future__ import annotations

from rlm_mcp.config import QueueSettings
from rlm_mcp.ports.queue import QueueRules
from rlm_mcp.service.run_queue import ConfiguredOwners, owner_run_share, queue_refusal

__all__ = ["queue_rules"]


def queue_rules(settings: QueueSettings) -> QueueRules:
    runs = settings.runs
    owners = ConfiguredOwners(settings.server)  # the tokens file is read again only when it changes
    return QueueRules(
        lease_s=settings.worker_lease_s,
        queue_timeout_s=settings.run_queue_timeout_s,
        max_queued=runs.run_max_queued,
        max_queued_per_owner=runs.run_max_queued_per_owner,
        share=lambda slots: owner_run_share(runs, slots=slots, owners=owners.count()),
        refusal=lambda queued, mine: queue_refusal(runs, queued=queued, queued_by_owner=mine),
    )
