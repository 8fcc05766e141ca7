"""The run contract (rlm_mcp.ports.runs): records of the first release read, the stored shape keeps
its keys, the live summary's encoding is bounded and reads the first release's payloads, notices
are facts rendered once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rlm_mcp.owners import Owner
from rlm_mcp.ports.runs import (
    FINAL_MARK,
    FINAL_MAX_BYTES,
    LIVE_MAX_BYTES,
    RECORD_VERSION,
    LiveSummary,
    Notice,
    NoticeKind,
    RunLimits,
    RunRecord,
    RunRequest,
    Usage,
    WorkerRef,
    decode_announcement,
    decode_live,
    encode_final,
    encode_live,
    may_requeue,
    new_run_id,
    render_notices,
)

USAGE = {
    "total": {"prompt_tokens": 10, "completion_tokens": 5, "calls": 2},
    "by_model": {"m": {"prompt_tokens": 10, "completion_tokens": 5, "calls": 2}},
}
# A finished run's summary.json as the first release wrote it (key for key).
FIRST_RELEASE_FINISHED: dict[str, Any] = {
    "run_id": "run_0123456789abcdef0123",
    "query": "What is it?",
    "context_ids": ["ctx_a"],
    "owner": "tok_1",
    "limits": {"max_iterations": 30, "max_depth": 1, "timeout_s": 900, "token_budget": None, "max_errors": 5},
    "created_at": 1764000000.5,
    "model": "rlm-v0.1",
    "status": "completed",
    "iterations": 2,
    "max_iterations": 30,
    "sub_calls": 1,
    "usage": USAGE,
    "elapsed_s": 1.25,
    "result": {
        "status": "completed",
        "answer": "forty-two",
        "reason": None,
        "run_id": "run_0123456789abcdef0123",
        "iterations": 2,
        "usage": USAGE,
        "duration_s": 1.2,
        "sub_calls": 1,
    },
}
FIRST_RELEASE_QUEUED: dict[str, Any] = {
    **{k: v for k, v in FIRST_RELEASE_FINISHED.items() if k != "result"},
    "status": "queued",
    "phase": "queued",
    "notice": "worker 3 (host h, pid 9) was lost before the run called the model; it was queued again",
}


def record(**changes: Any) -> RunRecord:
    request = RunRequest(
        query="q",
        context_ids=["ctx_a"],
        owner=Owner("tok_1"),
        limits=RunLimits(max_iterations=3, max_depth=1, timeout_s=60.0, token_budget=None, max_errors=2),
        model="m",
    )
    return RunRecord(run_id="run_abc", created_at=1.0, request=request, **changes)


def test_a_first_release_record_reads_and_is_written_back_with_every_key() -> None:
    done = RunRecord.from_stored(FIRST_RELEASE_FINISHED)
    assert done.done and done.version == 1
    assert done.result is not None and done.result.answer == "forty-two"
    assert done.result.usage.total.calls == 2 and done.usage.by_model["m"].prompt_tokens == 10
    assert done.request.owner == "tok_1" and done.request.limits.max_iterations == 30
    stored = done.to_stored()
    assert stored.items() >= FIRST_RELEASE_FINISHED.items()  # every key and value, unchanged
    assert stored["version"] == RECORD_VERSION

    queued = RunRecord.from_stored(FIRST_RELEASE_QUEUED)
    assert not queued.done and queued.status == "queued"
    assert queued.notice is not None and queued.notice.kind is NoticeKind.TEXT
    assert queued.to_stored()["notice"] == FIRST_RELEASE_QUEUED["notice"]


def test_a_record_round_trips_through_its_stored_json() -> None:
    notice = Notice(kind=NoticeKind.RUNNING_ON, worker=WorkerRef(worker_id=4, host="h", pid=7))
    live = record(status="running", iterations=1, notice=notice, usage=Usage.of(USAGE))
    again = RunRecord.from_stored(json.loads(json.dumps(live.to_stored())))
    assert again == live.model_copy(update={"version": RECORD_VERSION})
    assert again.notice == notice  # the facts, not a sentence parsed back
    assert again.to_stored()["notice"] == "running on worker 4 (host h, pid 7)"


def test_odd_or_missing_fields_of_old_records_read_as_defaults() -> None:
    old = {"run_id": "run_x", "status": "no-such-status", "usage": "?", "iterations": "7", "notice": 5}
    r = RunRecord.from_stored(old)
    assert (r.status, r.iterations, r.usage.total.calls, r.notice, r.done) == ("queued", 0, 0, None, False)
    assert r.request.owner == "local"
    with pytest.raises(ValueError):
        RunRecord.from_stored({"query": "no id"})


def test_ending_a_record_makes_its_result_from_its_own_counts() -> None:
    r = record(status="running", iterations=3, sub_calls=2, usage=Usage.of(USAGE), elapsed_s=4.0)
    lost = Notice(kind=NoticeKind.WORKER_LOST, worker=WorkerRef(worker_id=2, host="h", pid=1), lease_s=30)
    ended = r.ended("error", lost.render(), notice=lost)
    assert ended.done and not r.done
    assert ended.result is not None
    assert (ended.result.iterations, ended.result.sub_calls, ended.result.duration_s) == (3, 2, 4.0)
    assert ended.result.usage == r.usage and ended.result.usage is not r.usage
    assert "worker 2 (host h, pid 1)" in ended.to_stored()["notice"] and "30 s" in ended.to_stored()["notice"]


def test_cached_prompt_tokens_are_counted_and_written_only_when_there_are_some() -> None:
    usage = Usage()
    usage.add("m", 100, 10)
    assert "cached_prompt_tokens" not in json.dumps(usage.to_dict())
    usage.add("m", 100, 10, cached_prompt_tokens=60)
    assert usage.total.cached_prompt_tokens == 60 and usage.by_model["m"].calls == 2
    assert usage.to_dict()["total"]["cached_prompt_tokens"] == 60
    assert Usage.of(usage.to_dict()) == usage


def test_the_live_summary_round_trips_and_reads_the_first_release_payload() -> None:
    r = record(status="running", iterations=2, usage=Usage.of(USAGE), last_event="turn_start")
    run_id, live = decode_live(encode_live(r.run_id, r.live()))
    assert run_id == "run_abc" and live == r.live()
    # The first release announced its whole summary after the run id.
    run_id, old = decode_live("run_0123456789abcdef0123 " + json.dumps(FIRST_RELEASE_QUEUED))
    assert old is not None and old.status == "queued" and old.notice is not None
    assert old.notice.render() == FIRST_RELEASE_QUEUED["notice"]
    assert decode_live("run_abc") == ("run_abc", None)
    assert decode_live("run_abc {not json") == ("run_abc", None)


def test_the_live_summary_stays_under_its_cap_whatever_the_run_used() -> None:
    usage = Usage()
    for i in range(400):  # many models: the per-model usage is left out, the total kept
        usage.add(f"model-with-a-long-name-{i:04d}", 1, 1)
    live = LiveSummary(status="running", usage=usage, notice=Notice.of_text("é" * 5000))
    payload = encode_live("r" * 128, live)
    assert len(payload.encode()) <= LIVE_MAX_BYTES
    _, back = decode_live(payload)
    assert back is not None and back.usage.total.calls == 400 and back.usage.by_model == {}


def test_a_final_record_rides_its_announcement_when_it_fits() -> None:
    final = record(status="running", iterations=2, usage=Usage.of(USAGE)).ended("cancelled", "stopped by its caller")
    stored = json.dumps(final.to_stored(), ensure_ascii=False)
    payload = encode_final("run_abc", stored)
    assert decode_announcement(payload) == ("run_abc", RunRecord.from_stored(json.loads(stored)))
    assert decode_live(payload) == ("run_abc", None)  # an earlier version's reader reads the row
    # Too long for a NOTIFY payload: the run id alone (the follower reads the row).
    long = record(status="running").ended("completed", "é" * FINAL_MAX_BYTES)
    assert encode_final("run_abc", json.dumps(long.to_stored(), ensure_ascii=False)) == "run_abc"
    live = record(status="running", iterations=1)
    assert decode_announcement(encode_live("run_abc", live.live())) == ("run_abc", live.live())
    assert decode_announcement("run_abc") == ("run_abc", None)
    assert decode_announcement(f"run_abc {FINAL_MARK}{{not json") == ("run_abc", None)
    # A record that is not final, or another run's, is never taken for the run's end.
    for other in (live, final.model_copy(update={"run_id": "run_other"})):
        assert decode_announcement(f"run_abc {FINAL_MARK}{json.dumps(other.to_stored())}") == ("run_abc", None)


def test_notices_render_only_at_the_edge_and_join_in_order() -> None:
    waiting = Notice(kind=NoticeKind.NO_WORKER, wait_s=300)
    requeued = Notice(kind=NoticeKind.REQUEUED_WORKER_SHUTDOWN, worker=WorkerRef(worker_id=1, host="h", pid=2))
    text = render_notices(requeued, None, waiting)
    assert text is not None and text.index("shut down") < text.index("no worker is alive")
    assert "300 s" in text and render_notices(None) is None
    assert Notice(kind=NoticeKind.SHUT_DOWN).render() == "the server shut down"


@pytest.mark.parametrize(
    ("lm_called", "requeues", "again"),
    [(False, 0, True), (True, 0, False), (False, 1, False), (True, 1, False), (False, 2, False)],
)
def test_a_run_goes_back_to_the_queue_only_unanswered_and_once(lm_called: bool, requeues: int, again: bool) -> None:
    assert may_requeue(lm_called=lm_called, requeues=requeues) is again


def test_run_ids_come_from_one_source_and_differ() -> None:
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("run_") and len(i) == 24 for i in ids)


def test_a_workers_live_summary_is_the_records_own_json_whatever_it_encoded_before() -> None:
    """A team worker's log encodes the record's head once per run and the live summary from the
    record itself (issue 39 item 6): the bytes stored and announced are those of `to_stored` and
    of the record's `live()`, at every publish, the final one included, and for an old record."""
    from rlm_mcp.store.pg.run_log import PgRunLog
    from rlm_mcp.store.pg.run_log import dump_record as _dump

    first = record(status="running", iterations=1)
    log = PgRunLog(None, first.run_id, created_at=1.0, max_event_bytes=1000, max_log_bytes=10_000)  # type: ignore[arg-type]
    notice = Notice(kind=NoticeKind.RUNNING_ON, worker=WorkerRef(worker_id=4, host="h", pid=7))
    later = first.model_copy(update={"iterations": 2, "usage": Usage.of(USAGE), "notice": notice, "sub_calls": 3})
    final = later.ended("cancelled", "by the caller")
    other = record(status="running", webhook_url="https://example.org/h?q=é").model_copy(update={"run_id": "run_other"})
    old = RunRecord.from_stored(FIRST_RELEASE_QUEUED)  # version 1: its announcement is this version's
    for each in (first, later, final, other, later, old):
        assert log._dump(each) == _dump(each)
        assert json.loads(log._dump(each)) == each.to_stored()
        if not each.done:
            assert encode_live(each.run_id, each) == encode_live(each.run_id, each.live())
