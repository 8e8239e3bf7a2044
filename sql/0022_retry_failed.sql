-- pgtaskd schema, version 22: retrying the FAILED tasks of a queue, a batch at a time.
--
-- `pgtaskd.retry_failed(queue, max_rows, after_id)` puts at most `max_rows` (default 10,000)
-- FAILED tasks of `queue` with an id over `after_id` (default 0), lowest ids first, back to
-- QUEUED exactly as `pgtaskd.retry(id)` does (version 19: `attempt` 0, no error, no output,
-- no results, no cancel request, no lease, no start or finish time, due now), wakes the
-- daemons, and returns how many it retried (`retried`) and the highest id among them
-- (`last_id`; `after_id` when none). One call is one statement: a caller with a million
-- FAILED rows calls it until `retried` is 0, each call its own transaction, instead of
-- holding one giant one, and passes the last call's `last_id` as `after_id`, so that each
-- call starts where the last one stopped rather than stepping again over the index entries
-- of the rows already retried (left in `tasks_list_queue_idx` until a vacuum). The rows are
-- found through that index (queue, status, id); a row another transaction holds locked is
-- skipped, left for a later pass from 0.
--
-- It runs with its owner's rights, like `pgtaskd.retry`: the roles that may execute that one
-- (`grant_operator`, `grant_daemon`, both re-created here, and the roles already granted)
-- may execute this one; PUBLIC may not.

CREATE FUNCTION pgtaskd.retry_failed(
    queue    text,
    max_rows integer DEFAULT 10000,
    after_id bigint DEFAULT 0,
    OUT retried bigint,
    OUT last_id bigint
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'pgtaskd.retry_failed: max_rows must be at least 1, not %', max_rows
            USING ERRCODE = '22023';
    END IF;
    WITH batch AS (
        SELECT t.id
          FROM pgtaskd.tasks AS t
         WHERE t.queue = retry_failed.queue
           AND t.status = 'FAILED'
           AND t.id > coalesce(retry_failed.after_id, 0)
         ORDER BY t.id
         LIMIT retry_failed.max_rows
           FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           SET status = 'QUEUED',
               attempt = 0,
               cancel_requested = false,
               words = 0,
               bytes = 0,
               runes = 0,
               output = NULL,
               error = NULL,
               lease_owner = NULL,
               lease_expires_at = NULL,
               started_at = NULL,
               finished_at = NULL,
               run_at = now()
          FROM batch
         WHERE t.id = batch.id
           AND t.status = 'FAILED'
        RETURNING t.id
    )
    SELECT count(*), coalesce(max(done.id), coalesce(retry_failed.after_id, 0))
      INTO retried, last_id
      FROM done;
    IF retried > 0 THEN
        PERFORM pg_notify('pgtaskd_tasks', '');
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.retry_failed(text, integer, bigint) FROM PUBLIC;

-- The roles that may retry one task may retry a queue's failed ones.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.retry(bigint)'::pg_catalog.regprocedure::pg_catalog.oid
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.retry_failed(text, integer, bigint) TO %s',
                               grantee::pg_catalog.regrole);
    END LOOP;
END
$$;

-- The daemon's rights of version 21, and retrying a queue's failed tasks.
CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer, and steer queues like
    -- an operator; `/metrics` and `/readyz` read the vacuum health.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations, pgtaskd.paused_queues TO %I',
                   role_name);
    -- Each daemon flags itself idle (version 7).
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskd.idle_daemons TO %I',
                   role_name);
    -- Each daemon records itself, and forgets the long gone (version 21).
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskd.daemons TO %I',
                   role_name);
    -- Each claim takes a token (version 16).
    EXECUTE format('GRANT USAGE ON SEQUENCE pgtaskd.claim_tokens TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint), '
                   'pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[], boolean), '
                   'pgtaskd.notify_done(bigint[]), pgtaskd.vacuum_health(), '
                   'pgtaskd.prune(float8, bigint, timestamptz) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.retry_failed(text, integer, bigint) '
                   'TO %I', role_name);
END
$$;

-- The operator's rights of version 21, and retrying a queue's failed tasks.
CREATE OR REPLACE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.paused_queues, '
                   'pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.pause_queue(text), '
                   'pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.retry_failed(text, integer, bigint), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.vacuum_health() TO %I', role_name);
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
END
$$;
