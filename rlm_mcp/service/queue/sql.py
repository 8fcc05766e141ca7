"""What the queue's statements share (`state.py`, `registry.py`): the NOTIFY channels and the
database's clock, the one every lease, timeout and age is judged on."""

from __future__ import annotations

CHANNEL = "rlm_run_progress"  # payload: a run id, optionally a space and its live summary
QUEUE_CHANNEL = "rlm_run_queue"  # payload: "queued", or "cancel RUN_ID"
NOW = "extract(epoch FROM now())"  # the database's clock as Unix seconds (the float columns)
