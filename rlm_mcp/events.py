"""Run events: one typed union for the event stream of a run tree, and its one JSON encoding.

The engine produces these events, the run log stores them (one JSON object per line, see
`store/runs.py`), and the service, the viewer and the exports consume them by type (`match` /
`isinstance`, checked by mypy). This module imports no layer (store must not import engine,
engine must not import store): see the end of this docstring.

The encoding is the format run logs have had on disk since the first release, kept byte for byte:
each event's fields in the order declared below, `ts` (Unix time, stamped by the log) where the
log has always put it, and the optional fields named in `OMIT_WHEN_NONE` left out when unset
(a sub-call made outside a cell names no cell; a root call names no batch). `to_json`/`from_json` are the only
way in and out (`flat_line` is `to_json`'s encoding written faster, the same bytes); a store that
keeps events elsewhere (a database) persists `dumps(event)` and reads back with `loads(line)`
without knowing the types.

Reading never fails: besides the kinds below, a log can hold an `EventStub` (a line too large to
keep even after its strings were cut: only its kind and time were written) and lines that are no
event this version knows (another version's kind, a hand-edited line): those come back as
`UnreadableEvent`, which keeps the object as it was, so an export prints it unchanged. Fields that
older versions did not write yet are optional here, which is the reader for their logs.

Besides the standard library and pydantic it imports only orjson (`flat_line`), no part of rlm-mcp
but `usage`, so every layer may use it.
"""

from __future__ import annotations

import json
from math import isfinite
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Union, get_args, get_origin

import orjson
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from rlm_mcp.usage import Usage

# Which model an LM call is for: a root turn, or a sub-call (llm_query*, rlm_query at the depth limit).
CallRole = Literal["root", "sub"]
# What code in the sandbox asked for: a plain sub-call (llm_query*) or a child RLM (rlm_query*).
SubCallKind = Literal["llm", "rlm"]
# How an LM call ended.
CallStatus = Literal["ok", "error"]

# Seconds and times: ints stay ints and floats floats, so a line reads back and encodes to the
# same bytes (pydantic would turn a `float` field's 900 into 900.0).
Number = int | float


class _Event(BaseModel):
    # A field this version does not know (a newer version wrote it) is kept and written back
    # after the known ones, so an export of a newer log loses nothing.
    model_config = ConfigDict(frozen=True, extra="allow")
    # Optional fields left out of the JSON object when None (their absence means something).
    OMIT_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"ts"})


# -- payload records ----------------------------------------------------------------------------
class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ContextRecord(_Record):
    context_id: str
    name: str
    kind: str
    chars: int


class LimitsRecord(_Record):
    max_iterations: int
    max_depth: int
    timeout_s: Number
    token_budget: int | None
    max_errors: int


class ChatMessage(_Record):
    role: str
    content: str


# -- the events, in the order a run writes them --------------------------------------------------
class RunStart(_Event):
    """A run of the tree began (the root, or a child with its prompt as context and no query)."""

    type: Literal["run_start"] = "run_start"
    run_id: str
    depth: int
    query: str | None
    contexts: list[ContextRecord]
    limits: LimitsRecord
    model: str
    sub_model: str
    prompt_profile: str
    ts: Number | None = None


class TurnStart(_Event):
    type: Literal["turn_start"] = "turn_start"
    run_id: str
    iteration: int
    max_iterations: int
    depth: int
    ts: Number | None = None


class HistoryElided(_Event):
    """Older messages were replaced by markers (or the newest cut) to fit the root window."""

    type: Literal["history_elided"] = "history_elided"
    run_id: str
    depth: int
    indices: list[int]
    cut_newest: bool
    tokens_before: int
    tokens_after: int
    window: int
    max_tokens: int
    ts: Number | None = None


class LLMCall(_Event):
    """One root or sub LM call. Root calls name their turn; sub-calls name the cell and the
    batch slot that made them (when there is one) and keep the head and tail of prompt and answer."""

    OMIT_WHEN_NONE: ClassVar[frozenset[str]] = frozenset(
        {
            "ts",
            "iteration",
            "block",
            "batch",
            "index",
            "prompt",
            "prompt_chars",
            "answer",
            "answer_chars",
            "cost_usd",
            "queued_s",
            "retries",
            "throttled",
            "backoff_s",
        }
    )
    type: Literal["llm_call"] = "llm_call"
    run_id: str
    role: CallRole
    model: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: Number
    status: CallStatus
    finish_reason: str | None
    error: str | None
    depth: int
    iteration: int | None = None
    block: int | None = None
    batch: int | None = None
    index: int | None = None
    prompt: str | None = None
    prompt_chars: int | None = None
    answer: str | None = None
    answer_chars: int | None = None
    cost_usd: float | None = None  # by the price table; absent when the model has no price
    # What the call waited besides its answer, each absent when none (and in older logs): seconds
    # for a place under the endpoint's limit and the process's slots (1 ms or more), attempts after
    # the first, answers 429/503 among them, seconds slept between attempts (part of latency_s).
    queued_s: Number | None = None
    retries: int | None = None
    throttled: int | None = None
    backoff_s: Number | None = None
    ts: Number | None = None


