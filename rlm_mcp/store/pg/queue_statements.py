"""Every SQL statement on team-mode run state and worker state, by name: the only module that
writes `rlm_runs.state` (`queue.PgRunQueue` runs the queue's; `run_log.PgRunLog` and
`runs.PgRunStore.create` take their state-writing parts from here), with one function of the
schema's, `rlm_enqueue` (migrations 0011 and 0012), which `ENQUEUE` calls: a queued run's insert.

The form: named module constants, PostgreSQL's text as psycopg runs it (`%(name)s` parameters
where a statement has several, `%s` in the fragments `runs.py` composes). Not a `.sql` file of
named queries: one dialect only, so there is nothing to render (unlike `store/statements.py`,
whose dataclass exists to render each statement for two dialects), and a constant is checked by
the linters and the type checker at its every use, where a name looked up in a file is not.
Not a dataclass either: no dialect overrides a statement here.

Rules kept here (docs/architecture.md, "Team mode"):

- One clock: every time another replica compares (heartbeats, leases, queue timeouts, claim
  times, record ages) is the database's; no statement compares this process's `time.time()`.
- Claims (`CLAIM`) run under `locks.CLAIM_LOCK_KEY`: of the queued runs whose sandbox need fits
  the worker's free sandbox slots and whose owner runs fewer than its share, the oldest run of
  the owner with the fewest running runs; a run preferring another worker is left to it until
  `prefer_until`, unless that worker is gone or silent. One claim may take several runs, as many
  claims one after another would (each owner's picks counted against its share, the sandbox
  needs summed against the free slots).
- The waiting bounds (`ENQUEUE`): counted and inserted under `locks.ENQUEUE_LOCK_KEY`, in one
  call, so concurrent starts on any number of replicas never overshoot them.
- A claim pins its runs' contexts for the worker's replica (the context store's rule,
  `pin_statements.PIN_RULE`: all or none per run) and a worker's final write removes them (`UNPIN`): a queued run holds no pin.
- Fencing: a worker's writes match `(run_id, attempt, state = 'running')`.
- No statement parses a run's summary or log as JSON in SQL (a NUL character in a query would
  make PostgreSQL's jsonb refuse it).
"""

from __future__ import annotations

import hashlib

from rlm_mcp.store.pg.pin_statements import PIN_RULE

# Where a run's announcements go: its own channel (`run_channel`), which only the replicas
# following the run LISTEN to, so a replica is not woken for the runs it does not follow (every
# replica used to hear every run's every live summary). Payload: the run id, optionally a space
# and its live summary. `CHANNEL`, the one channel of earlier versions, is still listened to, so
# a front hears the workers of the previous version during a rolling upgrade.
CHANNEL = "rlm_run_progress"
QUEUE_CHANNEL = "rlm_run_queue"  # payload: "queued", "cancel RUN_ID", or "follow RUN_ID"


def run_channel(run_id: str) -> str:
    """The run's own channel: a digest of its id (lower-case hex: a plain identifier, never
    quoted, and within PostgreSQL's 63 bytes whatever the id's length)."""
    return "rlm_run_" + hashlib.sha1(run_id.encode(), usedforsecurity=False).hexdigest()[:32]


NOW = "extract(epoch FROM now())"  # the database's clock as Unix seconds (the float columns)

COLUMNS = (
    "run_id, owner, state, attempt, summary, worker_id, lm_called, requeues, next_seq, log_bytes, created_at, "
    "cancel_requested, followed"
)
_R_COLUMNS = ", ".join("r." + c.strip() for c in COLUMNS.split(","))
# A worker is lost when its row is gone, it said it is gone, or its heartbeat is older than the lease.
_LOST = "(w.worker_id IS NULL OR w.gone_at IS NOT NULL OR w.heartbeat_at < now() - make_interval(secs => %(lease)s))"
_LIVE = "gone_at IS NULL AND heartbeat_at > now() - make_interval(secs => %(lease)s)"

