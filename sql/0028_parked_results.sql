-- pgtaskd schema, version 28: results parked by a stopping daemon, written by the rescuers.
--
-- A daemon told to stop writes the results it computed, each fenced on its claim's token. A
-- row that another transaction holds locked (a producer's `SELECT ... FOR UPDATE` left open,
-- a cancel in an open transaction) cannot be written until that transaction ends, and a stop
-- cannot wait for it without bound. Until version 27 the daemon then exited 69 with the claim
-- RUNNING, and once the row was free a rescuer took the claim back and the task ran again: a
-- producer's open transaction made finished work run twice.
--
-- Now the stop parks such a result in `pgtaskd.parked_results` (an insert, which no lock on
-- the task's row holds up) and exits 0. A rescuer, once the claim's lease has expired and the
-- row is free, writes the parked result through `pgtaskd.finish`, fenced on the same token, as
-- the stopped daemon would have: the task ends with the result it computed, and never goes
-- back to QUEUED for a claim whose result is parked (`pgtaskd.rescue` passes over it). A
-- parked result whose claim is over anyway (the task canceled, retried, deleted) is dropped.
--
-- The daemon's role may park and write parked results: `grant_daemon` from now on, and here
-- every role that may already rescue. Nothing else changes: a daemon of schema 27 may run
-- while this is applied, and stops at the schema check when restarted, as after every
-- migration.

CREATE TABLE pgtaskd.parked_results (
    task_id     bigint      NOT NULL,
    claim_token bigint      NOT NULL,
    -- The arguments `pgtaskd.finish` takes for one row.
    status      text        NOT NULL,
    words       bigint      NOT NULL,
    bytes       bigint      NOT NULL,
    runes       bigint      NOT NULL,
    error       text,
    output      text,
    retry_in    float8,
    parked_at   timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (task_id, claim_token)
);

COMMENT ON TABLE pgtaskd.parked_results IS
    'Results a stopping daemon could not write because another transaction held the task''s '
    'row; a rescuer writes each once its lease expired and the row is free (schema 28).';

-- Park the results of claims `tokens` of tasks `ids` (the arrays of `pgtaskd.finish`), for
-- the rows still RUNNING under those claims. Reads the rows without locking them, so that a
-- row someone else holds does not hold it up. Returns the ids parked, now or before.
CREATE FUNCTION pgtaskd.park(
    tokens   bigint[],
    ids      bigint[],
    statuses text[],
    words    bigint[],
    bytes    bigint[],
    runes    bigint[],
    errors   text[],
    outputs  text[],
    retry_in float8[]
) RETURNS TABLE (task_id bigint)
LANGUAGE plpgsql
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO pgtaskd.parked_results
           (task_id, claim_token, status, words, bytes, runes, error, output, retry_in)
    SELECT f.id, f.token, f.status, f.words, f.bytes, f.runes, f.error, f.output, f.retry_in
      FROM unnest(park.tokens, park.ids, park.statuses, park.words, park.bytes, park.runes,
                  park.errors, park.outputs, park.retry_in)
           AS f(token, id, status, words, bytes, runes, error, output, retry_in)
     WHERE EXISTS (SELECT 1 FROM pgtaskd.tasks AS k
                    WHERE k.id = f.id AND k.claim_token = f.token
                      AND coalesce(k.status, '') = 'RUNNING')
    ON CONFLICT (task_id, claim_token) DO NOTHING;
    RETURN QUERY
    SELECT p.task_id
      FROM pgtaskd.parked_results AS p,
           unnest(park.ids, park.tokens) AS f(id, token)
     WHERE p.task_id = f.id AND p.claim_token = f.token;
END
$$;

-- Write up to `max_tasks` parked results whose claims' leases expired (other than those of
-- instance `owner`), through `pgtaskd.finish`: fenced on the parked token, rows someone else
-- holds skipped (written by a later call). Then drop every parked result whose claim is
-- over. One row per result written: the task and the status written.
CREATE FUNCTION pgtaskd.write_parked(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    due_tokens   bigint[];
    due_ids      bigint[];
    due_statuses text[];
    due_words    bigint[];
    due_bytes    bigint[];
    due_runes    bigint[];
    due_errors   text[];
    due_outputs  text[];
    due_retry_in float8[];
BEGIN
    SELECT array_agg(d.claim_token ORDER BY d.task_id), array_agg(d.task_id ORDER BY d.task_id),
           array_agg(d.status ORDER BY d.task_id), array_agg(d.words ORDER BY d.task_id),
           array_agg(d.bytes ORDER BY d.task_id), array_agg(d.runes ORDER BY d.task_id),
           array_agg(d.error ORDER BY d.task_id), array_agg(d.output ORDER BY d.task_id),
           array_agg(d.retry_in ORDER BY d.task_id)
      INTO due_tokens, due_ids, due_statuses, due_words, due_bytes, due_runes, due_errors,
           due_outputs, due_retry_in
      FROM (SELECT p.*
              FROM pgtaskd.parked_results AS p
              JOIN pgtaskd.tasks AS k ON k.id = p.task_id AND k.claim_token = p.claim_token
             WHERE coalesce(k.status, '') = 'RUNNING' AND k.lease_expires_at < now()
               AND k.lease_owner IS DISTINCT FROM write_parked.owner
             ORDER BY p.parked_at
             LIMIT write_parked.max_tasks) AS d;
    IF due_ids IS NOT NULL THEN
        RETURN QUERY
        SELECT f.task_id, f.written
          FROM pgtaskd.finish(due_tokens, due_ids, due_statuses, due_words, due_bytes,
                              due_runes, due_errors, due_outputs, due_retry_in, false) AS f
         WHERE f.written IS NOT NULL;
    END IF;
    DELETE FROM pgtaskd.parked_results AS p
     WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.tasks AS k
                        WHERE k.id = p.task_id AND k.claim_token = p.claim_token
                          AND coalesce(k.status, '') = 'RUNNING');
