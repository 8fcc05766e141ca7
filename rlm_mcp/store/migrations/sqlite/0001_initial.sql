-- The metadata index as rlm-mcp 0.2 made it: contexts (one row per stored blob), each owner's
-- name and times for it, pins of the runs using one, resumable uploads. IF NOT EXISTS: an index
-- of a release before the index carried a version (0.2 and earlier, user_version 0) comes here
-- too, already holding some of these tables; 0002 gives its tables the columns they lack.
CREATE TABLE IF NOT EXISTS contexts (
    context_id   TEXT PRIMARY KEY,
    sha256       TEXT NOT NULL,
    name         TEXT NOT NULL,
    bytes        INTEGER NOT NULL,
    format       TEXT NOT NULL,
    kind         TEXT NOT NULL,
    chars        INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    last_used_at REAL NOT NULL,
    source       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS contexts_sha ON contexts (sha256);
CREATE INDEX IF NOT EXISTS contexts_lru ON contexts (last_used_at);
CREATE TABLE IF NOT EXISTS pins (
    pin_id      TEXT NOT NULL,
    context_id  TEXT NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    proc_start  TEXT,
    expires_at  REAL NOT NULL,
    owner       TEXT
);
CREATE INDEX IF NOT EXISTS pins_ctx ON pins (context_id);
CREATE TABLE IF NOT EXISTS context_owners (
    context_id   TEXT NOT NULL,
    owner        TEXT NOT NULL,
    name         TEXT NOT NULL,
    source       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    last_used_at REAL NOT NULL,
    PRIMARY KEY (context_id, owner)
);
CREATE INDEX IF NOT EXISTS context_owners_owner ON context_owners (owner, last_used_at);
CREATE TABLE IF NOT EXISTS uploads (
    upload_id      TEXT PRIMARY KEY,
    next_index     INTEGER NOT NULL,
    bytes_received INTEGER NOT NULL,
    last_chunk_sha TEXT,
    name           TEXT,
    format         TEXT,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    done           INTEGER NOT NULL DEFAULT 0,
    context_id     TEXT,
    owner          TEXT
);
