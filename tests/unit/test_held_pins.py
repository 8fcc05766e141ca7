"""`HeldPins`: one holder's pins in one state (`PinState`): taken by `in_use` or by a run's claim,
handed to the run, removed by a write of their own or by the holder's exit; what each state lets
`in_use`, `release` and a final write do."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.owners import Owner
from rlm_mcp.store.context_model import ContextInfo, HeldPins, PinState
from tests.fixtures_engine import make_settings

pytestmark = pytest.mark.anyio

ALICE = Owner("alice")


def info() -> ContextInfo:
    return ContextInfo(
        context_id="ctx_" + "0" * 24, name="c", bytes=1, sha256="0" * 64, format="text", kind="str",
        chars=1, created_at=0.0, last_used_at=0.0, source={},
    )  # fmt: skip


def state(held: HeldPins) -> PinState:
    """Read anew at each assert (a transition between two reads is what the tests check)."""
    return held.state


def test_a_fresh_holder_holds_nothing() -> None:
    held = HeldPins()
    assert state(held) is PinState.NONE and held.to_release is None and not held.released


def test_claimed_pins_are_handed_once_and_only_to_a_run() -> None:
    held = HeldPins.claimed("run_x/1", [info()])
    assert state(held) is PinState.CLAIMED and held.to_release == "run_x/1"
    assert not held.handed_over and held.claimed_infos() == [info()]
    held.hand_over()
    assert state(held) is PinState.HANDED and held.handed_over and held.to_release == "run_x/1"
    with pytest.raises(ValueError):
        held.hand_over()
    with pytest.raises(ValueError):
        HeldPins().hand_over()


def test_only_claimed_pins_come_with_the_contexts_their_pin_read() -> None:
    assert HeldPins().infos is None and HeldPins().claimed_infos() is None
    assert HeldPins.claimed("run_z/1", []).claimed_infos() == []


def test_a_write_that_removed_them_leaves_nothing_to_release() -> None:
    held = HeldPins.claimed("run_y/1", [info()])
    held.mark_removed()
    assert state(held) is PinState.REMOVED and held.released and held.to_release is None
    assert held.claimed_infos() is None


async def test_in_use_takes_the_pins_and_its_exit_removes_them(tmp_path: Path) -> None:
    async with make_stores(make_settings(tmp_path)) as stores:
        ctx = await stores.contexts.put_bytes(b"text", name="c", format="text", source={"kind": "text"}, owner=ALICE)
        held = HeldPins()
        async with stores.contexts.in_use([ctx.context_id], owner=ALICE, held=held) as infos:
            assert [i.context_id for i in infos] == [ctx.context_id]
            assert state(held) is PinState.HELD and held.to_release == held.pin_id
            with pytest.raises(RuntimeError):  # a holder's pins are used once
                async with stores.contexts.in_use([ctx.context_id], owner=ALICE, held=held):
                    pass
        assert state(held) is PinState.NONE and held.to_release is None
        await stores.contexts.release(held)  # nothing left: no statement
        assert state(held) is PinState.NONE


async def test_an_exit_after_the_write_removed_them_keeps_them_removed(tmp_path: Path) -> None:
    async with make_stores(make_settings(tmp_path)) as stores:
        ctx = await stores.contexts.put_bytes(b"text", name="c", format="text", source={"kind": "text"}, owner=ALICE)
        held = HeldPins()
        async with stores.contexts.in_use([ctx.context_id], owner=ALICE, held=held):
            held.mark_removed()  # as a final write that removed them says
        assert state(held) is PinState.REMOVED and held.released and held.to_release is None


async def test_release_lets_go_of_claimed_pins_never_used(tmp_path: Path) -> None:
    async with make_stores(make_settings(tmp_path)) as stores:
        held = HeldPins.claimed("run_y/1", [info()])
        await stores.contexts.release(held)
        assert state(held) is PinState.NONE and held.to_release is None
