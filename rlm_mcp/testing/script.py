"""The script of a `ScriptedLM`: what it replies, which faults it injects, how it counts tokens.

Everything here is pure: no sockets, so the decision logic is testable and reusable. The server
that plays it is `rlm_mcp.testing.scripted_lm`.

The script: a JSON object, every key optional (the Python model is `Script`, below)::

    model            "rlm-v0.1"       adapter name; listed with parent=base_model, max_model_len null
    base_model       "Qwen/Qwen3-30B-A3B-Instruct-2507"   listed with max_model_len
    extra_models     []               more adapter names served
    max_model_len    16384            the window every model has
    tokenize         true             false: POST /tokenize answers 404
    models_endpoint  true             false: GET /v1/models answers 404
    health           true             false: GET /health answers 404
    root             ["reply turn 1", "reply turn 2", ...]
    root_by_query    [{"match": REGEX, "replies": [...]}]   first whose REGEX is found in the
                     first user message (the metadata, which holds the query) replaces `root`;
                     this scripts child runs (depth 2), whose query is a sub-prompt
    root_default     null             reply after the turns run out; null repeats the last one
    sub              [{"match": REGEX, "reply": "..."}]   first rule found in the user message;
                     the reply may use {prompt} (the whole prompt) and \\1 or \\g<name> (groups)
    sub_default      "ok"             reply when no rule matches ({prompt} allowed)
    faults           [{"when": "root"|"sub"|"any", "turn": K, "match": REGEX, "status": 500,
                       "times": 1 (0 = forever), "body": "message" | {...raw JSON...},
                       (status defaults to 500, except for faults that only shape a reply)
                       "retry_after": S, "malformed": true|"json"|"no_choices",
                       "no_usage": false, "usage": {...reported instead...},
                       "reasoning_only": false, "drop": false,
                       "delay_s": 0}]    first matching fault with uses left applies
    delay_s          0 | {"root": S, "sub": S}   per-call latency: delay before each chat reply
    tokens_per_s     null | R | {"root": R, "sub": R}   decode rate: a reply of N completion
                     tokens takes N / R more seconds (null: no decode time)
                     (both counted from when the request is served: the server's own work
                     on a reply is within them, not added to them)
    max_concurrency  null             at most this many chat requests served at once; the rest
                     wait in arrival order (their wait is part of their latency, as on vLLM)
    finish_reason    null             forces this finish_reason on every reply
    usage            true             false: replies carry no `usage`
    reasoning_content false           true: content "" and the reply in `reasoning_content`
    session_token    null             root replies carry `x-session-token: <this>` (llm-d style)
    server_header    null             every reply carries `x-served-by: <this>`

In Python, `Script(root_fn=lambda messages, turn: ..., sub_fn=lambda prompt: ...)` replace the
tables (they run on the server thread; keep them quick).

Routing: a chat request is a *root* request when its first message has role ``system``; its
turn is the number of ``assistant`` messages + 1. Any other request is a *sub* request.

Tokens (the same count everywhere: /tokenize, window checks, usage): a text is
ceil(utf-8 bytes / 4) tokens; a prompt is the sum over messages of (4 + its text's tokens),
plus 3 for the generation prompt. See `count_prompt_tokens`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["root", "sub"]

# Token accounting shared by `/tokenize`, window enforcement and `usage`, so that every
# number the fake server reports agrees with every other (as vLLM's do).
MESSAGE_OVERHEAD_TOKENS = 4  # role markers of the chat template, per message
GENERATION_PROMPT_TOKENS = 3  # "<|im_start|>assistant\n"
BYTES_PER_TOKEN = 4


def count_text_tokens(text: str) -> int:
    """ceil(len(utf-8 bytes) / 4): the scripted tokenizer."""
    # ASCII text is one byte per character: measured without encoding it (every root request
    # counts its whole conversation).
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    return -(-size // BYTES_PER_TOKEN)


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of an OpenAI parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def count_prompt_tokens(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> int:
    """Sum over messages of (4 + text tokens), plus 3 for the generation prompt."""
    total = sum(MESSAGE_OVERHEAD_TOKENS + count_text_tokens(message_text(m.get("content"))) for m in messages)
    return total + (GENERATION_PROMPT_TOKENS if add_generation_prompt else 0)


def cut_to_tokens(text: str, tokens: int) -> str:
    """The longest prefix of `text` that counts as at most `tokens` tokens."""
    return text.encode("utf-8")[: max(tokens, 0) * BYTES_PER_TOKEN].decode("utf-8", errors="ignore")


_GROUP_REF = re.compile(r"\\(\d+)|\\g<(\w+)>")


def render_reply(template: str, match: re.Match[str] | None, prompt: str) -> str:
    """Substitute `{prompt}` and `\\1` / `\\g<name>` group references, and nothing else.

    Not `str.format` nor `Match.expand`: replies are Python code full of braces and
    backslash escapes that must pass through untouched.
    """
    text = template.replace("{prompt}", prompt)
    if match is None:
        return text

    def group(m: re.Match[str]) -> str:
        key: int | str = int(m.group(1)) if m.group(1) is not None else m.group(2)
        try:
            return match.group(key) or ""
        except IndexError:
            return m.group(0)

    return _GROUP_REF.sub(group, text)


class RootScript(BaseModel):
    """Root replies for runs whose first user message (the metadata) matches `match`."""

    match: str
    replies: list[str]


class SubRule(BaseModel):
    """A sub-call reply for prompts in which the regex `match` is found."""

    match: str
    reply: str


class Fault(BaseModel):
    """An injected failure for matching requests, spent after `times` uses (0 = forever)."""

    when: Literal["root", "sub", "any"] = "any"
    turn: int | None = None  # root turn number; only root requests have one
    match: str | None = None  # regex searched in the last user message
    status: int | None = None  # default 500, unless the fault only shapes a normal reply
    times: int = 1
    body: str | dict[str, Any] | None = None  # dict: sent as JSON; str: the error message
    retry_after: float | None = None  # sent as a Retry-After header
    malformed: bool | Literal["json", "no_choices"] = False  # answer 200 with a broken body
    no_usage: bool = False  # a normal reply without `usage`
    usage: dict[str, Any] | None = None  # a normal reply reporting this `usage` (a server that counts wrong)
    reasoning_only: bool = False  # content "" and the reply in `reasoning_content`
    drop: bool = False  # close the connection without answering
    delay_s: float = 0.0  # extra delay before this fault's answer

    def error_status(self) -> int | None:
        """The HTTP error this fault answers with; None when it answers a (shaped) reply."""
        if self.status is not None:
            return None if self.status == 200 else self.status
        return None if (self.no_usage or self.usage is not None or self.reasoning_only or self.delay_s) else 500


class Script(BaseModel):
    """Everything a ScriptedLM does. Loadable from JSON (`Script.load(path)`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = "rlm-v0.1"
    base_model: str = "Qwen/Qwen3-30B-A3B-Instruct-2507"
    extra_models: list[str] = Field(default_factory=list)
    max_model_len: int = 16384
    tokenize: bool = True
    models_endpoint: bool = True
    health: bool = True

    root: list[str] = Field(default_factory=list)
    root_by_query: list[RootScript] = Field(default_factory=list)
    root_default: str | None = None  # after the last turn; None repeats the last reply
    sub: list[SubRule] = Field(default_factory=list)
    sub_default: str = "ok"
    # In-process only (never from JSON): override the tables above.
    root_fn: Callable[[list[dict[str, Any]], int], str] | None = Field(default=None, exclude=True)
    sub_fn: Callable[[str], str] | None = Field(default=None, exclude=True)

    faults: list[Fault] = Field(default_factory=list)
    delay_s: float | dict[str, float] = 0.0  # a number, or {"root": s, "sub": s}
    tokens_per_s: float | dict[str, float] | None = None  # decode rate; None: no decode time
    max_concurrency: int | None = Field(default=None, ge=1)  # chat requests served at once; the rest queue
    finish_reason: str | None = None  # overrides "stop"/"length" when set
    usage: bool = True
    reasoning_content: bool = False  # every reply as reasoning_content with empty content
    session_token: str | None = None  # root replies carry this `x-session-token` (as llm-d's scorer)
    server_header: str | None = None  # every reply carries `x-served-by: <this>` (which backend answered)

    @classmethod
    def load(cls, path: str | Path) -> Script:
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))

    def served_models(self) -> list[str]:
        return [self.base_model, self.model, *self.extra_models]

    def delay_for(self, role: Role) -> float:
        if isinstance(self.delay_s, dict):
            return float(self.delay_s.get(role, 0.0))
        return float(self.delay_s)

    def decode_s(self, role: Role, completion_tokens: int) -> float:
        """Seconds a reply of `completion_tokens` takes to decode at `tokens_per_s` (0 without a rate)."""
        rate = self.tokens_per_s.get(role) if isinstance(self.tokens_per_s, dict) else self.tokens_per_s
        return completion_tokens / rate if rate else 0.0

    def scripted_latency_s(self, role: Role, reply: str) -> float:
        """The time this script says a reply takes once served: its per-call latency plus its
        decode time (the wait for a `max_concurrency` slot not included)."""
        return self.delay_for(role) + self.decode_s(role, count_text_tokens(reply))


