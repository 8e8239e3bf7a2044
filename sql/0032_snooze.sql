-- pgtaskd schema, version 32: a handler may ask to run later without using an attempt (a
-- snooze: an exec command's exit 75, an endpoint's 202 with Retry-After; docs/handlers.md,
-- "Snooze").
--
-- `pgtaskd.finish` takes a fourth outcome, `SNOOZED`, with the delay in `retry_in`: the task
-- is QUEUED again that much later, its attempt not counted (as a shutdown's release), its
-- last error kept, and `snoozes` counts it. The 101st snooze of a task fails it instead, with
-- the error the daemon sent, so that a handler that always snoozes cannot hold a task for
-- ever. A retry starts the count again. Same arguments and answers: daemons of schema 31 may
-- run while it is applied, and stop at the schema check when restarted.

ALTER TABLE pgtaskd.tasks ADD COLUMN snoozes int NOT NULL DEFAULT 0;
COMMENT ON COLUMN pgtaskd.tasks.snoozes IS
    'How many times the handler asked to run the task later without using an attempt (at most 100; a retry resets it).';

-- The view gains the count, after its columns of version 30.
CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT t.id, t.queue, t.payload, t.status, t.priority, t.run_at, t.attempt, t.max_attempts,
       t.cancel_requested, t.words, t.bytes, t.runes, t.error, t.lease_owner,
       t.lease_expires_at, t.created_at, t.started_at, t.finished_at, t.idempotency_key,
       t.claim_token, t.output, t.traceparent,
       coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || t.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       t.runs, t.errors, t.snoozes
  FROM pgtaskd.tasks AS t;

CREATE OR REPLACE FUNCTION pgtaskd.finish(
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
           -- Tried again: a failed attempt with a delay, attempts left, no cancel; or a
           -- snooze, which uses no attempt, the 100th snooze aside (version 32).
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED'
                             WHEN f.status = 'FAILED' AND f.retry_in IS NOT NULL
                                  AND t.attempt < t.max_attempts THEN 'QUEUED'
                             WHEN f.status = 'SNOOZED' AND t.snoozes < 100 THEN 'QUEUED'
                             WHEN f.status = 'SNOOZED' THEN 'FAILED'
                             ELSE f.status END,
               attempt = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND t.snoozes < 100 THEN t.attempt - 1
                              ELSE t.attempt END,
               snoozes = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND t.snoozes < 100 THEN t.snoozes + 1
                              ELSE t.snoozes END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.runes END,
               output = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.output END,
               error = CASE WHEN t.cancel_requested THEN NULL
                            WHEN f.status = 'SNOOZED' AND t.snoozes < 100 THEN t.error
                            WHEN f.status NOT IN ('FAILED', 'SNOOZED') THEN NULL
                            ELSE f.error END,
               -- Every failed attempt's error, the last ten (version 30); a snooze is none.
               errors = CASE WHEN t.cancel_requested OR f.status NOT IN ('FAILED', 'SNOOZED')
                                  OR (f.status = 'SNOOZED' AND t.snoozes < 100) THEN t.errors
                             ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs, f.error) END,
               run_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                  AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
                             THEN now() + f.retry_in * interval '1 second'
                             WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                  AND t.snoozes < 100
                             THEN now() + coalesce(f.retry_in, 0) * interval '1 second'
                             ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
                                  THEN NULL
                                  WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                       AND t.snoozes < 100
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
           snoozes = 0,
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
    PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    RETURN previous;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.retry_failed(
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
               snoozes = 0,
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
        PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    END IF;
END
$$;
