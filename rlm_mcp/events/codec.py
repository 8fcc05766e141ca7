"""The run events' one JSON encoding: `to_json`/`from_json`, `flat_line` (the same bytes, faster),
`dumps`/`loads` for a stored line. Reading never fails (see `UnreadableEvent`)."""

from __future__ import annotations

import json
from math import isfinite
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import orjson
import pydantic
from pydantic import BaseModel

from rlm_mcp.events.kinds import (
    EventRecord,
    EventStub,
    LoggedEvent,
    RunEvent,
    UnreadableEvent,
)

_ADAPTER: pydantic.TypeAdapter[RunEvent] = pydantic.TypeAdapter(RunEvent)
_STUB_KEYS = frozenset({"type", "ts", "truncated"})

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
    if not (isinstance(item, type) and issubclass(item, EventRecord)):
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
