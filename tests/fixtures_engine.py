"""Engine test doubles: the sandbox kernel's own code run in-process, and a scripted chat model
(no Docker, no HTTP)."""

from __future__ import annotations

import builtins
import os
import sys
import threading
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
from rlm_mcp.engine import RunLimits, RunProgress, RunResult
from rlm_mcp.events import RunEvent, to_json
from rlm_mcp.ports import CellResult, ContextSpec, LMBridge, LMRequest
from rlm_mcp.ports.chat import CallRecord, Completion, LMContextLengthError
from rlm_mcp.sandbox.guest import frames, kernel
from rlm_mcp.sandbox.guest.capture import Capture
from rlm_mcp.sandbox.guest.namespace import make_namespace
from rlm_mcp.testing.settings import make_settings as make_settings  # re-exported: the one factory


class _KernelCrash(Exception):
    """Raised by `crash_kernel()` in cells: the sandbox is replaced (a restart), as when a real
    kernel dies."""


class InProcessKernel(kernel.Kernel):
    """The sandbox kernel's own code (rlm_mcp/sandbox/guest/kernel.py) run in this process: its
    namespace and helpers, cell execution (`handle_exec`), variable listing, answer reading, error
    formats and sub-call validation. Only its process plumbing is left out (fd capture, pipes,
    signals, reaping: those need the container and are tested in test_sandbox_*): `print` writes
    into the kernel's capture, and a sub-call frame is answered by the bridge at once."""

    def __init__(self, call: Callable[[dict[str, Any]], list[str]]) -> None:  # not Kernel.__init__
        self.pid = os.getpid()
        self.out_cap = Capture(1 << 20)
        self.err_cap = Capture(1 << 20)
        self.waiters: dict[int, frames.Waiter] = {}
        self.waiters_lock = threading.Lock()
        self.next_id = 0
        self.in_cell = self.interrupted = False
        self.show_vars_from = None
        self.max_batch, self.answer_max = 512, 8 << 20
        self.sent: list[dict[str, Any]] = []
        self._call = call
        self.ns = make_namespace(self)

    def send(self, obj: dict[str, Any]) -> None:
        if obj.get("type") == "lm_request":
            self.waiters.pop(obj["id"]).answer({"results": self._call(obj)})
        else:
            self.sent.append(obj)

    def _heal_fds(self) -> None: ...

    def _reap_zombies(self) -> None: ...

    def _reap_strays(self) -> None: ...

    def _settle_capture(self) -> None: ...

    def run(self, code: str, training_cell: bool) -> dict[str, Any]:
        """One cell through the kernel's own `handle_exec`; its exec_result frame."""
        self.handle_exec({"type": "exec", "id": 1, "code": code, "training_cell": training_cell})
        return self.sent.pop()


class FakeSandbox:
    """The `Sandbox` port over `InProcessKernel`: cells run on a worker thread like the real
    sandbox's, in the kernel's own namespace (`context`/`context_i`, the `answer` dict read at the
    end of each cell, sub-calls through the bridge, FINAL/FINAL_VAR, SHOW_VARS). Two test hooks
    are builtins (so the kernel never lists them): `block_forever()` (a stuck cell, until the
    sandbox closes) and `crash_kernel()` (the sandbox is replaced, every variable lost)."""

    def __init__(self, contexts: Sequence[ContextSpec]) -> None:
        self.contexts = list(contexts)
        self.closed = threading.Event()
        self.cells: list[str] = []
        self._bridge: LMBridge | None = None
        self.kernel = self._new_kernel()

    @property
    def ns(self) -> dict[str, Any]:
        return self.kernel.ns

    def _call(self, frame: dict[str, Any]) -> list[str]:
        bridge = self._bridge
        assert bridge is not None
        request = LMRequest(kind=frame["kind"], prompts=frame["prompts"], model=frame["model"])

        async def call() -> list[str]:  # from_thread.run takes a coroutine function
            return await bridge(request)

        return anyio.from_thread.run(call)

    def _new_kernel(self) -> InProcessKernel:
        box = InProcessKernel(self._call)
        for i, spec in enumerate(self.contexts):
            raw = Path(spec.path).read_bytes()
            box.handle_load({"type": "load_context", "id": i, "index": i, "raw": raw, "format": spec.format})

        def _print(
            *args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush: bool = False
        ) -> None:
            text = (" " if sep is None else sep).join(str(a) for a in args) + ("\n" if end is None else end)
            (box.err_cap if file is sys.stderr else box.out_cap).add(text.encode("utf-8", "surrogatepass"))

        def _block_forever() -> None:
            while not self.closed.wait(0.05):
                pass

        def _crash() -> None:
            raise _KernelCrash()

        hooks = {"print": _print, "block_forever": _block_forever, "crash_kernel": _crash}
        box.ns["__builtins__"] = {**vars(builtins), **hooks}
        return box

    def _exec(self, code: str, training_cell: bool = False) -> CellResult:
        frame = self.kernel.run(code, training_cell)
        if (frame["error"] or "").startswith(_KernelCrash.__name__):
            self.kernel = self._new_kernel()
            reason = "The kernel crashed (crash_kernel())."
            notice = (  # as sandbox/session.py reports a replaced sandbox
                f"{reason} The sandbox was replaced by a fresh one: all variables were lost; contexts reloaded "
                "(context, context_0, ...). Continue from there."
            )
            return CellResult(error=f"SandboxRestarted: {reason}", restarted=True, notice=notice)
        return CellResult(  # as sandbox/session.py builds it from the frame
            stdout=frame["stdout"],
            stderr=frame["stderr"],
            error=frame["error"],
            answer=frame["answer"],
            variables=list(frame["variables"]),
            trained_error=frame.get("trained_error"),
            variables_at_start=frame.get("variables_at_start"),
            duration_s=float(frame["duration"]),
        )

    async def add_contexts(self, contexts: Sequence[ContextSpec]) -> None:
        start = len(self.contexts)
        self.contexts.extend(contexts)
        for i, spec in enumerate(contexts, start):
            raw = await anyio.Path(spec.path).read_bytes()
            self.kernel.handle_load({"type": "load_context", "id": i, "index": i, "raw": raw, "format": spec.format})

    async def execute(self, code: str, bridge: LMBridge, *, training_cell: bool = False) -> CellResult:
        self.cells.append(code)
        self._bridge = bridge
        return await anyio.to_thread.run_sync(self._exec, code, training_cell, abandon_on_cancel=True)


