-- pgtaskd schema, version 3: claims and finishes as PL/pgSQL functions, planned once per
-- session.
--
-- Version 1's claim was a SQL function: PostgreSQL parses and plans the body of such a
-- function on every call, which cost more than the claim itself. A PL/pgSQL function keeps
-- its plan for the session (force_generic_plan: one plan, made under the function's planner
-- settings, and made again only when the table's statistics or definition change). The finish
-- moves into a function of the same kind, for the same reason and for the same protection
-- against stale statistics: a table vacuumed while empty and then filled by a burst would
-- otherwise get its finishes planned as sequential scans that test every row against the
-- whole batch.

CREATE OR REPLACE FUNCTION pgtaskd.claim(queues text[], max_tasks bigint, owner text, lease_ms float8)
RETURNS TABLE (task_id bigint, task_attempt int, task_payload text, waited_s float8)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
-- The disabled plans' cost penalty would otherwise trigger JIT compilation.
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT c.id
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                SELECT k.id, k.priority
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         ORDER BY c.priority DESC, c.id
         LIMIT claim.max_tasks
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
        RETURNING t.id, t.attempt, t.payload, t.priority,
                  extract(epoch FROM now() - greatest(t.created_at, t.run_at))::float8 AS waited
    )
    -- In claim order, which is the order the daemon starts them in.
    SELECT claimed.id, claimed.attempt, claimed.payload, claimed.waited
      FROM claimed
     ORDER BY claimed.priority DESC, claimed.id;
END
$$;

-- Finish: commit the outcomes of many claims of `owner` in one statement. Each row is fenced
-- on its own (still RUNNING under the same attempt and owner); a cancel requested meanwhile
-- turns the outcome into CANCELED with zero counts. Rows are locked in id order. For every
-- input row: the status written, or null and the status the row has now (null: no such task).
CREATE FUNCTION pgtaskd.finish(
    owner    text,
    ids      bigint[],
    attempts int[],
    statuses text[],
    words    bigint[],
    bytes    bigint[],
    runes    bigint[],
    errors   text[]
) RETURNS TABLE (task_id bigint, written text, current text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT *
          FROM unnest(finish.ids, finish.attempts, finish.statuses, finish.words,
                      finish.bytes, finish.runes, finish.errors)
               AS f(id, attempt, status, words, bytes, runes, error)
         ORDER BY f.id
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED' ELSE f.status END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.runes END,
               error = CASE WHEN t.cancel_requested OR f.status <> 'FAILED' THEN NULL ELSE f.error END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = now()
          FROM input AS f
         WHERE t.id = f.id
           -- Found by primary key: the status test is written so that it cannot steer the
           -- lookup to the partial index of RUNNING rows.
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.attempt = f.attempt
           AND t.lease_owner = finish.owner
        RETURNING t.id, t.status
    )
    SELECT f.id, d.status,
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.tasks AS c WHERE c.id = f.id) END
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[])
    FROM PUBLIC;

-- Roles already granted the daemon's rights (they can execute claim) get the finish too.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.claim(text[], bigint, text, float8)'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.finish(text, bigint[], int[], text[], '
                       'bigint[], bigint[], bigint[], text[]) TO %I', grantee::regrole);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8), '
                   'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[]) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;