# --- fronts -----------------------------------------------------------------------------------
# A run's start in one statement: the function of migration 0011 checks the run's contexts are its
# owner's, then takes the enqueue's advisory lock, counts the waiting runs, inserts the run when
# both bounds allow and wakes the workers (none when the channel is NULL: migration 0012); each statement inside it takes its own snapshot, so the
# count sees every run inserted by the starts that held the lock before. One row: the counts,
# whether it was inserted, and the first context id the owner lacks (None when none). The run's
# context ids are one parameter, given to the function twice: the ids checked and the row's
# `context_ids` (the claim pins them) are the same list.
ENQUEUE = (
    "SELECT total, mine, inserted, missing FROM rlm_enqueue(%(key)s, %(run_id)s, %(owner)s, %(created_at)s, "
    "%(summary)s, %(need)s, %(max_total)s, %(max_mine)s, %(queue_channel)s, %(prefer)s, %(prefer_s)s, "
    "%(contexts)s::text[], %(contexts)s::text[])"
)
READ_RUN = f"SELECT {COLUMNS} FROM rlm_runs WHERE run_id = %(run_id)s"
CANCEL_QUEUED = (
    "WITH up AS (UPDATE rlm_runs SET state = 'done', summary = %(summary)s, updated_at = "
    f"{NOW} WHERE run_id = %(run_id)s AND state = 'queued' RETURNING run_id) "
    "SELECT (SELECT count(*) FROM up) AS ended, pg_notify(%(channel)s, %(run_id)s)"
)
ASK_CANCEL = (
    "WITH up AS (UPDATE rlm_runs SET cancel_requested = true WHERE run_id = %(run_id)s AND state = 'running' "
    "RETURNING run_id) SELECT pg_notify(%(queue_channel)s, 'cancel ' || run_id) FROM up"
)
# A front follows the run's progress: the mark is set once (a queued run's claim reads it), and a
# running run's worker is told on the queue channel. A hint for latency only (`follow_progress`).
FOLLOW = (
    "WITH up AS (UPDATE rlm_runs SET followed = true WHERE run_id = %(run_id)s AND state <> 'done' "
    "AND NOT followed RETURNING run_id, state) "
    "SELECT pg_notify(%(queue_channel)s, 'follow ' || run_id) FROM up WHERE state = 'running'"
)
FOLLOWED = "SELECT run_id FROM rlm_runs WHERE state = 'running' AND worker_id = %(worker)s AND followed"
QUEUED_COUNTS = (
    "SELECT count(*) AS total, count(*) FILTER (WHERE owner = %(owner)s) AS mine FROM rlm_runs WHERE state = 'queued'"
)
GAUGES = (
    "SELECT count(*) AS depth, coalesce(extract(epoch FROM now() - min(queued_at)), 0) AS oldest, "
    f"(SELECT count(*) FROM rlm_workers WHERE {_LIVE}) AS alive "
    "FROM rlm_runs WHERE state = 'queued'"
)

# --- workers' runs ----------------------------------------------------------------------------
# The claim's lock: a statement of its own before `CLAIM`, in the same transaction, so the claim's
# snapshot (each statement of a READ COMMITTED transaction takes its own) follows the lock and sees
# every claim committed by those who held it before.
CLAIM_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"

# How a kept session's run names its session in its stored record (`CLAIM` with `sessions` off).
SESSION_KEY = '"session_id": "'

