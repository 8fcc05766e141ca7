"""A `both` replica's local lane (`service/queue/local.py`), alone: which runs its worker takes,
what it hands the front, and when the front falls back to the queue's path."""

from __future__ import annotations

from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.service.queue.local import LocalLane
from tests.fixtures_queue_team import final, summary


def _lane(room: int | None = 7) -> tuple[LocalLane, list[tuple[str, RunRecord]], list[str]]:
    lane = LocalLane(window_s=1.0)
    delivered: list[tuple[str, RunRecord]] = []
    fell_back: list[str] = []
    lane.room = lambda: room
    lane.deliver = lambda run_id, record: delivered.append((run_id, record))
    lane.fall_back = fell_back.append
    return lane, delivered, fell_back


def test_an_offer_is_made_only_when_the_worker_has_room() -> None:
    lane, _, _ = _lane(room=None)
    assert lane.offer("run_a") is None
    assert not lane.take("run_a")  # claimed all the same (by the queue's path): not the lane's
    lane, _, _ = _lane(room=7)
    assert lane.offer("run_a") == 7 and lane.take("run_a")


def test_a_taken_run_is_handed_over_to_its_end_and_needs_no_fall_back() -> None:
    lane, delivered, fell_back = _lane()
    lane.offer("run_a")
    assert lane.take("run_a")
    running, ended = summary("run_a", status="running"), final("run_a")
    lane.announce("run_a", running)
    lane.announce("run_a", ended)
    lane.released("run_a")
    assert delivered == [("run_a", running), ("run_a", ended)] and fell_back == []
    assert not lane.lapsed("run_a")  # its window's end: nothing to do
    lane.announce("run_a", running)  # released: nothing more is handed over
    assert len(delivered) == 2


def test_a_taken_run_released_without_its_final_record_falls_back() -> None:
    lane, delivered, fell_back = _lane()
    lane.offer("run_a")
    lane.take("run_a")
    lane.announce("run_a", summary("run_a", status="running"))
    lane.released("run_a")  # stopped by its fence, handed back, ended elsewhere
    assert fell_back == ["run_a"] and len(delivered) == 1


def test_an_offer_not_taken_in_its_window_lapses_once_and_is_never_taken_after() -> None:
    lane, delivered, fell_back = _lane()
    lane.offer("run_a")
    assert lane.lapsed("run_a") and not lane.lapsed("run_a")
    assert not lane.take("run_a")  # claimed late: the front follows it through the queue already
    lane.announce("run_a", final("run_a"))
    lane.released("run_a")
    assert delivered == [] and fell_back == []


def test_a_withdrawn_offer_is_not_taken() -> None:
    lane, _, _ = _lane()
    lane.offer("run_a")
    lane.withdraw("run_a")  # its enqueue failed
    assert not lane.take("run_a") and not lane.lapsed("run_a")
