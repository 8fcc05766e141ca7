-- The webhook outbox (rlm_mcp.store.webhooks): one row per run end that asked for a callback,
-- kept until delivered (or its attempts are spent), then for the retention. SQLite's steps are
-- numbered on their own (0001, 0002): this is the embedded half of PostgreSQL's 0009.
CREATE TABLE webhook_outbox (
    webhook_id    TEXT PRIMARY KEY,
    run_id        TEXT NOT NULL UNIQUE,
    owner         TEXT NOT NULL,
    url           TEXT NOT NULL,
    body          TEXT NOT NULL,
    state         TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    next_at       REAL NOT NULL,
    claimed_until REAL,
    last_status   INTEGER,
    last_error    TEXT,
    delivered_at  REAL
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (state, next_at);
CREATE INDEX webhook_outbox_owner ON webhook_outbox (owner, created_at);
