"""Fakes for engine tests: an in-process sandbox and a scripted chat model (no Docker, no HTTP)."""

from __future__ import annotations

import io
import json
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from rlm_mcp.config import Settings
from rlm_mcp.engine import RunLimits, RunProgress
from rlm_mcp.events import RunEvent, to_json
from rlm_mcp.lm.errors import LMContextLengthError
from rlm_mcp.lm.types import CallRecord, Completion
from rlm_mcp.ports import CellResult, ContextSpec, LMBridge, LMRequest
from rlm_mcp.sandbox.guest.answer_rules import new_answer, read_answer, submit_answer, submit_variable
from rlm_mcp.testing.settings import make_settings as make_settings  # re-exported: the one factory

_SIMPLE = (str, int, float, bool, list, dict, tuple)


class _KernelCrash(BaseException):
    """Raised by `crash_kernel()` in fake cells: the fake replaces its namespace (a restart)."""


class FakeSandbox:
    """Runs cells with exec() in a dict namespace on a worker thread, like the real kernel:
    `context`/`context_i`, the `answer` dict read at the END of each cell, sub-calls through
    the bridge, FINAL/FINAL_VAR helpers, SHOW_VARS."""

    def __init__(self, contexts: Sequence[ContextSpec]) -> None:
        self.contexts = list(contexts)
        self.closed = threading.Event()
        self.cells: list[str] = []
        self._bridge: LMBridge | None = None
        self._out: io.StringIO = io.StringIO()
        self.ns: dict[str, Any] = {}
        self._reset()

    def _reset(self) -> None:
        # `answer` first, then the contexts: the order the real kernel (and the reference) lists.
        ns: dict[str, Any] = {"__name__": "__main__", "answer": new_answer()}
        for i, spec in enumerate(self.contexts):
            raw = Path(spec.path).read_text(encoding="utf-8")
            ns[f"context_{i}"] = json.loads(raw) if spec.format == "json" else raw
        if self.contexts:
            ns["context"] = ns["context_0"]

        def _print(*args: Any, sep: str = " ", end: str = "\n", file: Any = None, flush: bool = False) -> None:
            self._out.write(sep.join(str(a) for a in args) + end)

        def _call(kind: str, prompts: list[str], model: str | None) -> list[str]:
            assert self._bridge is not None
            return anyio.from_thread.run(self._bridge, LMRequest(kind=kind, prompts=list(prompts), model=model))  # type: ignore[arg-type]

        ns["print"] = _print
        ns["llm_query"] = lambda prompt, model=None: _call("llm", [prompt], model)[0]
        ns["llm_query_batched"] = lambda prompts, model=None: _call("llm", prompts, model)
        ns["rlm_query"] = lambda prompt, model=None: _call("rlm", [prompt], model)[0]
        ns["rlm_query_batched"] = lambda prompts, model=None: _call("rlm", prompts, model)
        ns["SHOW_VARS"] = lambda: "Available variables: " + str(self._variables())

        ns["FINAL"] = lambda value: submit_answer(ns, value)
        ns["FINAL_VAR"] = lambda name: submit_variable(ns, name)

        def _block_forever() -> None:  # a stuck cell; ends when the sandbox is closed
            while not self.closed.wait(0.05):
                pass

        def _crash() -> None:
            raise _KernelCrash()

        ns["block_forever"] = _block_forever
        ns["crash_kernel"] = _crash
        self.ns = ns

    def _variables(self) -> list[str]:
        return [k for k, v in self.ns.items() if not k.startswith("_") and isinstance(v, _SIMPLE)]

    def _answer(self) -> dict[str, Any] | None:
        return read_answer(self.ns, 8 << 20)  # the kernel's own rule

    def _exec(self, code: str, training_cell: bool = False) -> CellResult:
        self._out = io.StringIO()
        snapshot = dict(self.ns) if training_cell else None
        started = time.monotonic()
        error = None
        stderr = ""
        restarted = False
        try:
            exec(compile(code, "<cell>", "exec"), self.ns)  # the fake kernel: runs the cell in-process
        except _KernelCrash:
            self._reset()
            restarted = True
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            stderr = traceback.format_exc(limit=1)
            if snapshot is not None:
                self.ns.clear()
                self.ns.update(snapshot)
        return CellResult(
            stdout=self._out.getvalue(),
            stderr=stderr,
            error=error,
            answer=self._answer(),
            variables=self._variables(),
            duration_s=time.monotonic() - started,
            restarted=restarted,
        )

    async def execute(self, code: str, bridge: LMBridge, *, training_cell: bool = False) -> CellResult:
        self.cells.append(code)
        self._bridge = bridge
        return await anyio.to_thread.run_sync(self._exec, code, training_cell, abandon_on_cancel=True)


class FakeSandboxFactory:
    def __init__(self) -> None:
        self.opened: list[FakeSandbox] = []
        self.closed = 0

    def __call__(self, contexts: Sequence[ContextSpec], *, levels_below: int = 0) -> Any:
        @asynccontextmanager
        async def _cm() -> AsyncIterator[FakeSandbox]:
            box = FakeSandbox(contexts)
            self.opened.append(box)
            try:
                yield box
            finally:
                box.closed.set()
                self.closed += 1

        return _cm()


