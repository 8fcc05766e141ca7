"""The view model of a kept session: its runs as a chain, in the order they ran.

Built from the run records alone (each carries its `session_id`), so it is the same in either
store and whichever process ran each run; what only the process holding the session knows (is
its sandbox live, its snapshot's size, why it ended) comes in as `state` when there is one.
Each run says which `context_i` it bound: a session binds each run's contexts as the next
indices (context_0 is the first run's), and a run that never started bound none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlm_mcp.ports.runs import RunRecord, summed_usage

Json = dict[str, Any]

SESSION_PREFIX = "ses_"  # a kept session's id; the viewer serves its chain where a run id would be
EXCERPT_CHARS = 600  # of each run's answer; the run's own page has the whole of it
# Parts of the state that change by the second: left out, so that a live page redraws only when
# something happened (the page counts the age from `created_at` itself).
_VOLATILE = ("age_s", "idle_s", "usage", "runs")


def is_session_id(name: str) -> bool:
    return name.startswith(SESSION_PREFIX)


def session_runs(records: Iterable[RunRecord], session_id: str) -> list[RunRecord]:
    """The session's runs among `records`, oldest first (one record per run id)."""
    mine = {r.run_id: r for r in records if r.request.session_id == session_id}
    return sorted(mine.values(), key=lambda r: r.created_at)


def _run_link(record: RunRecord, step: int, first_index: int) -> tuple[Json, int]:
    """One link of the chain, and how many contexts the session had bound after it."""
    result = record.result
    answer = result.answer if result is not None else None
    bound = first_index
    contexts = []
    if record.not_started is None:
        for context_id in record.request.context_ids:
            contexts.append({"name": f"context_{bound}", "context_id": context_id})
            bound += 1
    link = {
        "step": step,
        "run_id": record.run_id,
        "created_at": record.created_at,
        "query": record.request.query,
        "status": result.status if result is not None else record.status,
        "reason": result.reason if result is not None else None,
        "answer": answer[:EXCERPT_CHARS] if answer is not None else None,
        "answer_chars": len(answer) if answer is not None else 0,
        "iterations": result.iterations if result is not None else record.iterations,
        "sub_calls": result.sub_calls if result is not None else record.sub_calls,
        "duration_s": result.duration_s if result is not None else record.elapsed_s,
        "usage": record.spent.to_dict(),
        "contexts": contexts,
        "model": record.request.model,
    }
    return link, bound


def build_session(session_id: str, runs: Sequence[RunRecord], state: Mapping[str, object] | None = None) -> Json:
    """The view model of a session whose runs (`session_runs`) are given, oldest first."""
    chain: list[Json] = []
    bound = 0
    for step, record in enumerate(runs, start=1):
        link, bound = _run_link(record, step, bound)
        chain.append(link)
    shown_state = {k: v for k, v in state.items() if k not in _VOLATILE} if state is not None else None
    created = state.get("created_at") if state is not None else None
    return {
        "session_id": session_id,
        "created_at": created if isinstance(created, (int, float)) else (runs[0].created_at if runs else None),
        "last_run_at": runs[-1].created_at if runs else None,
        "runs": chain,
        "contexts_bound": bound,
        "usage": summed_usage(runs).to_dict(),
        "state": shown_state,
    }
