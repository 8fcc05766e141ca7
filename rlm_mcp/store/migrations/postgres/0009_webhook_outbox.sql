-- The webhook outbox (rlm_mcp.store.pg.webhooks): one row per run end that asked for a callback,
-- kept until delivered (or its attempts are spent), then for the retention. Any front's or
-- worker's deliverer claims due rows (`claimed_until`, FOR UPDATE SKIP LOCKED), so a run end is
-- delivered even when the process that accepted the run is gone. `run_id` UNIQUE: one row, and
-- one `webhook_id`, per run end, however many writers tell it. Times are the database's clock.
CREATE TABLE rlm_webhook_outbox (
    webhook_id    text PRIMARY KEY,
    run_id        text NOT NULL UNIQUE,
    owner         text NOT NULL,
    url           text NOT NULL,
    body          text NOT NULL,
    state         text NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,
    created_at    double precision NOT NULL,
    next_at       double precision NOT NULL,
    claimed_until double precision,
    last_status   integer,
    last_error    text,
    delivered_at  double precision
);
CREATE INDEX rlm_webhook_outbox_due ON rlm_webhook_outbox (state, next_at);
CREATE INDEX rlm_webhook_outbox_owner ON rlm_webhook_outbox (owner, created_at);