# Up to %(limit)s runs in one statement, in the order one claim after another would take them: the
# fewest running runs first (each owner's count grows by one with each of its runs picked before:
# `nth`, its running runs plus its runs ahead of this one; of an owner's runs, those preferring this
# worker come first, as no other worker may take them yet), then the oldest. Each owner's picks
# stop at its share (nth < share), and the sandbox need is summed along that order against the
# free slots (a prefix: the batch stops at the first run that does not fit). At most a `workers`th
# of the eligible runs (`live`: the live workers, and their run slots), rounded up, so a burst
# spreads over the live workers. The share is the caller's rule applied to `%(for_slots)s` live run
# slots: when the live slots are not that many (a worker came or went since the caller's last
# claim), nothing is claimed, and the one row returned (`live_slots`, no run) tells the caller
# what to apply its rule to instead. The window functions
# are computed below the statement that locks (`FOR UPDATE` takes no window function); the lock
# re-checks `state` (a run cancelled meanwhile is not claimed), and a row another transaction
# holds is skipped. With a limit of 1 it is the single claim of before.
CLAIM = (
    f"WITH live AS (SELECT coalesce(sum(slots), 0) AS slots, count(*) AS workers FROM rlm_workers WHERE {_LIVE}), "
    "busy AS (SELECT owner, count(*) AS n FROM rlm_runs WHERE state = 'running' GROUP BY owner), "
    "cand AS (SELECT r.run_id, r.queued_at, least(r.need, %(cap)s) AS need, "
    "  coalesce(b.n, 0) + row_number() OVER (PARTITION BY r.owner "
    "    ORDER BY r.prefer_worker IS NOT DISTINCT FROM %(worker)s DESC, r.queued_at, r.run_id) - 1 AS nth "
    "  FROM rlm_runs r LEFT JOIN busy b ON b.owner = r.owner "
    "  WHERE r.state = 'queued' AND least(r.need, %(cap)s) <= %(free)s "
    "  AND (SELECT slots FROM live) = %(for_slots)s "
    # A session's run names its session in the record's JSON (matched as text: a summary may
    # hold a NUL, which jsonb refuses; inside a string a quote is escaped).
    "  AND (%(sessions)s OR position(%(session_key)s in r.summary) = 0) "
    "  AND (r.prefer_worker IS NULL OR r.prefer_worker = %(worker)s OR r.prefer_until <= now() "
    "    OR NOT EXISTS (SELECT 1 FROM rlm_workers w WHERE w.worker_id = r.prefer_worker "
    "      AND w.gone_at IS NULL AND w.heartbeat_at > now() - make_interval(secs => %(lease)s)))), "
    "fair AS (SELECT run_id, nth, queued_at, "
    "  sum(need) OVER (ORDER BY nth, queued_at, run_id ROWS UNBOUNDED PRECEDING) AS needed, "
    "  row_number() OVER (ORDER BY nth, queued_at, run_id) AS pos, count(*) OVER () AS eligible "
    "  FROM cand WHERE nth < %(share)s), "
    "pick AS (SELECT r.run_id, f.nth, f.queued_at FROM rlm_runs r JOIN fair f ON f.run_id = r.run_id "
    "  WHERE r.state = 'queued' AND f.needed <= %(free)s "
    "  AND f.pos <= least(%(limit)s, ceil(f.eligible::numeric / greatest((SELECT workers FROM live), 1))) "
    "  ORDER BY f.nth, f.queued_at, f.run_id LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED), "
    "up AS (UPDATE rlm_runs r SET state = 'running', attempt = r.attempt + 1, worker_id = %(worker)s, "
    f"  claimed_at = now(), cancel_requested = false, updated_at = {NOW} "
    f"  FROM pick WHERE r.run_id = pick.run_id RETURNING {_R_COLUMNS}, r.context_ids, "
    "  extract(epoch FROM now() - r.queued_at) AS waited_s, pick.nth AS pick_nth, pick.queued_at AS pick_queued_at), "
    # Each claimed run's contexts pinned for its worker's replica by the context store's rule
    # (`pin_statements.PIN_RULE`: the owner's rows, marked used, all or none per run), in this
    # statement: no pin of its own. The ids come from the row's `context_ids` (the request's,
    # written by the enqueue); a row without the column, queued by an earlier release, is left to
    # the worker's own pin. A claim's pin id is the run's id and attempt (`run_id/attempt`), named
    # here only.
    "claimed AS (SELECT up.run_id, up.run_id || '/' || up.attempt AS pin_id, up.owner, up.context_ids "
    "  FROM up WHERE up.context_ids IS NOT NULL), "
    "want AS (SELECT c.pin_id, c.owner, e.cid, e.n, c.run_id FROM claimed c "
    "  CROSS JOIN LATERAL unnest(c.context_ids) WITH ORDINALITY AS e (cid, n)), "
    "holders AS (SELECT c.pin_id, (SELECT count(DISTINCT w.cid) FROM want w WHERE w.pin_id = c.pin_id) AS expected, "
    "  c.run_id FROM claimed c), "
    f"{PIN_RULE}, "
    "result AS (SELECT up.*, ok.pin_id, CASE WHEN ok.run_id IS NULL THEN NULL ELSE coalesce((SELECT json_agg(json_build_object("
    "  'context_id', f.context_id, 'sha256', f.sha256, 'bytes', f.bytes, 'format', f.format, 'kind', f.kind, "
    "  'chars', f.chars, 'name', f.name, 'source', f.source, 'created_at', f.created_at, 'last_used_at', t.now) "
    "  ORDER BY w.n) FROM want w JOIN found f ON f.pin_id = w.pin_id AND f.context_id = w.cid "
    "  WHERE w.pin_id = ok.pin_id), '[]'::json) END AS contexts "
    "  FROM up CROSS JOIN t LEFT JOIN ok ON ok.run_id = up.run_id) "
    # At least one row, whatever was claimed: the live slots the guard compared.
    "SELECT l.slots AS live_slots, c.* FROM live l LEFT JOIN result c ON true "
    "ORDER BY c.pick_nth, c.pick_queued_at, c.run_id"
)


