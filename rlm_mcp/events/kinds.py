"""The run events' kinds: one pydantic model per event, the union a run log holds, and an event's
key in its log. Their one encoding is `codec.py`; the package's docstring says what the format keeps."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, NamedTuple

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
class EventRecord(BaseModel):
    """A record nested in an event (a context, the limits, a chat message): frozen, extra keys dropped."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class ContextRecord(EventRecord):
    context_id: str
    name: str
    kind: str
    chars: int


class LimitsRecord(EventRecord):
    max_iterations: int
    max_depth: int
    timeout_s: Number
    token_budget: int | None
    max_errors: int


class ChatMessage(EventRecord):
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


class EventKey(NamedTuple):
    """Where an event sits in its run's log: the attempt that wrote it (team mode: the queue's
    claim, from 1; 0 for a run executed where it was accepted) and its sequence in the log.
    Keys order a run's events (attempts hold disjoint, increasing sequences); the event stream
    names each event by its key (`attempt-seq`), which is how a client resumes."""

    attempt: int
    seq: int
