-- Team mode's first schema. Tables are prefixed rlm_, so rlm-mcp can share a database with
-- other applications. Times are Unix seconds (float), as in the SQLite index. Run records are
-- keyed by run id and their events ordered by a per-run sequence.
CREATE TABLE rlm_blobs (
    sha256      text PRIMARY KEY,
    bytes       bigint NOT NULL,
    chunks      integer NOT NULL,
    created_at  double precision NOT NULL
);
CREATE TABLE rlm_blob_chunks (
    sha256  text NOT NULL REFERENCES rlm_blobs (sha256) ON DELETE CASCADE,
    idx     integer NOT NULL,
    data    bytea NOT NULL,
    PRIMARY KEY (sha256, idx)
);
-- Stored as is, not compressed: pglz costs more CPU than the disk it saves on text.
ALTER TABLE rlm_blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE rlm_contexts (
    context_id   text PRIMARY KEY,
    sha256       text NOT NULL REFERENCES rlm_blobs (sha256),
    name         text NOT NULL,
    bytes        bigint NOT NULL,
    format       text NOT NULL,
    kind         text NOT NULL,
    chars        bigint NOT NULL,
    created_at   double precision NOT NULL,
    last_used_at double precision NOT NULL,
    source       text NOT NULL
);
CREATE INDEX rlm_contexts_sha ON rlm_contexts (sha256);
CREATE INDEX rlm_contexts_lru ON rlm_contexts (last_used_at);
CREATE TABLE rlm_context_owners (
    context_id   text NOT NULL REFERENCES rlm_contexts (context_id) ON DELETE CASCADE,
    owner        text NOT NULL,
    name         text NOT NULL,
    source       text NOT NULL,
    created_at   double precision NOT NULL,
    last_used_at double precision NOT NULL,
    PRIMARY KEY (context_id, owner)
);
CREATE INDEX rlm_context_owners_owner ON rlm_context_owners (owner, last_used_at);
CREATE TABLE rlm_replicas (
    replica_id  text PRIMARY KEY,
    host        text NOT NULL,
    pid         integer NOT NULL,
    version     text NOT NULL,
    started_at  double precision NOT NULL,
    seen_at     double precision NOT NULL
);
CREATE TABLE rlm_pins (
    pin_id      text NOT NULL,
    context_id  text NOT NULL,
    replica_id  text NOT NULL,
    owner       text NOT NULL,
    expires_at  double precision NOT NULL
);
CREATE INDEX rlm_pins_ctx ON rlm_pins (context_id);
CREATE TABLE rlm_uploads (
    upload_id      text PRIMARY KEY,
    next_index     integer NOT NULL,
    bytes_received bigint NOT NULL,
    last_chunk_sha text,
    name           text,
    format         text,
    created_at     double precision NOT NULL,
    updated_at     double precision NOT NULL,
    done           boolean NOT NULL DEFAULT false,
    finalizing     boolean NOT NULL DEFAULT false,
    context_id     text
);
CREATE TABLE rlm_upload_chunks (
    upload_id  text NOT NULL REFERENCES rlm_uploads (upload_id) ON DELETE CASCADE,
    idx        integer NOT NULL,
    data       bytea NOT NULL,
    PRIMARY KEY (upload_id, idx)
);
CREATE TABLE rlm_runs (
    run_id      text PRIMARY KEY,
    owner       text NOT NULL,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    done        boolean NOT NULL DEFAULT false,
    summary     text NOT NULL,
    log_bytes   bigint NOT NULL DEFAULT 0,
    next_seq    bigint NOT NULL DEFAULT 0
);
CREATE INDEX rlm_runs_owner ON rlm_runs (owner, created_at);
CREATE INDEX rlm_runs_created ON rlm_runs (created_at);
CREATE TABLE rlm_run_events (
    run_id  text NOT NULL REFERENCES rlm_runs (run_id) ON DELETE CASCADE,
    seq     bigint NOT NULL,
    line    text NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE rlm_secrets (
    name   text PRIMARY KEY,
    value  bytea NOT NULL
);
