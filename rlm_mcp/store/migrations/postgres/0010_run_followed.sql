-- A run someone follows (a caller with a progress token, an event stream, a viewer's live page):
-- set by a front (`PgRunQueue.follow_progress`), read by the claim, so the worker publishes the
-- run's live summary at the live-summary interval rather than the slower unfollowed one. A hint
-- for latency only: no rule of fencing, requeue or the final record reads it.
ALTER TABLE rlm_runs ADD COLUMN followed boolean NOT NULL DEFAULT false;
