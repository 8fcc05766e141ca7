-- Applied the schema of Procrastinate, the job queue team mode used before it claimed runs on
-- rlm_runs itself (0006 removes those tables). A new database skips it: nothing of it is used
-- any more.
SELECT 1
