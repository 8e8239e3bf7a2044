-- pgtaskd schema, version 6: operators steer their queues.
--
-- Pause and resume. A paused queue has a row in `pgtaskd.paused_queues`; the claim skips
-- it, so daemons stop claiming from it at their next claim, whatever woke them. Tasks already
-- RUNNING finish; producers keep enqueueing into it. `pgtaskd.pause_queue(q)` and
-- `pgtaskd.resume_queue(q)` run with their owner's rights, so an operator role needs only
-- EXECUTE on them (see `pgtaskd.grant_operator`). Both send `NOTIFY pgtaskd_queues` with the
-- queue's name; a resume also sends `NOTIFY pgtaskd_tasks`, which wakes every daemon to claim
-- at once rather than at its next poll. Both return whether they changed anything.
--
-- Retry. `pgtaskd.retry(id)` puts a FAILED or CANCELED task back to QUEUED as if it were
-- new: `attempt` 0, no error, no results, no cancel request, no start or finish time, due
-- now. It returns the status the task had (so null for an unknown id, and the status itself,
-- unchanged, for a task that is not FAILED or CANCELED), and wakes the daemons.
--
-- The schema-4 claim is re-created with the pause test, every guard and planner setting kept.

CREATE TABLE pgtaskd.paused_queues (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE pgtaskd.paused_queues IS
    'pgtaskd: queues no daemon claims from; pgtaskd.pause_queue(q) / pgtaskd.resume_queue(q)';

CREATE FUNCTION pgtaskd.pause_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO pgtaskd.paused_queues AS p (queue) VALUES (pause_queue.queue)
        ON CONFLICT (queue) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('pgtaskd_queues', pause_queue.queue);
    RETURN true;
END
$$;

CREATE FUNCTION pgtaskd.resume_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    DELETE FROM pgtaskd.paused_queues AS p WHERE p.queue = resume_queue.queue;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('pgtaskd_queues', resume_queue.queue);
    PERFORM pg_notify('pgtaskd_tasks', '');
    RETURN true;
END
$$;

CREATE FUNCTION pgtaskd.retry(task_id bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    previous text;
BEGIN
    SELECT t.status INTO previous FROM pgtaskd.tasks AS t WHERE t.id = retry.task_id FOR UPDATE;
    IF previous IS NULL OR previous NOT IN ('FAILED', 'CANCELED') THEN
        RETURN previous;
    END IF;
    UPDATE pgtaskd.tasks AS t
       SET status = 'QUEUED',
           attempt = 0,
           cancel_requested = false,
           words = 0,
           bytes = 0,
           runes = 0,
           error = NULL,
           lease_owner = NULL,
           lease_expires_at = NULL,
           started_at = NULL,
           finished_at = NULL,
           run_at = now()
     WHERE t.id = retry.task_id
       AND t.status IN ('FAILED', 'CANCELED');
    PERFORM pg_notify('pgtaskd_tasks', '');
    RETURN previous;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.pause_queue(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.resume_queue(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.retry(bigint) FROM PUBLIC;

-- The claim of version 4, every guard and setting kept; a queue of `paused_queues` is left
-- out before its index scan starts (a primary-key probe per queue named).
CREATE OR REPLACE FUNCTION pgtaskd.claim(
    queues      text[],
    max_tasks   bigint,
    owner       text,
    lease_ms    float8,
    max_bytes   bigint,
    take_one    boolean,
    max_payload bigint
) RETURNS TABLE (task_id bigint, task_attempt int, task_payload text, task_bytes bigint,
                 waited_s float8)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH candidates AS MATERIALIZED (
        SELECT c.id, c.priority, c.size
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                SELECT k.id, k.priority, octet_length(k.payload)::bigint AS size
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
         ORDER BY c.priority DESC, c.id
         LIMIT claim.max_tasks
    ), sized AS MATERIALIZED (
        -- A payload that will not be loaded weighs nothing in the budget.
        SELECT s.id, s.size,
               row_number() OVER w AS n,
               sum(CASE WHEN s.size > claim.max_payload THEN 0 ELSE s.size END) OVER w AS running
          FROM candidates AS s
        WINDOW w AS (ORDER BY s.priority DESC, s.id)
    ), picked AS MATERIALIZED (
        SELECT z.id FROM sized AS z
         WHERE z.running <= claim.max_bytes OR (claim.take_one AND z.n = 1)
    ), claimed AS (
        UPDATE pgtaskd.tasks AS t
           SET status = 'RUNNING',
               attempt = t.attempt + 1,
               lease_owner = claim.owner,
               lease_expires_at = now() + claim.lease_ms * interval '1 millisecond',
               started_at = now()
         WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
           -- The re-check, written so that it cannot steer the row lookup to a partial
           -- index (stale statistics make those look tiny): the rows are found by primary key.
           AND coalesce(t.status, '') = 'QUEUED'
        RETURNING t.id, t.attempt, t.priority,
                  CASE WHEN octet_length(t.payload) > claim.max_payload THEN NULL
                       ELSE t.payload END AS payload,
                  octet_length(t.payload)::bigint AS size,
                  extract(epoch FROM now() - greatest(t.created_at, t.run_at))::float8 AS waited
    )
    -- In claim order, which is the order the daemon starts them in; then the row that says
    -- the budget left some out.
    (SELECT claimed.id, claimed.attempt, claimed.payload, claimed.size, claimed.waited
       FROM claimed
      ORDER BY claimed.priority DESC, claimed.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1);
END
$$;

-- An operator: reads tasks and paused queues, pauses, resumes, retries and cancels; inserts
-- nothing and claims nothing.
CREATE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.paused_queues, '
                   'pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.pause_queue(text), '
                   'pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.grant_operator(name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer, and steer queues like
    -- an operator.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations, pgtaskd.paused_queues TO %I',
                   role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8), '
                   'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint), '
                   'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[]), '
                   'pgtaskd.notify_done(bigint[]) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint) '
                   'TO %I', role_name);
END
$$;

-- Roles already granted the daemon's rights (they can execute the finish) read the paused
-- queues in their claims, and steer queues as `grant_daemon` now allows.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[])'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT ON pgtaskd.paused_queues TO %I', grantee::regrole);
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.pause_queue(text), '
                       'pgtaskd.resume_queue(text), pgtaskd.retry(bigint) TO %I',
                       grantee::regrole);
    END LOOP;
END
$$;
