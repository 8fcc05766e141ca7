"""The contracts the engine talks to: a chat model and a sandbox.

The engine never imports Docker or an HTTP client; the service wires the real `lm` and
`sandbox` layers in, and engine tests wire in a scripted model and an in-process sandbox.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # the LM layer is not loaded at run time: importing a port loads nothing else
    from rlm_mcp.events import CallRole, SubCallKind
    from rlm_mcp.ports.chat import Completion

# How a context's bytes are read: text (a str in the sandbox) or JSON (a list or dict there).
ContextFormat = Literal["text", "json"]
# The Python type a context has inside the sandbox: a str (text), or a list or dict (JSON).
ContextKind = Literal["str", "list", "dict"]


@dataclass(frozen=True)
class ContextSpec:
    """A stored context, as a sandbox loads it and as the metadata message describes it."""

    path: Path  # file holding the bytes: UTF-8 text, or a JSON document when format == "json"
    format: ContextFormat
    kind: ContextKind  # the Python type `context_i` has inside the sandbox
    chars: int  # total length in characters (what the metadata message reports)
    bytes: int
    name: str = ""
    context_id: str = ""


@dataclass(frozen=True)
class LMRequest:
    """A sub-call asked for by code inside the sandbox (`llm_query*` or `rlm_query*`)."""

    kind: SubCallKind
    prompts: list[str]
    model: str | None = None


# Answers one request: one string per prompt, in order. Failures are strings starting with
# "Error: " (the code sees them as text, never as exceptions); it must not raise.
LMBridge = Callable[[LMRequest], Awaitable[list[str]]]


@dataclass
class CellResult:
    """What one executed cell produced, already size-capped by the sandbox."""

    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # "ExcType: message" plus traceback when the cell raised
    answer: dict[str, Any] | None = None  # {"content": str | None, "ready": bool} at end of cell
    variables: list[str] = field(default_factory=list)
    # When the cell raised: the error as the training harness showed it ("\nType: message\n" and
    # the traceback), and the variables that existed before the cell (what training listed).
    trained_error: str | None = None
    variables_at_start: list[str] | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    restarted: bool = False  # the sandbox was replaced: every variable of earlier cells is gone
    notice: str | None = None  # a host-side explanation for the model (why it was killed, ...)


class Sandbox(Protocol):
    """One run's private REPL, with its contexts already loaded."""

    async def execute(self, code: str, bridge: LMBridge, *, training_cell: bool = False) -> CellResult:
        """Run one cell. `training_cell`: run it as the training harness ran cells (a cell that
        raises leaves the namespace as it found it; SHOW_VARS() lists the names it started with)."""
        ...

    async def add_contexts(self, contexts: Sequence[ContextSpec]) -> None:
        """Bind `contexts` after those already loaded, as the next `context_i` (a kept session's
        follow-up run); a restart reloads them with the others."""
        ...


class SandboxFactory(Protocol):
    """Opens a sandbox with these contexts loaded as context_0, context_1, ... (`context` = first);
    closing it releases the container. Raises `rlm_mcp.errors.RlmMcpError` subclasses on failure.

    `levels_below` is how many levels of child runs the run may still start below it (each
    opens a sandbox of its own while this one stays open): a capped factory keeps that many
    slots free for them, so recursion cannot deadlock on the cap. `kept`: the sandbox outlives
    its run (a kept session's REPL), idle between runs.
    """

    def __call__(
        self, contexts: Sequence[ContextSpec], *, levels_below: int = 0, kept: bool = False
    ) -> AbstractAsyncContextManager[Sandbox]: ...


@runtime_checkable
class ChatModel(Protocol):
    """The LM endpoint as the engine needs it."""

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        max_tokens: int,
        role: CallRole,
        session: str | None = None,
    ) -> Completion:
        """`session`: the run id the call is made in: a root call's replica-routing key; for a
        sub-call, only which run tree made it (routers that count sessions key on a few per tree)."""
        ...

    async def session_done(self, session: str) -> None:
        """The run whose root calls carried `session` ended inside its tree (a child RLM): a
        router counting sessions may be told now rather than at the tree's end. Never raises."""
        ...

    # `role` picks the endpoint: root calls' or sub-calls' (they may be different servers).
    async def window(self, model: str, *, role: CallRole = "root") -> int: ...

    async def window_known(self, model: str, *, role: CallRole = "root") -> bool:
        """True when `window(model)` is the server's real window (a setting, or discovered),
        False when it is only the 16384 fallback."""
        ...

    async def count_tokens(self, messages: list[dict[str, str]], *, model: str, role: CallRole = "root") -> int: ...
