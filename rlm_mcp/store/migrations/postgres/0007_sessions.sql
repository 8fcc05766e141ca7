-- Kept sessions in the team database (rlm_mcp.store.pg.sessions).
--
-- - `rlm_sessions`: one row per kept session: its owner, the database's times (created, last used,
--   ended), its state (`open`, `closed`, `expired`), the run using it now (`running_run`, since
--   `running_since`: a second follow-up is refused while that run has not ended), its run ids, the
--   context ids bound as `context_0, context_1, ...`, its conversations (`history_i`), its usage,
--   `generation` (runs whose end is recorded), the worker that holds its live sandbox, and the
--   generation, size or failure of its snapshot;
-- - `rlm_session_snapshots`: the snapshot (an opaque blob the sandbox made; never deserialized on a
--   host) in 1 MiB chunks, removed with its session;
-- - `rlm_runs.prefer_worker` / `prefer_until`: a follow-up waits a moment for the worker that holds
--   its session's live sandbox before any worker may claim it.
--
-- JSON columns are `text` (a conversation may hold a NUL character, which jsonb refuses).

CREATE TABLE rlm_sessions (
    session_id      text PRIMARY KEY,
    owner           text NOT NULL,
    state           text NOT NULL DEFAULT 'open',
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_used_at    timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz,
    running_run     text,
    running_since   timestamptz,
    run_ids         text NOT NULL DEFAULT '[]',
    context_ids     text NOT NULL DEFAULT '[]',
    histories       text NOT NULL DEFAULT '[]',
    usage           text NOT NULL DEFAULT '{}',
    generation      integer NOT NULL DEFAULT 0,
    worker_id       bigint,
    snapshot_gen    integer,
    snapshot_bytes  bigint,
    snapshot_error  text
);
CREATE INDEX rlm_sessions_owner ON rlm_sessions (owner, state);
CREATE TABLE rlm_session_snapshots (
    session_id  text NOT NULL REFERENCES rlm_sessions (session_id) ON DELETE CASCADE,
    idx         integer NOT NULL,
    data        bytea NOT NULL,
    PRIMARY KEY (session_id, idx)
);
ALTER TABLE rlm_runs
    ADD COLUMN prefer_worker bigint,
    ADD COLUMN prefer_until  timestamptz;
