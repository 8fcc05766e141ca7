"""Why a context cannot be deleted, said in terms of what exists.

The store refuses to delete a context that a live pin holds, and says a running run holds it.
A kept session pins its contexts for its whole life, also while it idles between runs (no run
to wait for or cancel): when one of the owner's own idle sessions holds the context, the refusal
names that session and how to close it instead.
"""

from __future__ import annotations

from rlm_mcp.errors import BadArgumentError
from rlm_mcp.owners import Owner
from rlm_mcp.service.service import RlmService


async def held_by_idle_session(service: RlmService, context_id: str, owner: Owner) -> BadArgumentError | None:
    """The refusal naming the owner's idle kept session that holds `context_id`; None when none does."""
    holders = []
    for view in await service.sessions_of(owner):
        if not view.running and context_id in view.context_ids:
            holders.append(view.session_id)
    if not holders:
        return None
    named = ", ".join(holders)
    return BadArgumentError(
        f"Context '{context_id}' is held by your kept session {named}, which keeps its contexts while it lives "
        "(no run is using it now).",
        f"Close the session with rlm_close_session (session_id={holders[0]}) if you no longer need it, "
        "then delete the context.",
    )
