"""What the queue derives from a run's record: its request, its sandbox need, its final summary
when it ends without its worker, and each owner's share of the run slots.

The owner share (RLM_MCP_RUN_OWNER_SHARE) applies only when several tokens are configured (one
token is one owner: it may use every slot). In team mode it is a fraction of the run slots of
all live workers (`rlm_workers.slots`), at least one run, enforced at claim time
(`state.PgRunQueue.claim`).
"""

from __future__ import annotations

from typing import Any

from rlm_mcp.access import load_tokens
from rlm_mcp.config import Settings
from rlm_mcp.engine import RunLimits
from rlm_mcp.owners import Owner
from rlm_mcp.service.runs import RunRequest


def request_of(summary: dict[str, Any]) -> RunRequest:
    """The request a run record carries (the queue row holds the record, nothing else)."""
    return RunRequest(
        query=summary["query"],
        context_ids=list(summary["context_ids"]),
        limits=RunLimits(**summary["limits"]),
        owner=Owner(summary["owner"]),
    )


def need_of(request: RunRequest) -> int:
    """Sandbox slots a run may hold at once: one per depth of its tree (`sandbox/slots.py`); a
    worker with fewer slots in all claims it when all of its slots are free."""
    return max(1, request.limits.max_depth)


def owner_share(settings: Settings) -> float:
    """The fraction of all run slots one owner's running runs may hold (1.0: no share)."""
    try:
        owners = len(load_tokens(settings))
    except OSError:  # the tokens file is checked at start; unreadable here: assume several
        owners = 2
    return settings.run_owner_share if owners > 1 else 1.0


def final_summary(summary: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    """A run's last live summary turned final, for a run that ends without its worker."""
    result = {
        "status": status,
        "answer": None,
        "reason": reason,
        "run_id": summary.get("run_id"),
        "iterations": int(summary.get("iterations") or 0),
        "usage": summary.get("usage") or {},
        "duration_s": float(summary.get("elapsed_s") or 0.0),
        "sub_calls": int(summary.get("sub_calls") or 0),
    }
    return {**summary, "status": status, "phase": "done", "notice": reason, "result": result}