# A worker's timed look before it claims (the partial index `rlm_runs_queued` answers it).
ANY_QUEUED = "SELECT EXISTS (SELECT 1 FROM rlm_runs WHERE state = 'queued') AS any"
CANCELS = "SELECT run_id FROM rlm_runs WHERE state = 'running' AND worker_id = %(worker)s AND cancel_requested"
REQUEUE = (
    "WITH up AS (UPDATE rlm_runs SET state = 'queued', worker_id = NULL, requeues = requeues + 1, "
    f"summary = %(summary)s, queued_at = now(), updated_at = {NOW} WHERE run_id = %(run_id)s "
    "AND state = 'running' AND attempt = %(attempt)s RETURNING run_id) "
    "SELECT (SELECT count(*) FROM up) AS n, pg_notify(%(channel)s, %(run_id)s), pg_notify(%(queue_channel)s, 'queued')"
)
_FINISH = (
    f"WITH up AS (UPDATE rlm_runs SET summary = %(summary)s, state = 'done', updated_at = {NOW} "
    "WHERE run_id = %(run_id)s AND {fence} RETURNING run_id) SELECT (SELECT count(*) FROM up) AS ended, "
    "pg_notify(%(channel)s, %(run_id)s)"
)
FINISH_ATTEMPT = _FINISH.format(fence="state = 'running' AND attempt = %(attempt)s")
FINISH_ANY = _FINISH.format(fence="state <> 'done'")
# A worker's final record with its run log's last events (`run_log.PgRunLog.finish`): FINISH_ATTEMPT's
# write, with the log's counters, after the events' CTE (`EVENTS_FENCE`d); positional parameters:
# the summary, next_seq, log_bytes, the run id, the attempt, then the channel, the announcement
# with the final record (`ports.runs.encode_final`) and the run id. The record is announced only
# when this write ended the run: a stale attempt's refused write announces the id alone.
FINISH_LOGGED = (
    f"up AS (UPDATE rlm_runs SET summary = %s, state = 'done', updated_at = {NOW}, "
    "next_seq = GREATEST(next_seq, %s), log_bytes = GREATEST(log_bytes, %s) "
    "WHERE run_id = %s AND state = 'running' AND attempt = %s RETURNING run_id), "
    "n AS (SELECT count(*) AS ended FROM up) "
    "SELECT ended, pg_notify(%s, CASE WHEN ended > 0 THEN %s ELSE %s END) FROM n"
)
# The run's context pins (`store.pg.contexts`), removed by its worker's final write (a CTE before
# FINISH_LOGGED; parameter: the pin id). Not fenced: the pins are the worker process's own, let go
# at the run's end whether or not this attempt's write ended it. A data-modifying CTE runs
# whether or not the statement reads it.
UNPIN = "unpin AS (DELETE FROM rlm_pins WHERE pin_id = %s)"

# --- sweepers ---------------------------------------------------------------------------------
LOST_RUNS = (
    "SELECT r.run_id FROM rlm_runs r LEFT JOIN rlm_workers w ON w.worker_id = r.worker_id "
    f"WHERE r.state = 'running' AND r.worker_id IS NOT NULL AND {_LOST} ORDER BY r.run_id"
)
LOST_RUN_LOCKED = (
    f"SELECT {_R_COLUMNS} FROM rlm_runs r "
    "LEFT JOIN rlm_workers w ON w.worker_id = r.worker_id WHERE r.run_id = %(run_id)s AND r.state = 'running' "
    f"AND {_LOST} FOR UPDATE OF r SKIP LOCKED"
)
STALE_QUEUED = (
    "SELECT run_id FROM rlm_runs WHERE state = 'queued' "
    "AND queued_at < now() - make_interval(secs => %(timeout)s) ORDER BY queued_at"
)
STALE_QUEUED_LOCKED = (
    "SELECT run_id, summary FROM rlm_runs WHERE run_id = %(run_id)s AND state = 'queued' "
    "AND queued_at < now() - make_interval(secs => %(timeout)s) FOR UPDATE SKIP LOCKED"
)

