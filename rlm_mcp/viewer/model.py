"""The view model of one run: its event log folded into runs (the root and its children),
turns, cells, sub-call batches and calls, each with times on one axis.

The page's script only draws this model; all the knowledge of what the events mean for the page
lives here (their format is `rlm_mcp.events`), so
the static file and the live page show the same thing, and tests can check it without a browser.
Everything is plain JSON (dicts, lists, strings, numbers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, assert_never

from rlm_mcp.events import (
    Cell,
    CellStart,
    ChildEnd,
    ChildStart,
    EventStub,
    HistoryElided,
    LLMCall,
    LoggedEvent,
    LogTruncated,
    RunEnd,
    RunStart,
    SubCalls,
    Turn,
    TurnStart,
    UnreadableEvent,
)
from rlm_mcp.ports.runs import RunRecord

Json = dict[str, Any]

# The REPL output message repeats the cells' outputs, which the page shows once, per cell.
_HIDDEN_KINDS = ("REPL output",)


def _start(ts: float | None, took: float | None) -> float | None:
    """When something that ended at `ts` and took `took` seconds began."""
    if ts is None:
        return None
    return ts - took if took is not None else ts


def _fields(event: object, *names: str) -> Json:
    """`event`'s fields of these names, in this order, as the page shows them: most of what an
    event logged is kept as it is, so each handler names the fields instead of copying each one."""
    return {name: getattr(event, name) for name in names}


def _entry(items: list[Json], key: str, value: object, **fresh: Any) -> Json:
    """The item of `items` whose `key` is `value`; when there is none, a new one (`key` first,
    then `fresh`) appended to them."""
    for item in items:
        if item[key] == value:
            return item
    added: Json = {key: value, **fresh}
    items.append(added)
    return added


class _Builder:
    def __init__(self, root_id: str) -> None:
        self.root_id = root_id
        self.runs: dict[str, Json] = {}
        self.batches: dict[tuple[str, int], Json] = {}
        self.notes: list[str] = []

    def run(self, run_id: str) -> Json:
        found = self.runs.get(run_id)
        if found is None:
            found = {
                "run_id": run_id,
                "parent": None,
                "depth": 0,
                "query": None,
                "status": "running",
                "reason": None,
                "start": None,
                "end": None,
                "model": None,
                "sub_model": None,
                "turns": [],
                "children": [],
                "elided": 0,
                "usage": None,
                # Its LM calls' waits: for a place under the endpoint's limit (queued), and
                # retries, answers 429/503 (throttled) and the sleeps between attempts (backoff).
                "lm_waits": {"calls": 0, "queued_s": 0.0, "retried": 0, "retries": 0, "throttled": 0, "backoff_s": 0.0},
            }
            self.runs[run_id] = found
        return found

    def turn(self, run_id: str, iteration: int | None) -> Json:
        return _entry(
            self.run(run_id)["turns"],
            "iteration",
            iteration,
            start=None,
            end=None,
            reply=None,
            messages=[],
            root_calls=[],
            cells=[],
            elided=None,
        )

    def cell(self, run_id: str, iteration: int, block: int) -> Json:
        return _entry(
            self.turn(run_id, iteration)["cells"],
            "block",
            block,
            start=None,
            end=None,
            code=None,
            output=None,
            error=None,
            timed_out=False,
            restarted=False,
            duration_s=None,
            batches=[],
            children=[],
        )

    def batch(self, run_id: str, number: int, iteration: int | None, block: int | None) -> Json:
        key = (run_id, number)
        found = self.batches.get(key)
        if found is None:
            found = {
                "batch": number,
                "kind": None,
                "count": None,
                "failed": None,
                "refused": 0,
                "start": None,
                "end": None,
                "calls": [],
                "children": [],
            }
            self.batches[key] = found
            if iteration is not None and block is not None:
                self.cell(run_id, iteration, block)["batches"].append(found)
            else:  # logged by an older version, or outside a cell: keep it visible anyway
                self.turn(run_id, iteration)["cells"].append(
                    {"block": None, "batches": [found], "children": [], "code": None, "output": None}
                )
        return found

    # -- one case per event type ----------------------------------------------------------------
    def add(self, event: LoggedEvent) -> None:
        match event:
            case RunStart():
                self._run_start(event)
            case RunEnd():
                run = self.run(event.run_id)
                run.update(status=event.status, reason=event.reason, end=event.ts, usage=event.usage.model_dump())
            case TurnStart():
                self.turn(event.run_id, event.iteration)["start"] = event.ts
            case Turn():
                self._turn(event)
            case HistoryElided():
                self._history_elided(event)
            case LLMCall():
                self._llm_call(event)
            case SubCalls():
                self._sub_calls(event)
            case CellStart():
                self.cell(event.run_id, event.iteration, event.block)["start"] = event.ts
            case Cell():
                self._cell(event)
            case ChildStart():
                self._child_start(event)
            case ChildEnd():
                child = self.run(event.child_run_id)
                child.update(status=event.status, answer=event.answer, answer_chars=event.answer_chars)
            case LogTruncated():
                self.notes.append(
                    f"The log reached its cap of {event.max_bytes} bytes; later events were not recorded."
                )
            case EventStub():
                self.notes.append(f"A {event.type} event was too large to record; only its time was kept.")
            case UnreadableEvent():
                pass  # another version's event, or a damaged line: nothing this page can draw
            case _:
                assert_never(event)

    def _run_start(self, e: RunStart) -> None:
        run = self.run(e.run_id)
        run.update(
            _fields(e, "query", "depth", "model", "sub_model"),
            start=e.ts,
            limits=e.limits.model_dump(),
            contexts=[c.model_dump() for c in e.contexts],
        )

    def _turn(self, e: Turn) -> None:
        turn = self.turn(e.run_id, e.iteration)
        turn["end"] = e.ts
        for message in e.new_messages:
            role, content = message.role, message.content
            if role == "assistant":
                turn["reply"] = content if turn["reply"] is None else turn["reply"] + "\n\n" + content
            elif not (role == "user" and content.startswith(_HIDDEN_KINDS)):
                turn["messages"].append({"role": role, "content": content})

    def _history_elided(self, e: HistoryElided) -> None:
        run = self.run(e.run_id)
        run["elided"] += 1
        # Elision happens while fitting the next root call, i.e. within the latest turn.
        if run["turns"]:
            run["turns"][-1]["elided"] = {
                **_fields(e, "tokens_before", "tokens_after", "window"),
                "messages": len(e.indices),
            }

    def _llm_call(self, e: LLMCall) -> None:
        call: Json = {
            **_fields(e, "model", "status", "error", "prompt_tokens", "completion_tokens", "latency_s"),
            "start": _start(e.ts, e.latency_s),
            "end": e.ts,
            "finish_reason": e.finish_reason,
        }
        if e.cost_usd is not None:  # by the price table; unpriced calls have no cost
            call["cost_usd"] = e.cost_usd
        self._waits(e, call)
        if e.role == "root":
            turns = self.run(e.run_id)["turns"]
            turn = self.turn(e.run_id, e.iteration) if e.iteration is not None else (turns[-1] if turns else None)
            if turn is not None:
                turn["root_calls"].append(call)
            return
        call.update(_fields(e, "index", "prompt", "prompt_chars", "answer", "answer_chars"))
        if e.batch is not None:
            self.batch(e.run_id, e.batch, e.iteration, e.block)["calls"].append(call)

    def _waits(self, e: LLMCall, call: Json) -> None:
        """A call's waits (logged only when there were some: older logs have none) on the call and
        summed on its run."""
        waits = self.run(e.run_id)["lm_waits"]
        waits["calls"] += 1
        if e.queued_s is not None:
            call["queued_s"] = e.queued_s
            waits["queued_s"] = round(waits["queued_s"] + e.queued_s, 3)
        if e.retries is not None:
            call["retries"] = e.retries
            waits["retried"] += 1
            waits["retries"] += e.retries
        if e.throttled is not None:
            call["throttled"] = e.throttled
            waits["throttled"] += e.throttled
        if e.backoff_s is not None:
            call["backoff_s"] = e.backoff_s
            waits["backoff_s"] = round(waits["backoff_s"] + e.backoff_s, 3)

    def _sub_calls(self, e: SubCalls) -> None:
        batch = self.batch(e.run_id, e.batch, e.iteration, e.block)
        batch.update(
            _fields(e, "kind", "count", "failed", "refused"),
            start=_start(e.ts, e.duration_s),
            end=e.ts,
        )
        batch["calls"].sort(key=lambda c: c.get("index") or 0)

    def _cell(self, e: Cell) -> None:
        cell = self.cell(e.run_id, e.iteration, e.block)
        cell.update(_fields(e, "code", "output", "error", "timed_out", "restarted", "duration_s"), end=e.ts)
        if cell["start"] is None:
            cell["start"] = _start(e.ts, e.duration_s)

    def _child_start(self, e: ChildStart) -> None:
        child_id = e.child_run_id
        parent_id = e.parent_run_id or self.root_id
        child = self.run(child_id)
        child.update(parent=parent_id, depth=e.depth, prompt=e.prompt, prompt_chars=e.prompt_chars)
        if child["start"] is None:
            child["start"] = e.ts
        self.run(parent_id)["children"].append(child_id)
        if e.iteration is not None and e.block is not None:
            self.cell(parent_id, e.iteration, e.block)["children"].append(child_id)


def build_run(record: RunRecord, events: Iterable[LoggedEvent]) -> Json:
    """The view model of one run tree."""
    root_id = record.run_id
    builder = _Builder(root_id)
    builder.run(root_id)
    for event in events:
        builder.add(event)
    root = builder.runs[root_id]
    result = record.result
    if result is not None:  # the record's result wins: it also covers failures before the first event
        root.update(status=result.status, reason=result.reason)
    root["query"] = root["query"] or record.request.query
    times = [t for run in builder.runs.values() for t in (run["start"], run["end"]) if isinstance(t, (int, float))]
    waits: Json = {}  # the LM waits of the whole tree (the run and its children)
    for run in builder.runs.values():
        for key, value in run["lm_waits"].items():
            waits[key] = round(waits.get(key, 0) + value, 3)
    return {
        "run_id": root_id,
        "query": record.request.query,
        "created_at": record.created_at,
        "status": root["status"],
        "reason": root["reason"],
        # The record's result is written after the log's last event: live pages poll until it is.
        "finished": record.done,
        "answer": result.answer if result is not None else None,
        "usage": result.usage.to_dict() if result is not None else (root.get("usage") or record.usage.to_dict()),
        "duration_s": result.duration_s if result is not None else None,
        "iterations": result.iterations if result is not None else record.iterations,
        "sub_calls": result.sub_calls if result is not None else record.sub_calls,
        "model": root.get("model") or record.request.model,
        "session_id": record.request.session_id,  # a kept session's run (docs/sessions.md)
        "t0": min(times) if times else record.created_at,
        "t1": max(times) if times else record.created_at,
        "lm_waits": waits,
        "runs": builder.runs,
        "notes": builder.notes,
    }


def index_entry(record: RunRecord) -> Json:
    """One row of the runs index, from a run's record."""
    result = record.result
    usage = result.usage if result is not None else record.usage
    return {
        "run_id": record.run_id,
        "created_at": record.created_at,
        "query": record.request.query,
        "status": result.status if result is not None else record.status,
        "reason": result.reason if result is not None else None,
        "duration_s": result.duration_s if result is not None else None,
        "tokens": usage.total.total,
        "model": record.request.model,
        "session_id": record.request.session_id,
        "iterations": result.iterations if result is not None else record.iterations,
        "sub_calls": result.sub_calls if result is not None else record.sub_calls,
    }