class CellStart(_Event):
    type: Literal["cell_start"] = "cell_start"
    run_id: str
    iteration: int
    block: int
    depth: int
    ts: Number | None = None


class SubCalls(_Event):
    """One batch of sub-calls from a cell (`llm_query*` / `rlm_query*`), once all answered."""

    OMIT_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"ts", "iteration", "block"})
    type: Literal["sub_calls"] = "sub_calls"
    run_id: str
    batch: int
    duration_s: Number
    refused: int
    iteration: int | None = None
    block: int | None = None
    kind: SubCallKind
    requested_kind: str
    count: int
    failed: int
    total_sub_calls: int
    depth: int
    ts: Number | None = None


class ChildStart(_Event):
    """A child RLM run began (`rlm_query` with depth to spare), linked to its parent's cell."""

    OMIT_WHEN_NONE: ClassVar[frozenset[str]] = frozenset(
        {"ts", "parent_run_id", "iteration", "block", "batch", "index", "prompt", "prompt_chars"}
    )
    type: Literal["child_start"] = "child_start"
    child_run_id: str
    parent_run_id: str | None = None
    iteration: int | None = None
    block: int | None = None
    batch: int | None = None
    index: int | None = None
    prompt: str | None = None
    prompt_chars: int | None = None
    depth: int
    status: str
    ts: Number | None = None


class ChildEnd(_Event):
    OMIT_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"ts", "parent_run_id", "answer", "answer_chars"})
    type: Literal["child_end"] = "child_end"
    child_run_id: str
    parent_run_id: str | None = None
    depth: int
    status: str
    answer: str | None = None
    answer_chars: int | None = None
    ts: Number | None = None


class Cell(_Event):
    """One code block ran: its code and output (capped), error, time, timeout and restart."""

    type: Literal["cell"] = "cell"
    run_id: str
    iteration: int
    block: int
    code: str
    output: str
    duration_s: Number
    error: str | None
    timed_out: bool
    restarted: bool
    depth: int
    ts: Number | None = None


class Turn(_Event):
    """A root turn ended: the messages it added to the conversation (turn 1 also the system
    and metadata messages, so the log holds the whole conversation)."""

    type: Literal["turn"] = "turn"
    run_id: str
    iteration: int
    depth: int
    new_messages: list[ChatMessage]
    ts: Number | None = None


class RunEnd(_Event):
    type: Literal["run_end"] = "run_end"
    run_id: str
    status: str
    reason: str | None
    iterations: int
    usage: Usage
    duration_s: Number
    depth: int
    ts: Number | None = None


class LogTruncated(_Event):
    """Written by the log once it reached its cap; later events were dropped."""

    type: Literal["log_truncated"] = "log_truncated"
    ts: Number | None = None
    max_bytes: int


# What the engine emits (and, with `LogTruncated`, what a log holds when all went well).
RunEvent = Annotated[
    RunStart
    | TurnStart
    | HistoryElided
    | LLMCall
    | CellStart
    | SubCalls
    | ChildStart
    | ChildEnd
    | Cell
    | Turn
    | RunEnd
    | LogTruncated,
    Field(discriminator="type"),
]


class EventStub(_Event):
    """An event whose line was too large even with its strings cut: only its kind and time."""

    type: str
    ts: Number | None = None
    truncated: Literal[True] = True


class UnreadableEvent(BaseModel):
    """A line that is no event this version knows; `raw` is the JSON value as it was read (no
    version writes anything but objects; `to_json` gives another value as `{"value": raw}`)."""

    model_config = ConfigDict(frozen=True)
    raw: Any

    @property
    def type(self) -> str | None:
        kind = self.raw.get("type") if isinstance(self.raw, dict) else None
        return kind if isinstance(kind, str) else None


# Everything a run log can hold.
LoggedEvent = RunEvent | EventStub | UnreadableEvent

_ADAPTER: pydantic.TypeAdapter[RunEvent] = pydantic.TypeAdapter(RunEvent)
_STUB_KEYS = frozenset({"type", "ts", "truncated"})


