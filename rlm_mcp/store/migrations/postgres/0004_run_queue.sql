-- The run queue's own columns and tables (rlm_mcp.service.queue): which Procrastinate job carried
-- a run, which worker runs it, whether it called the LM (a lost run that had not may start again,
-- once), and the workers' names (host, pid, sandbox owner label) for statuses and clean-up.
ALTER TABLE rlm_runs
    ADD COLUMN job_id    bigint,
    ADD COLUMN worker_id bigint,
    ADD COLUMN lm_called boolean NOT NULL DEFAULT false,
    ADD COLUMN requeues  integer NOT NULL DEFAULT 0;
CREATE INDEX rlm_runs_job ON rlm_runs (job_id);
CREATE TABLE rlm_workers (
    worker_id   bigint PRIMARY KEY,
    owner_id    text NOT NULL,
    host        text NOT NULL,
    pid         integer NOT NULL,
    started_at  double precision NOT NULL,
    gone_at     double precision
);