class FakeSandboxFactory:
    def __init__(self) -> None:
        self.opened: list[FakeSandbox] = []
        self.closed = 0

    def __call__(self, contexts: Sequence[ContextSpec], *, levels_below: int = 0, kept: bool = False) -> Any:
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

    root: Sequence[Reply] | Callable[[list[dict[str, str]], int], Reply] = field(default_factory=list)
    sub: Callable[[str], str | BaseException] = lambda p: f"sub[{p[:30]}]"
    windows: dict[str, int] = field(default_factory=dict)
    default_window: int = 16384
    enforce_window: bool = True
    root_delay_s: float = 0.0
    count_skew: float = 1.0  # < 1 makes count_tokens under-report (server disagrees with us)
    tokenizer: Callable[[list[dict[str, str]]], int] = count_tokens  # the "server's" token count
    calls: list[Call] = field(default_factory=list)
    sessions_done: list[str] = field(default_factory=list)  # child runs' sessions, as told

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

    async def session_done(self, session: str) -> None:
        self.sessions_done.append(session)

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


def cell(code: str) -> str:
    """A reply that is one ```repl block and nothing else."""
    return f"```repl\n{code}\n```"


def submit(expr: str) -> str:
    """A reply whose one block sets the answer to `expr` and ends the run."""
    return cell(f'answer["content"] = {expr}\nanswer["ready"] = True')


def make_context(tmp_path: Path, text: str = "The magic number is 42. " * 10, name: str = "ctx") -> ContextSpec:
    path = tmp_path / f"{name}.txt"
    path.write_text(text, encoding="utf-8")
    return ContextSpec(
        path=path, format="text", kind="str", chars=len(text), bytes=len(text.encode()), name=name, context_id=name
    )


def make_limits(settings: Settings, **overrides: Any) -> RunLimits:
    values: dict[str, Any] = dict(
        max_iterations=settings.loop.max_iterations,
        max_depth=settings.loop.max_depth,
        timeout_s=settings.loop.timeout_s,
        token_budget=settings.loop.token_budget,
        max_errors=settings.loop.max_errors,
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
    engine = RLMEngine(settings.engine, lm, factory, system_prompt=system_prompt)
    result = await engine.run(
        run_id="run-1",
        query=query,
        contexts=list(contexts) if contexts is not None else [make_context(tmp_path)],
        limits=limits,
        progress=progress,
        emit=events,
    )
    return result, events, factory, progress


async def run_at_endpoint(
    tmp_path: Path,
    url: str,
    *,
    run_id: str,
    max_iterations: int,
    lm_retries: int,
    backoff_base_s: float,
    timeout_s: float,
) -> tuple[RunResult, list[RunEvent]]:
    """One engine run whose LM is the real client (`LMClient`) talking to the OpenAI-compatible
    endpoint at `url` (serving `rlm-v0.1`), with the project's system prompt and the in-process
    sandbox: the run's result and every event it emitted, in order. The one owner of that setup
    for tests whose endpoint is a loopback server of their own."""
    from rlm_mcp.engine import RLMEngine
    from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
    from rlm_mcp.lm.client import LMClient

    events: list[RunEvent] = []

    async def sink(event: RunEvent) -> None:
        events.append(event)

    settings = make_settings(
        tmp_path, base_url=url, model="rlm-v0.1", max_iterations=max_iterations, lm_retries=lm_retries
    )
    async with LMClient(settings.lm, backoff_base_s=backoff_base_s) as client:
        engine = RLMEngine(settings.engine, client, FakeSandboxFactory(), system_prompt=RLM_MCP_SYSTEM_PROMPT)
        limits = make_limits(settings, timeout_s=timeout_s)
        result = await engine.run(
            run_id=run_id,
            query="Count the parts.",
            contexts=[make_context(tmp_path)],
            limits=limits,
            progress=RunProgress(run_id=run_id, max_iterations=limits.max_iterations),
            emit=sink,
        )
    return result, events