class EventKey(NamedTuple):
    """Where an event sits in its run's log: the attempt that wrote it (team mode: the queue's
    claim, from 1; 0 for a run executed where it was accepted) and its sequence in the log.
    Keys order a run's events (attempts hold disjoint, increasing sequences); the event stream
    names each event by its key (`attempt-seq`), which is how a client resumes."""

    attempt: int
    seq: int


_FLAT_LEAVES = (str, int, float, bool, type(None))
_flat: dict[type[BaseModel], tuple[str, ...] | None] = {}


def _is_flat(annotation: Any) -> bool:
    """Whether a field's values are JSON scalars as they are (their JSON-mode dump is themselves)."""
    if get_origin(annotation) is Literal:
        return all(isinstance(arg, _FLAT_LEAVES) for arg in get_args(annotation))
    args = get_args(annotation)
    if args:  # a union (`int | None`, `Number`)
        return get_origin(annotation) in (Union, UnionType) and all(_is_flat(arg) for arg in args)
    return annotation in _FLAT_LEAVES


def _flat_fields(cls: type[BaseModel]) -> tuple[str, ...] | None:
    """The field names of an event class whose fields are all flat, in their order; None otherwise."""
    try:
        return _flat[cls]
    except KeyError:
        fields = cls.model_fields
        flat = all(_is_flat(f.annotation) for f in fields.values())
        names = _flat[cls] = tuple(fields) if flat else None
        return names


# What `flat_line` writes of an event class: its field names in order, and for each field that
# is a list of flat records (a turn's messages) the records' field names.
_LineFields = tuple[tuple[str, ...], dict[str, tuple[str, ...]]]
_line: dict[type[BaseModel], _LineFields | None] = {}


def _record_list(annotation: Any) -> tuple[str, ...] | None:
    """The field names of `list[R]`'s record R when R's fields are all flat; None otherwise."""
    if get_origin(annotation) is not list:
        return None
    (item,) = get_args(annotation)
    if not (isinstance(item, type) and issubclass(item, _Record)):
        return None
    fields = item.model_fields
    return tuple(fields) if all(_is_flat(f.annotation) for f in fields.values()) else None


def _line_fields(cls: type[BaseModel]) -> _LineFields | None:
    """The fields `flat_line` writes for an event class: flat fields, and lists of flat records;
    None when another field is not."""
    try:
        return _line[cls]
    except KeyError:
        lists: dict[str, tuple[str, ...]] = {}
        for name, field in cls.model_fields.items():
            if _is_flat(field.annotation):
                continue
            records = _record_list(field.annotation)
            if records is None:
                _line[cls] = None
                return None
            lists[name] = records
        fields = _line[cls] = (tuple(cls.model_fields), lists)
        return fields


def _flat_json(
    values: dict[str, Any], names: tuple[str, ...], omit: frozenset[str], ts: float | None
) -> dict[str, Any] | None:
    """`to_json` of a flat event in one pass over its fields; None when a float is not finite
    (pydantic's JSON mode writes it as null: the general path does)."""
    data: dict[str, Any] = {}
    for name in names:
        value = values[name]
        if type(value) is float and not isfinite(value):
            return None
        if name == "ts" and ts is not None:
            value = ts
        if value is not None or name not in omit:
            data[name] = value
    return data


def to_json(event: LoggedEvent, *, ts: float | None = None) -> dict[str, Any]:
    """The event as the JSON object a log line holds (key order included); `ts` stamps it with
    the time it is written (the log does, as it appends)."""
    if isinstance(event, UnreadableEvent):
        return event.raw if isinstance(event.raw, dict) else {"value": event.raw}
    names = _flat_fields(type(event))
    if names is not None and not event.__pydantic_extra__:
        # Every field a str, number, bool or None: the object is the fields' own values, read
        # straight from the instance (pydantic's serializer would return the same values and
        # costs more than the JSON encoding of the line; `llm_call`, one per sub-call, is one).
        flat = _flat_json(event.__dict__, names, event.OMIT_WHEN_NONE, ts)
        if flat is not None:
            return flat
    data = event.model_dump(mode="json")  # nested records, extra fields, or a non-finite float (null)
    if ts is not None:
        data["ts"] = ts  # in its place: every event declares `ts`
    omit = event.OMIT_WHEN_NONE
    return {k: v for k, v in data.items() if not (v is None and k in omit)}