END
$$;

-- Version 26's rescue, passing over claims whose result is parked: `write_parked` ends them.
CREATE OR REPLACE FUNCTION pgtaskd.rescue(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_attempt int, task_previous_owner text, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT k.id, k.attempt, k.claim_token, k.lease_owner
          FROM pgtaskd.tasks AS k
         WHERE k.status = 'RUNNING' AND k.lease_expires_at < now()
           AND k.lease_owner IS DISTINCT FROM rescue.owner
           -- A result is parked for this claim (version 28).
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.parked_results AS p
                            WHERE p.task_id = k.id AND p.claim_token = k.claim_token)
         ORDER BY k.lease_expires_at
         LIMIT rescue.max_tasks
           FOR UPDATE SKIP LOCKED
    ), rescued AS (
        UPDATE pgtaskd.tasks AS t
           SET status = CASE
                   WHEN t.cancel_requested THEN 'CANCELED'
                   WHEN t.attempt < t.max_attempts THEN 'QUEUED'
                   ELSE 'FAILED'
               END,
               error = CASE
                   WHEN NOT t.cancel_requested AND t.attempt >= t.max_attempts
                   THEN format('lease lost after %s attempts (last held by %s)',
                               t.attempt, t.lease_owner)
               END,
               -- The n-th lost lease waits (n-1)^2 seconds, at most ten minutes.
               run_at = CASE
                   WHEN NOT t.cancel_requested AND t.attempt < t.max_attempts
                   THEN now() + least(power(t.attempt - 1, 2), 600) * interval '1 second'
                   ELSE t.run_at
               END,
               finished_at = CASE
                   WHEN t.cancel_requested OR t.attempt >= t.max_attempts THEN now()
               END,
               lease_owner = NULL,
               lease_expires_at = NULL
          FROM expired
         WHERE t.id = expired.id
           AND t.status = 'RUNNING'
           AND t.claim_token IS NOT DISTINCT FROM expired.claim_token
           AND t.lease_expires_at < now()
        RETURNING t.id, expired.attempt, expired.lease_owner, t.status
    ), notified AS (
        SELECT pgtaskd.notify_done(array_agg(r.id)) AS sent
          FROM rescued AS r WHERE r.status <> 'QUEUED'
    )
    SELECT r.id, r.attempt, r.lease_owner, r.status
      FROM rescued AS r CROSS JOIN notified;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.park(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.write_parked(bigint, text) FROM PUBLIC;

-- The roles that may rescue may park results and write them.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.rescue(bigint, text)'::pg_catalog.regprocedure::pg_catalog.oid
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, DELETE ON pgtaskd.parked_results TO %s',
                                  grantee::pg_catalog.regrole);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION '
                                  'pgtaskd.park(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[]), '
                                  'pgtaskd.write_parked(bigint, text) TO %s',
                                  grantee::pg_catalog.regrole);
    END LOOP;
END
$$;

-- The daemon's rights of version 26, and parking and writing parked results.
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
    -- The CLI and the HTTP API read tasks' state through the view (version 24).
    EXECUTE format('GRANT SELECT ON pgtaskd.task_view TO %I', role_name);
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
    -- Heartbeats, rescues, releases and re-reads of claims (version 26).
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.heartbeat(bigint[], bigint[], float8), '
                   'pgtaskd.extend_lease(bigint, bigint, float8), '
                   'pgtaskd.rescue(bigint, text), '
                   'pgtaskd.release(bigint, bigint, boolean), '
                   'pgtaskd.claim_state(bigint, boolean) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.retry_failed(text, integer, bigint) '
                   'TO %I', role_name);
    -- A stopping daemon parks the results it cannot write; rescuers write them (version 28).
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON pgtaskd.parked_results TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.park(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[]), '
                   'pgtaskd.write_parked(bigint, text) '
                   'TO %I', role_name);
END
$$;
