-- A run's start in one statement (`store.pg.queue.PgRunQueue.enqueue`): the waiting bounds are
-- counted and the run inserted under the enqueue's advisory lock, inside one call. The rule needs
-- the count to see every run inserted by the starts that held the lock before; a statement's
-- snapshot is taken when it begins, so in plain SQL the lock was a statement of its own (BEGIN,
-- the lock, the insert, COMMIT: four statements a run). In a VOLATILE PL/pgSQL function under READ
-- COMMITTED each statement takes a fresh snapshot, so the count after the lock, in the same call,
-- sees them; the lock is held to the end of the call's (autocommit) transaction.
--
-- The run's contexts are checked in the same call: `missing` is the first id (in the given
-- order) its owner holds no context by, and then nothing is inserted and no lock is taken. The
-- bounds are the caller's (the settings), the lock key `store.pg.locks.ENQUEUE_LOCK_KEY`, the
-- channel the workers' wake-up channel: nothing of the rules lives only here.
--
-- `context_ids`: the run's contexts as its request names them (`p_run_contexts`, in order), so
-- that a worker's claim pins them in its own statement (`queue_statements.CLAIM`) without reading
-- the record's JSON. NULL on a row queued by an earlier release: its worker pins them itself.
ALTER TABLE rlm_runs ADD COLUMN context_ids text[];

CREATE FUNCTION rlm_enqueue(
    p_lock bigint, p_run_id text, p_owner text, p_created_at double precision, p_summary text,
    p_need integer, p_max_total bigint, p_max_mine bigint, p_channel text, p_prefer bigint,
    p_prefer_s double precision, p_contexts text[], p_run_contexts text[],
    OUT total bigint, OUT mine bigint, OUT inserted boolean, OUT missing text)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    SELECT u.id INTO missing FROM unnest(p_contexts) WITH ORDINALITY AS u(id, n)
        WHERE NOT EXISTS (SELECT 1 FROM rlm_context_owners o WHERE o.context_id = u.id AND o.owner = p_owner)
        ORDER BY u.n LIMIT 1;
    inserted := false;
    IF missing IS NOT NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(p_lock);
    SELECT count(*), count(*) FILTER (WHERE r.owner = p_owner) INTO total, mine
        FROM rlm_runs r WHERE r.state = 'queued';
    IF total < p_max_total AND mine < p_max_mine THEN
        INSERT INTO rlm_runs (run_id, owner, created_at, updated_at, state, summary, need, queued_at,
                              prefer_worker, prefer_until, context_ids)
        VALUES (p_run_id, p_owner, p_created_at, extract(epoch FROM now()), 'queued', p_summary, p_need,
                clock_timestamp(), p_prefer, clock_timestamp() + make_interval(secs => p_prefer_s),
                p_run_contexts);
        PERFORM pg_notify(p_channel, 'queued');
        inserted := true;
    END IF;
END
$$;