def classify(messages: list[dict[str, Any]]) -> tuple[Role, int | None]:
    """Root iff the first message is a system message; a root turn = assistant messages + 1."""
    if messages and messages[0].get("role") == "system":
        return "root", sum(1 for m in messages if m.get("role") == "assistant") + 1
    return "sub", None


def first_user_text(messages: list[dict[str, Any]]) -> str:
    return next((message_text(m.get("content")) for m in messages if m.get("role") == "user"), "")


def last_user_text(messages: list[dict[str, Any]]) -> str:
    return next((message_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")


class Replier:
    """Decides replies and faults for one server; thread-safe (faults are spent under a lock)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self._lock = threading.Lock()
        self._fault_uses = [0] * len(script.faults)

    def reply(self, messages: list[dict[str, Any]], role: Role, turn: int | None) -> str:
        s = self.script
        if role == "root":
            if s.root_fn is not None:
                return s.root_fn(messages, turn or 1)
            replies = s.root
            meta = first_user_text(messages)
            for entry in s.root_by_query:
                if re.search(entry.match, meta, re.DOTALL):
                    replies = entry.replies
                    break
            index = (turn or 1) - 1
            if index < len(replies):
                return replies[index]
            if s.root_default is not None or not replies:
                return s.root_default or ""
            return replies[-1]
        prompt = last_user_text(messages)
        if s.sub_fn is not None:
            return s.sub_fn(prompt)
        for rule in s.sub:
            m = re.search(rule.match, prompt, re.DOTALL)
            if m:
                return render_reply(rule.reply, m, prompt)
        return render_reply(s.sub_default, None, prompt)

    def take_fault(self, messages: list[dict[str, Any]], role: Role, turn: int | None) -> Fault | None:
        """The first matching fault with uses left, spending one use."""
        with self._lock:
            for i, f in enumerate(self.script.faults):
                if f.when not in ("any", role):
                    continue
                if f.turn is not None and f.turn != turn:
                    continue
                if f.match is not None and not re.search(f.match, last_user_text(messages), re.DOTALL):
                    continue
                if f.times and self._fault_uses[i] >= f.times:
                    continue
                self._fault_uses[i] += 1
                return f
        return None