# --- workers ----------------------------------------------------------------------------------
LIVE_WORKERS = f"SELECT count(*) AS n FROM rlm_workers WHERE {_LIVE}"
# This owner's earlier registrations (declared lost during an outage) are over.
RETIRE_OWNER = f"UPDATE rlm_workers SET gone_at = {NOW} WHERE owner_id = %(owner_id)s AND gone_at IS NULL"
REGISTER = (
    "INSERT INTO rlm_workers (owner_id, host, pid, started_at, heartbeat_at, slots) "
    f"VALUES (%(owner_id)s, %(host)s, %(pid)s, {NOW}, now(), %(slots)s) RETURNING worker_id"
)
NOTIFY_QUEUED = "SELECT pg_notify(%(queue_channel)s, 'queued')"
HEARTBEAT = (
    "WITH beat AS (UPDATE rlm_workers SET heartbeat_at = now() WHERE worker_id = %(worker)s AND gone_at IS NULL "
    "RETURNING worker_id) SELECT EXISTS (SELECT 1 FROM beat) AS registered, "
    "(SELECT coalesce(json_agg(json_build_array(run_id, attempt, cancel_requested)), '[]'::json) "
    " FROM rlm_runs WHERE state = 'running' AND worker_id = %(worker)s) AS held"
)
WORKER_ROW = "SELECT host, pid FROM rlm_workers WHERE worker_id = %(worker)s"
WORKERS = (
    "SELECT worker_id, owner_id, host, heartbeat_at > now() - make_interval(secs => %(lease)s) AS live "
    "FROM rlm_workers WHERE gone_at IS NULL"
)
# A sweep's reads in one statement (one round trip), as of the same instant: seconds until the oldest
# live worker's lease ends and since the database started, LOST_RUNS' ids and WORKERS' rows.
SWEEP_LOOK = (
    "SELECT (SELECT extract(epoch FROM min(heartbeat_at) - now()) FROM rlm_workers WHERE "
    f"{_LIVE}) AS oldest_s, extract(epoch FROM now() - pg_postmaster_start_time()) AS up_s, "
    f"(SELECT coalesce(json_agg(l.run_id ORDER BY l.run_id), '[]'::json) FROM ({LOST_RUNS}) l) AS lost_runs, "
    "(SELECT coalesce(json_agg(json_build_array(k.worker_id, k.owner_id, k.host, k.live)), '[]'::json) "
    f"FROM ({WORKERS}) k) AS workers"
)
FORGET_WORKERS = (
    f"DELETE FROM rlm_workers w WHERE (w.gone_at < {NOW} - %(after)s OR w.heartbeat_at < now() - "
    "make_interval(secs => %(after)s)) AND NOT EXISTS (SELECT 1 FROM rlm_runs r WHERE r.state = 'running' "
    "AND r.worker_id = w.worker_id)"
)
MARK_GONE = f"UPDATE rlm_workers SET gone_at = {NOW} WHERE worker_id = %(worker)s"
DB_CLOCK = "SELECT extract(epoch FROM clock_timestamp()) AS t"

# --- wake-ups ---------------------------------------------------------------------------------
LISTEN = "LISTEN {channel}"  # a channel name above or a `run_channel`, never a value from outside
UNLISTEN = "UNLISTEN {channel}"
PING = "SELECT 1"

# --- the run log's parts (`runs.py`), the only other writes of `state` -------------------------
# A run executed by the process that creates it (not through the team queue): no worker, so no
# sweeper treats it as a lost worker's; its state is `done` or `running` by its record.
CREATE_LOCAL_RUN = (
    "INSERT INTO rlm_runs (run_id, owner, created_at, updated_at, state, summary) "
    "VALUES (%s, %s, %s, extract(epoch FROM now()), %s, %s) ON CONFLICT (run_id) DO NOTHING RETURNING run_id"
)
# A flush's record: never over a final summary (in team mode another process may have ended the
# run first: a cancel while queued, a sweeper that found its worker lost); parameters: the
# summary, then whether it is final.
SET_SUMMARY = (
    "summary = CASE WHEN state = 'done' THEN summary ELSE %s END",
    "state = CASE WHEN %s THEN 'done' ELSE state END",
)
# The same for a batch of runs' flushes (`store.pg.log_writer`), from its table `b` (no summary: NULL).
BATCH_SET_SUMMARY = (
    "summary = CASE WHEN x.state = 'done' OR b.summary IS NULL THEN x.summary ELSE b.summary END, "
    "state = CASE WHEN b.summary IS NOT NULL AND b.done THEN 'done' ELSE x.state END"
)
# A fenced flush writes nothing once the run is not this attempt's; parameters: run id, attempt.
EVENTS_FENCE = " WHERE EXISTS (SELECT 1 FROM rlm_runs WHERE run_id = %s AND attempt = %s AND state = 'running')"


def local_state(done: bool) -> str:
    """The state a run executed outside the queue is created in (`CREATE_LOCAL_RUN`)."""
    return "done" if done else "running"
