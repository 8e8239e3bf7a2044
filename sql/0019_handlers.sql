-- pgtaskd schema, version 19: the work is pluggable per queue (a command or an HTTP endpoint
-- besides the built-in text analyzer), so a task keeps the handler's answer, a failed attempt
-- may be tried again later, and a producer may pass a trace context.
--
-- - `output`: what a handler answered (its stdout, or the body of its 2xx answer), on
--   SUCCEEDED rows only, as `words`, `bytes` and `runes` are ("Results with status"). The
--   text analyzer leaves it null.
-- - `traceparent`: a W3C trace context the producer may set; the daemon hands it to the
--   handler (`TRACEPARENT`, the `traceparent` header) and logs it with the task.
-- - A failed attempt of a handler is not always the end: `pgtaskd.finish` takes, per row, a
--   delay after which the task is QUEUED again (`run_at` pushed back) while attempts remain;
--   the attempt's `error` stays on the row meanwhile, so `status` shows why it is waiting.
--   The error rule becomes: an error on every FAILED row, none on SUCCEEDED or CANCELED rows,
--   the last attempt's (or none) on QUEUED and RUNNING ones. A cancel of such a QUEUED task
--   clears it.
--
-- Both constraints are added NOT VALID, for the reason schema 18 gives: the migration's
-- transaction would otherwise scan every row under the table's ACCESS EXCLUSIVE lock. Every
-- row already there satisfies both (the new column is null everywhere, and the new error rule
-- is weaker than the old one); `ALTER TABLE pgtaskd.tasks VALIDATE CONSTRAINT ...` marks
-- them validated while writers go on.
--
-- The finish's previous signature is dropped: stop the daemons before applying it
-- (docs/upgrading.md, "Schema 19"), as for schema 16.

DO $$
DECLARE
    waits interval := pg_catalog.current_setting('lock_timeout')::interval;
BEGIN
    PERFORM pg_catalog.set_config('pgtaskd.lock_timeout_before_19',
                                  pg_catalog.current_setting('lock_timeout'), true);
    IF waits OPERATOR(pg_catalog.=) interval '0'
       OR waits OPERATOR(pg_catalog.>) interval '10 seconds' THEN
        PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    END IF;
END
$$;

ALTER TABLE pgtaskd.tasks
    ADD COLUMN output text,
    ADD COLUMN traceparent text,
    DROP CONSTRAINT tasks_error_only_when_failed,
    ADD CONSTRAINT tasks_error_when_failed
        CHECK ((status OPERATOR(pg_catalog.<>) 'FAILED' OR error IS NOT NULL)
               AND (error IS NULL OR status OPERATOR(pg_catalog.=) ANY (ARRAY['FAILED', 'QUEUED', 'RUNNING'])))
        NOT VALID,
    ADD CONSTRAINT tasks_output_only_when_succeeded
        CHECK (status OPERATOR(pg_catalog.=) 'SUCCEEDED' OR output IS NULL) NOT VALID,
    ADD CONSTRAINT tasks_traceparent_length
        CHECK (pg_catalog.octet_length(traceparent) OPERATOR(pg_catalog.<=) 512) NOT VALID;

SELECT pg_catalog.set_config('lock_timeout',
                             pg_catalog.current_setting('pgtaskd.lock_timeout_before_19'), true);

-- Roles that may insert a payload may set its trace context.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT a.grantee
          FROM pg_attribute AS c, pg_class AS t, aclexplode(c.attacl) AS a
         WHERE t.oid = 'pgtaskd.tasks'::regclass
           AND c.attrelid = t.oid
           AND c.attname = 'payload'
           AND a.privilege_type = 'INSERT'
           AND a.grantee <> t.relowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT INSERT (traceparent) ON pgtaskd.tasks TO %s', grantee::regrole);
    END LOOP;
END
$$;

-- Version 4's cancel, clearing the error a QUEUED task may now carry from a failed attempt.
CREATE OR REPLACE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- `coalesce(status, '')`: found by primary key, never by a scan of a partial index.
    UPDATE pgtaskd.tasks
       SET status = 'CANCELED', cancel_requested = true, finished_at = now(), error = NULL
     WHERE id = task_id AND coalesce(status, '') = 'QUEUED'
    RETURNING 'QUEUED', status INTO previous, current;
    IF FOUND THEN
        PERFORM pgtaskd.notify_done(ARRAY[task_id]);
        RETURN;
    END IF;

    UPDATE pgtaskd.tasks SET cancel_requested = true
     WHERE id = task_id AND coalesce(status, '') = 'RUNNING'
    RETURNING 'RUNNING', status INTO previous, current;
    IF FOUND THEN
        PERFORM pg_notify('pgtaskd_cancel', task_id::text);
        RETURN;
    END IF;

    SELECT status, status INTO previous, current FROM pgtaskd.tasks WHERE id = task_id;
