"""The cyclic garbage collector's settings for a long-running server or worker process.

CPython's defaults (a young-generation collection every 700 net container allocations) suit a
short script. A server with 200 sub-calls in flight holds each call's objects until the call
ends, so each young collection finds most of them alive and promotes them: the
middle generation's collections then walk every in-flight call's objects, and the full ones
everything the process imported. Measured on the 2-core VM (2026-11-29, 200-way batches against
the scripted server, `gc.callbacks` timing each collection's thread CPU): the collector took
16-18% of the process's CPU, ~0.13 ms per sub-call; with a freeze and a young threshold of
10,000 0.04-0.08 ms (two measurements); with the settings below, no young collection during the
batches.

- `gc.freeze()` once the modules are imported: what exists at start-up (modules, classes,
  pydantic schemas) is never garbage, so full collections stop walking it.
- A young-generation threshold of 100,000, above what a busy batch keeps alive: the young
  generation's count is allocations net of frees, and a 200-way batch of sub-calls holds
  ~18,000 container objects at its peak (about 90 per call in flight, read from
  `gc.get_count()` as the batch's first answers came), so at 10,000 every 200-way batch set
  off collections that walked its own live calls (and promoted them, for the middle
  generation to walk again). Above the live set a collection
  comes only when garbage that refcounting cannot free accumulates, and finds little alive
  (up to ~1,000 calls in flight; the default RLM_MCP_MAX_CONCURRENT_LM_CALLS is 16).
  Measured 2026-11-29 (`gc.callbacks`, 200-way batches of `bench/subcall.py`): at 10,000 the
  collector took ~0.08 ms of CPU per sub-call (~0.03 ms per bare request of the floor's
  client); at 100,000 no young collection ran during the batches. The cost: cyclic garbage
  (tracebacks, other reference cycles) waits up to that many allocations longer
  before it is found; a full collection still runs when the older generations fill.

Only process entry points that serve (and the benchmarks that stand for them) call this; the
library, the tests and `rlm-mcp run` keep the interpreter's defaults.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 100_000


def tune_for_serving() -> None:
    """Freeze what start-up made and raise the young generation's threshold (older ones unchanged)."""
    gc.collect()  # start-up's own garbage is not frozen with the rest
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