def _records(value: list[BaseModel], names: tuple[str, ...]) -> list[dict[str, Any]] | None:
    """A list of flat records as JSON objects; None when a value is not written alike."""
    items = []
    for record in value:
        fields = record.__dict__
        item = {}
        for name in names:
            field = fields[name]
            kind = type(field)
            if kind is float:
                if not (field == 0.0 or 1e-4 <= abs(field) < 1e16):
                    return None
            elif field is not None and kind is not str and kind is not int and kind is not bool:
                return None
            item[name] = field
        items.append(item)
    return items


def flat_line(event: LoggedEvent, *, ts: float | None = None) -> bytes | None:
    """The bytes `json.dumps(to_json(event, ts=ts), ensure_ascii=False)` writes (no newline), for
    an event of flat fields (and lists of flat records: a turn's messages) whose values orjson
    writes exactly as the standard library does; None for any other (the caller encodes
    `to_json(event)`). One `llm_call` line per sub-call, 200 in a batch, and a turn's three
    lines: the standard library's encoder (and pydantic's dump, for a turn) costs more than the
    call's or the turn's other bookkeeping.

    orjson writes the same JSON value compactly: every str escaped alike (all code points
    checked, tests/unit/test_event_lines.py), int, bool and null alike, a float alike when it
    is 0 or 1e-4 <= |x| < 1e16 (below, orjson writes `1e-5` or `0.00005` where Python writes
    `1e-05` or `5e-05`). The separators are then widened to the stored `", "`, `": "` and
    `}, {`: `":` ends each key, `,"` starts each key after an object's first and `},{` parts
    two records of a list; one inside a string (a value starting with `:` or ending with `,`,
    an escaped quote, a `},{` where there are records) would make more of them than the
    structure has, and that line is left to the standard library."""
    if isinstance(event, UnreadableEvent):
        return None
    fields = _line_fields(type(event))
    if fields is None or event.__pydantic_extra__:
        return None
    names, lists = fields
    values, omit = event.__dict__, event.OMIT_WHEN_NONE
    data: dict[str, Any] = {}
    keys = commas = parts = 0  # beyond the top object's own: those of its lists' records
    for name in names:
        value: Any = ts if name == "ts" and ts is not None else values[name]
        kind = type(value)
        if kind is float:
            if not (value == 0.0 or 1e-4 <= abs(value) < 1e16):  # NaN and infinities fail too
                return None
        elif value is None:
            if name in omit:
                continue
        elif kind is not str and kind is not int and kind is not bool:
            record_names = lists.get(name)
            if record_names is None:
                return None
            items = _records(value, record_names)
            if items is None:
                return None
            count = len(items)
            keys += len(record_names) * count
            commas += (len(record_names) - 1) * count
            parts += max(count - 1, 0)
            value = items
        data[name] = value
    try:
        compact = orjson.dumps(data)
    except orjson.JSONEncodeError:  # an integer past 64 bits, a lone surrogate
        return None
    top = len(data)
    if compact.count(b'":') != top + keys or compact.count(b',"') != top - 1 + commas:
        return None
    line = compact.replace(b'":', b'": ').replace(b',"', b', "')
    if not lists:
        return line
    if compact.count(b"},{") != parts:
        return None
    return line.replace(b"},{", b"}, {") if parts else line


def from_json(obj: object) -> LoggedEvent:
    """The event a log line's JSON object holds; never raises (see `UnreadableEvent`)."""
    if isinstance(obj, dict):
        try:
            return _ADAPTER.validate_python(obj)
        except pydantic.ValidationError:
            if obj.get("truncated") is True and obj.keys() <= _STUB_KEYS and isinstance(obj.get("type"), str):
                try:
                    return EventStub.model_validate(obj)
                except pydantic.ValidationError:
                    pass
    return UnreadableEvent(raw=obj)


def dumps(event: LoggedEvent) -> str:
    """One line of JSON (no newline), as a log stores it."""
    return json.dumps(to_json(event), ensure_ascii=False)


def loads(line: str | bytes) -> LoggedEvent:
    """The event of one stored line; a line that is not JSON raises `ValueError`."""
    try:
        return _ADAPTER.validate_json(line)  # one pass over the bytes for a well-formed event
    except pydantic.ValidationError:
        return from_json(json.loads(line))


__all__ = [
    "Cell",
    "CellStart",
    "ChatMessage",
    "ChildEnd",
    "ChildStart",
    "ContextRecord",
    "EventKey",
    "EventStub",
    "HistoryElided",
    "LLMCall",
    "LimitsRecord",
    "LogTruncated",
    "LoggedEvent",
    "RunEnd",
    "RunEvent",
    "RunStart",
    "SubCalls",
    "Turn",
    "TurnStart",
    "UnreadableEvent",
    "dumps",
    "flat_line",
    "from_json",
    "loads",
    "to_json",
]
