-- One state machine per run, on `rlm_runs` itself (rlm_mcp.service.queue.state).
--
-- Before it, team mode kept each run in two places: `rlm_runs` and a job of Procrastinate (the job
-- queue library it used: 0003 applied its tables), with two worker registries. From here on
-- a run's row is its only state:
--
-- - `state`: queued -> running -> done (queued again, once, after a lost worker when the run had
--   no answered LM call); `done` becomes a column computed from it, so the two cannot disagree;
-- - `attempt`: bumped by each claim; every write a worker makes for the run names it (fencing);
-- - `need`: the sandbox slots the run's max_depth needs, so a claim is gated inside its statement;
-- - `queued_at`, `claimed_at`: the database's clock, the one every replica compares;
-- - `cancel_requested`: a cancel of a running run, for its worker;
-- - `rlm_workers.heartbeat_at` (the database's `now()`) and `slots` (its RLM_MCP_MAX_RUNS); worker
--   ids come from a sequence;
-- - `rlm_run_events` gains the attempt in its key: two attempts' rows never collide.
--
-- Runs in flight at the upgrade: queued runs stay queued (their waiting time starts again); runs
-- running on a worker of the former release stay `running` under that worker (attempt 1) but are
-- never queued again (`requeues` = 1): that worker cannot heartbeat the new table, so one lease
-- later the sweepers end them with a status naming it. The former release's replicas cannot work
-- on this schema (its job tables are gone and a fresh start refuses the newer schema, naming both
-- versions): upgrade every replica together (docs/team.md, "Upgrading").
--
-- The `need` of a migrated run is read from its summary's text, not cast to jsonb: a summary may
-- hold a NUL character, which jsonb refuses.
ALTER TABLE rlm_runs
    ADD COLUMN state            text NOT NULL DEFAULT 'queued',
    ADD COLUMN attempt          integer NOT NULL DEFAULT 0,
    ADD COLUMN need             integer NOT NULL DEFAULT 1,
    ADD COLUMN queued_at        timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN claimed_at       timestamptz,
    ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
UPDATE rlm_runs SET
    state = CASE WHEN done THEN 'done' WHEN worker_id IS NOT NULL THEN 'running' ELSE 'queued' END,
    attempt = CASE WHEN worker_id IS NOT NULL AND NOT done THEN 1 ELSE 0 END,
    requeues = CASE WHEN worker_id IS NOT NULL AND NOT done THEN greatest(requeues, 1) ELSE requeues END,
    need = greatest(1, coalesce(substring(summary FROM '"max_depth": *([0-9]{1,4})')::integer, 1));
ALTER TABLE rlm_runs DROP COLUMN done;
ALTER TABLE rlm_runs ADD COLUMN done boolean GENERATED ALWAYS AS (state = 'done') STORED;
ALTER TABLE rlm_runs ADD CONSTRAINT rlm_runs_state CHECK (state IN ('queued', 'running', 'done'));
ALTER TABLE rlm_runs DROP COLUMN job_id;
CREATE INDEX rlm_runs_queued ON rlm_runs (queued_at) WHERE state = 'queued';
CREATE INDEX rlm_runs_running ON rlm_runs (worker_id) WHERE state = 'running';
CREATE INDEX rlm_runs_done ON rlm_runs (owner, updated_at) WHERE state = 'done';

ALTER TABLE rlm_run_events ADD COLUMN attempt integer NOT NULL DEFAULT 0;
ALTER TABLE rlm_run_events DROP CONSTRAINT rlm_run_events_pkey;
ALTER TABLE rlm_run_events ADD PRIMARY KEY (run_id, attempt, seq);

CREATE SEQUENCE rlm_workers_id_seq;
SELECT setval('rlm_workers_id_seq', greatest(1, (SELECT max(worker_id) FROM rlm_workers)));
ALTER TABLE rlm_workers
    ALTER COLUMN worker_id SET DEFAULT nextval('rlm_workers_id_seq'),
    ADD COLUMN heartbeat_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN slots integer NOT NULL DEFAULT 0;

-- The former queue library's tables, functions and types.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v') AND c.relname LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I CASCADE', r.relname);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = current_schema() AND p.proname LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', r.f);
    END LOOP;
    FOR r IN SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
             WHERE n.nspname = current_schema() AND t.typtype = 'e' AND t.typname LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP TYPE IF EXISTS %I CASCADE', r.typname);
    END LOOP;
END $$;
