"""Issue 14 items 1 and 9: recursion never deadlocks on child slots or sandbox slots, and one bad
prompt fails only itself.

Real Docker sandboxes, the real LM client and the scripted OpenAI-compatible server. Every run
executes the same cell: at level L (read from its context) it fans out to `FAN` children with
`rlm_query_batched` until the depth limit, and answers with the number of leaves below it.
Before the fix, children held the tree-wide child slots (and the sandbox slots) while their
own children waited for them: these runs hung until their timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from rlm_mcp.engine import RLMEngine, RunLimits, RunProgress, RunResult
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.events import RunEvent
from rlm_mcp.lm.client import LMClient
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.sandbox.slots import SandboxSlots
from rlm_mcp.testing import ScriptedLM
from tests.fixtures_sandbox import sandbox_settings, text_context

pytestmark = pytest.mark.anyio

FAN_OUT_CELL = """```repl
import re
m = re.match(r"LEVEL (\\d+)", context)
level = int(m.group(1)) if m else 0
if level + 1 < {depth}:
    kids = rlm_query_batched(["LEVEL %d child %d" % (level + 1, i) for i in range({fan})])
    leaves = sum(int(k) for k in kids)  # an "Error: ..." string fails the cell, visibly
else:
    leaves = 1
answer["content"] = str(leaves)
answer["ready"] = True
```"""


async def _run_tree(engine: RLMEngine, tmp_path: Path, name: str, depth: int) -> RunResult:
    limits = RunLimits(max_iterations=2, max_depth=depth, timeout_s=240, token_budget=None, max_errors=2)
    events: list[RunEvent] = []

    async def sink(event: RunEvent) -> None:
        events.append(event)

    return await engine.run(
        run_id=name,
        query="How many leaves?",
        contexts=[text_context(tmp_path, "ROOT", f"{name}.txt")],
        limits=limits,
        progress=RunProgress(run_id=name, max_iterations=2),
        emit=sink,
    )


def _settings(base_url: str, **overrides: Any) -> Any:
    values: dict[str, Any] = dict(
        base_url=base_url,
        model="rlm-v0.1",
        sub_model=None,
        lm_retries=1,
        cell_timeout_s=120,
        max_sandboxes=4,
        max_concurrent_children=2,
        pool_size=2,
    )
    values.update(overrides)
    return sandbox_settings(**values)


@pytest.mark.usefixtures("docker_image")
async def test_depth_4_fan_out_above_every_limit_completes(tmp_path: Path) -> None:
    # 1 + 2 + 4 + 8 runs, at most 2 children per depth and 4 sandboxes at once.
    async with ScriptedLM({"root": [FAN_OUT_CELL.format(depth=4, fan=2)]}) as server:
        settings = _settings(server.base_url)
        async with LMClient(settings) as lm, SandboxManager(settings) as sandboxes:
            engine = RLMEngine(settings.engine, lm, sandboxes.open, system_prompt=RLM_MCP_SYSTEM_PROMPT)
            result = await _run_tree(engine, tmp_path, "deep", depth=4)
    assert result.status == "completed", result.reason
    assert result.answer == "8"


@pytest.mark.usefixtures("docker_image")
async def test_two_fanning_trees_do_not_starve_a_third_run(tmp_path: Path) -> None:
    # Two depth-3 trees with fan-out 3 (13 runs each) and a plain run, all at once, on 4 sandboxes.
    script = {
        "root": [FAN_OUT_CELL.format(depth=3, fan=3)],
        "root_by_query": [
            {"match": "plain run", "replies": ['```repl\nanswer["content"] = "plain"\nanswer["ready"] = True\n```']}
        ],
    }
    results: dict[str, RunResult] = {}
    async with ScriptedLM(script) as server:
        settings = _settings(server.base_url)
        async with LMClient(settings) as lm, SandboxManager(settings) as sandboxes:
            engine = RLMEngine(settings.engine, lm, sandboxes.open, system_prompt=RLM_MCP_SYSTEM_PROMPT)

            async def tree(name: str) -> None:
                results[name] = await _run_tree(engine, tmp_path, name, depth=3)

            async def plain() -> None:
                limits = RunLimits(max_iterations=2, max_depth=1, timeout_s=240, token_budget=None, max_errors=2)

                async def sink(event: RunEvent) -> None:
                    pass

                results["plain"] = await engine.run(
                    run_id="plain",
                    query="plain run",
                    contexts=[text_context(tmp_path, "x", "plain.txt")],
                    limits=limits,
                    progress=RunProgress(run_id="plain", max_iterations=2),
                    emit=sink,
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(tree, "a")
                tg.start_soon(tree, "b")
                tg.start_soon(plain)
            assert sandboxes._slots.free == settings.max_sandboxes  # every slot came back
    assert {k: (r.status, r.answer) for k, r in results.items()} == {
        "a": ("completed", "9"),
        "b": ("completed", "9"),
        "plain": ("completed", "plain"),
    }


async def test_slots_keep_room_for_descendants_and_serve_the_deepest_first() -> None:
    slots = SandboxSlots(3)
    await slots.acquire(2)  # a root of a depth-3 tree: 2 slots stay free for its descendants
    granted: list[str] = []

    async def want(name: str, levels_below: int) -> None:
        await slots.acquire(levels_below)
        granted.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(want, "second root", 2)  # would leave 1 free, fewer than its 2 levels: waits
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(want, "child", 1)  # leaves 1 free for its one level below: granted
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(want, "grandchild", 0)  # the last slot: granted
        await anyio.wait_all_tasks_blocked()
        assert granted == ["child", "grandchild"] and slots.free == 0
        slots.release()  # the grandchild ends: 1 free, still not enough for the waiting root
        await anyio.wait_all_tasks_blocked()
        assert granted == ["child", "grandchild"]
        slots.release()  # the child ends: 2 free, still short of 3
        await anyio.wait_all_tasks_blocked()
        assert granted == ["child", "grandchild"]
        slots.release()  # the first root ends: the second root fits
    assert granted == ["child", "grandchild", "second root"] and slots.free == 2


async def test_a_depth_the_cap_can_never_hold_is_refused_at_once() -> None:
    from rlm_mcp.errors import SandboxError

    with pytest.raises(SandboxError, match="RLM_MCP_MAX_SANDBOXES"):
        await SandboxSlots(2).acquire(2)


@pytest.mark.usefixtures("docker_image")
async def test_a_lone_surrogate_in_a_prompt_reaches_the_child_as_valid_text_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_dir))  # where child prompts are written
    cell = """```repl
rs = rlm_query_batched(["fine one", "bad \\ud800 one", "fine two"])
answer["content"] = " | ".join(r[:60] for r in rs)
answer["ready"] = True
```"""
    leaf = '```repl\nanswer["content"] = "leaf:" + context\nanswer["ready"] = True\n```'
    script = {"root": [leaf], "root_by_query": [{"match": "surrogate", "replies": [cell]}]}
    async with ScriptedLM(script) as server:
        settings = _settings(server.base_url)
        async with LMClient(settings) as lm, SandboxManager(settings) as sandboxes:
            engine = RLMEngine(settings.engine, lm, sandboxes.open, system_prompt=RLM_MCP_SYSTEM_PROMPT)
            limits = RunLimits(max_iterations=2, max_depth=2, timeout_s=120, token_budget=None, max_errors=2)

            async def sink(event: RunEvent) -> None:
                pass

            result = await engine.run(
                run_id="s",
                query="surrogate",
                contexts=[text_context(tmp_path, "x", "s.txt")],
                limits=limits,
                progress=RunProgress(run_id="s", max_iterations=2),
                emit=sink,
            )
    assert result.status == "completed", result.reason
    # The host's frame parser makes every string from the sandbox valid text (U+FFFD for the lone
    # surrogate), so the prompt runs like the others instead of failing.
    assert (result.answer or "").split(" | ") == ["leaf:fine one", "leaf:bad \ufffd one", "leaf:fine two"]
    assert list(temp_dir.iterdir()) == []
