"""`rlm-mcp serve`'s garbage-collector settings (rlm_mcp/cli/collector.py)."""

from __future__ import annotations

import gc

from rlm_mcp.cli.collector import YOUNG_THRESHOLD, tune_for_serving


def test_tune_for_serving_freezes_start_up_and_raises_only_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        tune_for_serving()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0  # what start-up made is out of the collector's walks
    finally:  # this test process keeps the interpreter's defaults
        gc.unfreeze()
        gc.set_threshold(*before)
