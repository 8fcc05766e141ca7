"""`rlm_query` below the depth limit: a child RLM over the prompt, in its own sandbox, sharing the tree."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from rlm_mcp.config import EngineSettings
from rlm_mcp.engine.bridge import ChildRunner
from rlm_mcp.engine.formatting import head_tail
from rlm_mcp.engine.tree import RunTree
from rlm_mcp.engine.types import RunProgress, RunResult
from rlm_mcp.events import ChildEnd, ChildStart
from rlm_mcp.file_work import small_here
from rlm_mcp.observability import tracing
from rlm_mcp.ports import ChatModel, ContextSpec

# `RLMEngine._run`: the tree, then depth, run_id, query, contexts and progress by keyword.
RunOne = Callable[..., Awaitable[RunResult]]


def child_runner(
    run: RunOne, lm: ChatModel, settings: EngineSettings, tree: RunTree, parent_run_id: str
) -> ChildRunner:
    """What `rlm_query` runs when depth allows: a full RLM over the prompt, in its own sandbox."""

    async def run_child(prompt: str, depth: int) -> str:
        try:
            data = prompt.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: refuse this prompt only
            return (
                f"Error: this rlm_query prompt is not valid text (an unpaired surrogate at index {exc.start}); "
                "remove it, e.g. text.encode('utf-8', 'replace').decode()."
            )
        tree.child_count += 1
        tree.progress.children = tree.child_count
        child_id = f"{parent_run_id}.{tree.child_count}"
        path = await small_here(len(data), lambda: _write_temp_context(data))
        try:
            spec = ContextSpec(
                path=path, format="text", kind="str", chars=len(prompt), bytes=len(data), name="rlm_query prompt"
            )
            child_progress = RunProgress(run_id=child_id, max_iterations=tree.limits.max_iterations)
            child_progress.usage = tree.usage  # one Usage for the whole tree
            where = tree.where(parent_run_id)  # the parent's cell and the sub-call slot
            await tree.emit(
                ChildStart(
                    child_run_id=child_id,
                    parent_run_id=parent_run_id,
                    iteration=where.iteration,
                    block=where.block,
                    batch=where.batch,
                    index=where.index,
                    prompt=head_tail(prompt, settings.log_sub_call_chars),
                    prompt_chars=len(prompt),
                    depth=depth,
                    status="running",
                )
            )
            with tracing.span("rlm.child", {"rlm.run.id": child_id, "rlm.depth": depth}) as span:
                result = await run(
                    tree, depth=depth, run_id=child_id, query=None, contexts=[spec], progress=child_progress
                )
                span.set_attribute("rlm.run.status", result.status)
            await tree.emit(
                ChildEnd(
                    child_run_id=child_id,
                    parent_run_id=parent_run_id,
                    depth=depth,
                    status=result.status,
                    answer=head_tail(result.answer or "", settings.log_sub_call_chars),
                    answer_chars=len(result.answer or ""),
                )
            )
        finally:
            with anyio.CancelScope(shield=True):
                await small_here(len(data), lambda: _unlink(path))
                await lm.session_done(child_id)  # its router session, if one counts them
        if result.answer is not None and (result.status == "completed" or result.answer):
            return result.answer
        return f"Error: the recursive RLM call ended with status {result.status}: {result.reason or 'no answer'}"

    return run_child


def _write_temp_context(data: bytes) -> Path:
    fd, name = tempfile.mkstemp(prefix="rlm-mcp-child-", suffix=".txt")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except BaseException:
        _unlink(Path(name))  # a failed write (disk full) leaves no file behind
        raise
    return Path(name)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
