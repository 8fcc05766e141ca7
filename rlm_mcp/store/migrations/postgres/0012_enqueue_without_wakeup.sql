-- `rlm_enqueue` (migration 0011) wakes no worker when its channel is NULL: a `both` replica's
-- front offers a run to its own worker, which it wakes in-process (`service.queue.local`), and
-- the other workers are told only if that worker does not claim it in time. The same signature
-- and body otherwise; an earlier release's calls always name the channel.
CREATE OR REPLACE FUNCTION rlm_enqueue(
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
        IF p_channel IS NOT NULL THEN
            PERFORM pg_notify(p_channel, 'queued');
        END IF;
        inserted := true;
    END IF;
END
$$;