def count_tokens(messages: list[dict[str, str]]) -> int:
    """The fake tokenizer: ~4 chars a token plus a per-message template overhead."""
    return sum(len(m["content"]) // 4 + 4 for m in messages) + 3


Reply = str | tuple[str, str | None] | BaseException


@dataclass
class Call:
    messages: list[dict[str, str]]
    model: str
    max_tokens: int
    role: str
    session: str | None = None  # the routing key a root call carried (its run id)


@dataclass
class FakeChatModel:
    """A ChatModel: root replies by turn (a list, or a function of the messages), sub replies by
    rule; enforces each model's window like vLLM (prompt + max_tokens > window -> 400)."""

    root: list[Reply] | Callable[[list[dict[str, str]], int], Reply] = field(default_factory=list)
    sub: Callable[[str], str | BaseException] = lambda p: f"sub[{p[:30]}]"
    windows: dict[str, int] = field(default_factory=dict)
    default_window: int = 16384
    enforce_window: bool = True
    root_delay_s: float = 0.0
    count_skew: float = 1.0  # < 1 makes count_tokens under-report (server disagrees with us)
    tokenizer: Callable[[list[dict[str, str]]], int] = count_tokens  # the "server's" token count
    calls: list[Call] = field(default_factory=list)

    @property
    def root_calls(self) -> list[Call]:
        return [c for c in self.calls if c.role == "root"]

    @property
    def sub_calls(self) -> list[Call]:
        return [c for c in self.calls if c.role == "sub"]

    async def window(self, model: str, *, role: str = "root") -> int:
        return self.windows.get(model, self.default_window)

    async def window_known(self, model: str, *, role: str = "root") -> bool:
        return True

    async def count_tokens(self, messages: list[dict[str, str]], *, model: str, role: str = "root") -> int:
        return int(self.tokenizer(messages) * self.count_skew)

    async def complete(
        self, messages: list[dict[str, str]], *, model: str, max_tokens: int, role: str, session: str | None = None
    ) -> Completion:
        self.calls.append(Call([dict(m) for m in messages], model, max_tokens, role, session))
        prompt_tokens = self.tokenizer(messages)
        if self.enforce_window and prompt_tokens + max_tokens > await self.window(model):
            err = LMContextLengthError(
                f"This model's maximum context length is {await self.window(model)} tokens; "
                f"the request has {prompt_tokens} input tokens and max_tokens {max_tokens}.",
                endpoint="http://fake/v1",
                status=400,
            )
            # As LMClient.complete does: the failed call, as accounted (it counts as a call).
            err.record = CallRecord(model, 0, 0, 0.0, "error", "root" if role == "root" else "sub", error=str(err))
            raise err
        if role == "root":
            if self.root_delay_s:
                await anyio.sleep(self.root_delay_s)
            index = len(self.root_calls) - 1
            reply: Reply
            if callable(self.root):
                reply = self.root(messages, index)
            else:
                reply = self.root[index] if index < len(self.root) else "I am still thinking."
        else:
            await anyio.lowlevel.checkpoint()
            reply = self.sub(messages[-1]["content"])
        if isinstance(reply, BaseException):
            raise reply
        text, finish = (reply, "stop") if isinstance(reply, str) else reply
        record = CallRecord(
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(text) // 4 + 1,
            latency_s=0.0,
            status="ok",
            role="root" if role == "root" else "sub",
        )
        return Completion(text=text, finish_reason=finish, record=record)


def repl(code: str, prose: str = "Let me look.") -> str:
    """A reply with one ```repl block."""
    return f"{prose}\n```repl\n{code}\n```"


def make_context(tmp_path: Path, text: str = "The magic number is 42. " * 10, name: str = "ctx") -> ContextSpec:
    path = tmp_path / f"{name}.txt"
    path.write_text(text, encoding="utf-8")
    return ContextSpec(
        path=path, format="text", kind="str", chars=len(text), bytes=len(text.encode()), name=name, context_id=name
    )


def make_limits(settings: Settings, **overrides: Any) -> RunLimits:
    values: dict[str, Any] = dict(
        max_iterations=settings.max_iterations,
        max_depth=settings.max_depth,
        timeout_s=settings.timeout_s,
        token_budget=settings.token_budget,
        max_errors=settings.max_errors,
    )
    values.update(overrides)
    return RunLimits(**values)


@dataclass
class Events:
    """An event sink that keeps each event and the JSON object the run log would hold of it
    (`items`, what the assertions read: the on-disk shape is what users and tools see)."""

    typed: list[RunEvent] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, event: RunEvent) -> None:
        self.typed.append(event)
        self.items.append(to_json(event))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.items if e["type"] == kind]


async def run_engine(
    tmp_path: Path,
    lm: FakeChatModel,
    *,
    contexts: Sequence[ContextSpec] | None = None,
    query: str = "What is the magic number?",
    settings: Settings | None = None,
    system_prompt: str = "SYSTEM",
    factory: FakeSandboxFactory | None = None,
    **limit_overrides: Any,
) -> tuple[Any, Events, FakeSandboxFactory, RunProgress]:
    from rlm_mcp.engine import RLMEngine

    settings = settings or make_settings()
    factory = factory or FakeSandboxFactory()
    limits = make_limits(settings, **limit_overrides)
    progress = RunProgress(run_id="run-1", max_iterations=limits.max_iterations)
    events = Events()
    engine = RLMEngine(settings, lm, factory, system_prompt=system_prompt)
    result = await engine.run(
        run_id="run-1",
        query=query,
        contexts=list(contexts) if contexts is not None else [make_context(tmp_path)],
        limits=limits,
        progress=progress,
        emit=events,
    )
    return result, events, factory, progress
