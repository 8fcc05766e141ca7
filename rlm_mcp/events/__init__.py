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

from rlm_mcp.events.codec import dumps, flat_line, from_json, loads, to_json
from rlm_mcp.events.kinds import (
    CallRole,
    CallStatus,
    Cell,
    CellStart,
    ChatMessage,
    ChildEnd,
    ChildStart,
    ContextRecord,
    EventKey,
    EventStub,
    HistoryElided,
    LimitsRecord,
    LLMCall,
    LoggedEvent,
    LogTruncated,
    Number,
    RunEnd,
    RunEvent,
    RunStart,
    SubCallKind,
    SubCalls,
    Turn,
    TurnStart,
    UnreadableEvent,
)

__all__ = [
    "SubCallKind",
    "Number",
    "CallStatus",
    "CallRole",
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
