"""A run that takes its slot at once pins its contexts beside its first LM call (the sandbox's
opening awaits the pin), not before it; what a caller sees is what it saw with the pin first:
a context gone since the call was admitted fails the call with the store's own error, before
any LM failure, and the pins hold while the run executes and go with its end."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.engine import RLMEngine
from rlm_mcp.errors import BadArgumentError, NotFoundError
from rlm_mcp.owners import Owner
from rlm_mcp.ports.chat import LMConnectionError
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits, make_settings, repl, submit

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")
TEXT = b"The magic number is 42."


async def _not_started(tmp_path: Path, lm: FakeChatModel, *, late: bool) -> tuple[BaseException | None, str]:
    """Start a run over a context deleted since its admission read it; its `not_started` and
    its stored record's status."""
    await anyio.Path(tmp_path).mkdir()
    settings = make_settings(tmp_path)
    engine = RLMEngine(settings.engine, lm, FakeSandboxFactory())
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(TEXT, name="ctx", format="text", source={"kind": "text"}, owner=ALICE)
        spec = stores.contexts.spec(info)  # what the admission read
        assert await stores.contexts.delete(info.context_id, owner=ALICE)
        async with RunManager(
            settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server)
        ) as runs:
            request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
            run = await runs.start(request, engine, contexts=[spec] if late else None)
            with anyio.fail_after(30):
                await run.done.wait()
            record = await stores.runs.read_summary(run.run_id, owner=ALICE)
            return run.not_started, record.status


async def test_a_context_gone_since_admission_fails_the_call_as_when_pinned_first(tmp_path: Path) -> None:
    late, late_status = await _not_started(tmp_path / "late", FakeChatModel(root=[submit("'42'")]), late=True)
    first, first_status = await _not_started(tmp_path / "first", FakeChatModel(root=[submit("'42'")]), late=False)
    assert isinstance(late, NotFoundError) and isinstance(first, NotFoundError)
    assert str(late) == str(first)
    assert late_status == first_status == "error"


async def test_the_pins_failure_comes_before_an_lm_failure(tmp_path: Path) -> None:
    down = LMConnectionError("nothing answers at http://fake/v1")
    late, _ = await _not_started(tmp_path / "late", FakeChatModel(root=[down]), late=True)
    assert isinstance(late, NotFoundError)


async def test_the_contexts_are_pinned_while_the_run_executes_and_released_with_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    refused: list[str] = []
    async with make_stores(settings) as stores:
        info = await stores.contexts.put_bytes(TEXT, name="ctx", format="text", source={"kind": "text"}, owner=ALICE)

        def second_turn(messages: list[dict[str, str]], index: int) -> str:
            return repl("print(1)") if index == 0 else submit("'42'")

        lm = FakeChatModel(root=second_turn, root_delay_s=0.05)
        engine = RLMEngine(settings.engine, lm, FakeSandboxFactory())
        async with RunManager(
            settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server)
        ) as runs:
            request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=ALICE)
            run = await runs.start(request, engine, contexts=[stores.contexts.spec(info)])
            with anyio.fail_after(30):
                while len(lm.root_calls) < 2:  # the first reply was taken: the sandbox opened, pinned
                    await anyio.lowlevel.checkpoint()
            try:
                await stores.contexts.delete(info.context_id, owner=ALICE)
            except BadArgumentError as exc:
                refused.append(str(exc))
            with anyio.fail_after(30):
                await run.done.wait()
            assert run.result is not None and run.result.status == "completed"
            with anyio.fail_after(30):
                while True:  # released once the answer is on its way (a few loop rounds after)
                    try:
                        deleted = await stores.contexts.delete(info.context_id, owner=ALICE)
                        break
                    except BadArgumentError:
                        await anyio.lowlevel.checkpoint()
    assert len(refused) == 1 and refused[0].startswith(f"Context '{info.context_id}' is in use by a running run.")
    assert deleted
