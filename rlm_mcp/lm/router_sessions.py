"""Ending a run's sessions at the routers that count them (vllm-router `sticky_least_loaded`).

Such a router places a new session on the healthy replica with the fewest live sessions and
keeps it there until the replica fails, the session expires (two hours by default) or it is told
`POST /finish_session?session_id=...`. Its counts are only as true as the finishes it is sent,
so they are sent when a child RLM ends (its own root session: `LMClient.session_done`, told by
the engine) and at every run's end, for every session the run tree opened:

- the sessions this process noted while the tree ran (`SessionLedger`: the root's run id, a
  child RLM's `<parent>.<n>` not finished yet, the sub-call sessions `<root>~sub<k>`, each with the endpoint it
  went to, so a sub-call endpoint behind another router, `RLM_MCP_SUB_BASE_URL`, is told too);
- and, whoever tells the end (a front cancelling a queued run, a sweeper ending a lost worker's
  run: processes that sent nothing for it), the keys a run's id determines: its own at the root
  endpoint and its `RLM_MCP_ROUTER_SUB_SESSIONS` sub-call keys at the sub-call endpoint. A lost
  worker's child RLMs (their ids were only in its memory) are left to expire.

Best-effort and bounded: the requests go out together, each with the endpoint's key (what its
clients send the router), or `RLM_MCP_ROUTER_API_KEY` when the router's own differs (vllm-router
0.1.17 checks none on this route), and the whole is abandoned after
`RLM_MCP_ROUTER_FINISH_TIMEOUT_S`; nothing here raises or changes how the run ended.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import anyio

from rlm_mcp.lm.endpoint import Endpoint
from rlm_mcp.lm.http import HttpError
from rlm_mcp.lm.routing import RoutingKeys, sub_session_key, tree_root

log = logging.getLogger("rlm_mcp.lm")


def run_sessions(run_id: str, keys: RoutingKeys, *, root: Endpoint, sub: Endpoint) -> set[tuple[str, str]]:
    """(endpoint root URL, session key) for every session of the tree of `run_id` to finish."""
    out = keys.ledger.take(run_id)
    out.add((root.root_url, tree_root(run_id)))
    out.update((sub.root_url, sub_session_key(run_id, k)) for k in range(keys.sub_sessions))
    return out


async def finish_sessions(
    sessions: set[tuple[str, str]], endpoints: dict[str, Endpoint], timeout_s: float, *, api_key: str | None = None
) -> int:
    """Send `/finish_session` for each (endpoint root URL, key) of `sessions`, through that
    endpoint's pool, with its key or `api_key` (the router's own); how many were accepted."""
    if not sessions:
        return 0
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    accepted = 0

    async def finish(url: str, key: str) -> None:
        nonlocal accepted
        try:
            reply = (
                await endpoints[url]
                .http()
                .request(
                    "POST",
                    f"{url}/finish_session?session_id={quote(key, safe='')}",
                    timeout_s=timeout_s,
                    headers=headers,
                )
            )
        except HttpError as exc:
            log.debug("finish_session %s at %s: %s", key, url, exc)
            return
        if reply.is_success:
            accepted += 1
        else:
            log.debug("finish_session %s at %s: HTTP %s", key, url, reply.status_code)

    # Shielded: a run ended by a cancellation still has its sessions finished, within the bound.
    with anyio.move_on_after(timeout_s, shield=True) as scope:
        async with anyio.create_task_group() as tg:
            for url, key in sorted(sessions):
                tg.start_soon(finish, url, key)
    if scope.cancelled_caught:
        log.warning("the router did not confirm the end of %d sessions within %ss", len(sessions), timeout_s)
    return accepted