END
$$;

-- Version 6's retry, clearing the output too.
CREATE OR REPLACE FUNCTION pgtaskd.retry(task_id bigint) RETURNS text
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
           output = NULL,
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

DO $$
BEGIN
    -- The grants of the finish being replaced, kept for the new one below.
    CREATE TEMPORARY TABLE finish_grantees ON COMMIT DROP AS
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], boolean)'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0;
END
$$;
DROP FUNCTION pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], boolean);

-- Version 16's finish, with each row's output, and a delay for a failed attempt to be tried
-- again: a FAILED finish with a `retry_in` (seconds) makes the task QUEUED again at
-- `now() + retry_in` while its attempts are not all used, keeping the attempt's error; else
-- FAILED as before. Only the rows it ended are announced on `pgtaskd_done`.
CREATE FUNCTION pgtaskd.finish(
    tokens   bigint[],
    ids      bigint[],
    statuses text[],
    words    bigint[],
    bytes    bigint[],
    runes    bigint[],
    errors   text[],
    outputs  text[],
    retry_in float8[],
    wait     boolean
) RETURNS TABLE (task_id bigint, written text, current text, skipped boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT *
          FROM unnest(finish.tokens, finish.ids, finish.statuses, finish.words,
                      finish.bytes, finish.runes, finish.errors, finish.outputs,
                      finish.retry_in)
               AS f(token, id, status, words, bytes, runes, error, output, retry_in)
         ORDER BY f.id
    ), held AS MATERIALIZED (
        -- The rows to write, locked in id order: by default those no one else holds...
        SELECT h.id FROM (
            SELECT k.id FROM pgtaskd.tasks AS k
             WHERE NOT finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE SKIP LOCKED) AS h
        UNION ALL
        -- ...or, asked to wait, every one of them.
        SELECT w.id FROM (
            SELECT k.id FROM pgtaskd.tasks AS k
             WHERE finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE) AS w
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           -- Tried again: a failed attempt with a delay, attempts left, no cancel.
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED'
                             WHEN f.status = 'FAILED' AND f.retry_in IS NOT NULL
                                  AND t.attempt < t.max_attempts THEN 'QUEUED'
                             ELSE f.status END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.runes END,
               output = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.output END,
               error = CASE WHEN t.cancel_requested OR f.status <> 'FAILED' THEN NULL ELSE f.error END,
               run_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                  AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
                             THEN now() + f.retry_in * interval '1 second' ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
                                  THEN NULL ELSE now() END
          FROM input AS f
         -- Looked up by primary key, the rows held as the index condition (version 11).
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           AND t.id = f.id
           -- Written so that it cannot steer the lookup to the partial index of RUNNING rows.
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = f.token
           -- Only a recorded cancel request ends a task CANCELED.
           AND (f.status <> 'CANCELED' OR t.cancel_requested)
        RETURNING t.id, t.status
    ), notified AS (
        -- One row whatever `done` holds (an aggregate); volatile, so evaluated once, after
        -- every row of `done` was written. A task QUEUED again has not ended.
        SELECT pgtaskd.notify_done(array_agg(done.id)) AS sent FROM done
         WHERE done.status <> 'QUEUED'
    )
    SELECT f.id, d.status,
           -- What a finish that wrote nothing found, as the row stands (not locked).
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.tasks AS c WHERE c.id = f.id) END,
           -- Skipped: not written, not held, and still this claim's.
           d.id IS NULL
             AND NOT (f.id = ANY (ARRAY(SELECT held.id FROM held)))
             AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS c
                          WHERE c.id = f.id AND c.claim_token = f.token
                            AND coalesce(c.status, '') = 'RUNNING')
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id
     CROSS JOIN notified;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[], boolean) FROM PUBLIC;
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN SELECT g.grantee FROM finish_grantees AS g
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.finish(bigint[], bigint[], text[], '
                       'bigint[], bigint[], bigint[], text[], text[], float8[], boolean) TO %s',
                       grantee::regrole);
    END LOOP;
END
$$;

-- The producer's and the daemon's rights of version 16, with the trace context and the new
-- finish.
CREATE OR REPLACE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;

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
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint) '
                   'TO %I', role_name);
END
$$;
