-- pgtaskd schema, version 40: narrower state rows (docs/storage.md, "Built: the state in a row
-- of its own").
--
-- `task_state.words`, `bytes`, `runes`, `runs` and `snoozes` lose their NOT NULL and their
-- default 0: NULL until the task succeeds (the counts), is first claimed (`runs`) or first
-- snoozes (`snoozes`). The versions of the state row that a claim and a finish leave behind,
-- which a held snapshot keeps, are about 70 bytes narrower a task. `pgtaskd.task_view`
-- answers 0 for NULL, so every reader sees what it saw; the finish counts snoozes from
-- NULL and writes NULL counts for what did not succeed. Rows written before keep their zeros.
--
-- Locks: `ACCESS EXCLUSIVE` on `pgtaskd.task_state` for the column changes (no rewrite, no
-- scan), and the view's and the finish's replacement.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

ALTER TABLE pgtaskd.task_state
    ALTER COLUMN words DROP NOT NULL,
    ALTER COLUMN words DROP DEFAULT,
    ALTER COLUMN bytes DROP NOT NULL,
    ALTER COLUMN bytes DROP DEFAULT,
    ALTER COLUMN runes DROP NOT NULL,
    ALTER COLUMN runes DROP DEFAULT,
    ALTER COLUMN runs DROP NOT NULL,
    ALTER COLUMN runs DROP DEFAULT,
    ALTER COLUMN snoozes DROP NOT NULL,
    ALTER COLUMN snoozes DROP DEFAULT;

CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT s.id, s.queue, t.payload, s.status, s.priority, s.run_at, s.attempt,
       coalesce(s.max_attempts, pgtaskd.queue_max_attempts(s.queue)) AS max_attempts,
       s.cancel_requested, coalesce(s.words, 0) AS words, coalesce(s.bytes, 0) AS bytes,
       coalesce(s.runes, 0) AS runes, s.error, s.lease_owner,
       s.lease_expires_at, t.created_at, s.started_at, s.finished_at, t.idempotency_key,
       s.claim_token, s.output, t.traceparent,
       coalesce((SELECT x.id FROM pgtaskd.site AS x), 'nosite') || '-' || s.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       coalesce(s.runs, 0) AS runs, s.errors, coalesce(s.snoozes, 0) AS snoozes,
       s.concurrency_key, t.depends_on, t.on_dep_failure,
       t.tags, t.metadata, s.progress, s.progress_at, t.batch_id
  FROM pgtaskd.task_state AS s
 CROSS JOIN LATERAL (SELECT x.payload, x.created_at, x.idempotency_key, x.traceparent,
                            x.depends_on, x.on_dep_failure, x.tags, x.metadata, x.batch_id
                       FROM pgtaskd.tasks AS x
                      WHERE x.id = s.id
                     OFFSET 0) AS t;

-- Finish: commit many claims' outcomes in one statement, each fenced on its claim token
-- ("Fenced finish", "Results with status"); rows someone else holds locked are skipped and
-- reported ("No one else's lock delays a batch"); one `pgtaskd_done` notification for the
-- rows it ended ("Completion notifications").
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
DECLARE
    answer_ids     bigint[];
    answer_written text[];
    answer_current text[];
    answer_skipped boolean[];
BEGIN
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
            SELECT k.id FROM pgtaskd.task_state AS k
             WHERE NOT finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE SKIP LOCKED) AS h
        UNION ALL
        -- ...or, asked to wait, every one of them.
        SELECT w.id FROM (
            SELECT k.id FROM pgtaskd.task_state AS k
             WHERE finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE) AS w
    ), done AS (
        UPDATE pgtaskd.task_state AS t
           -- Tried again: a failed attempt with a delay, attempts left, no cancel; or a
           -- snooze, which uses no attempt, the 100th snooze aside (version 32).
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED'
                             WHEN f.status = 'FAILED' AND f.retry_in IS NOT NULL
                                  AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue)) THEN 'QUEUED'
                             WHEN f.status = 'SNOOZED' AND coalesce(t.snoozes, 0) < 100 THEN 'QUEUED'
                             WHEN f.status = 'SNOOZED' THEN 'FAILED'
                             ELSE f.status END,
               attempt = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND coalesce(t.snoozes, 0) < 100 THEN t.attempt - 1
                              ELSE t.attempt END,
               snoozes = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND coalesce(t.snoozes, 0) < 100 THEN coalesce(t.snoozes, 0) + 1
                              ELSE t.snoozes END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.runes END,
               output = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.output END,
               error = CASE WHEN t.cancel_requested THEN NULL
                            WHEN f.status = 'SNOOZED' AND coalesce(t.snoozes, 0) < 100 THEN t.error
                            WHEN f.status NOT IN ('FAILED', 'SNOOZED') THEN NULL
                            ELSE f.error END,
               -- Every failed attempt's error, the last ten (version 30); a snooze is none.
               errors = CASE WHEN t.cancel_requested OR f.status NOT IN ('FAILED', 'SNOOZED')
                                  OR (f.status = 'SNOOZED' AND coalesce(t.snoozes, 0) < 100) THEN t.errors
                             ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs, f.error) END,
               run_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                  AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                             THEN now() + f.retry_in * interval '1 second'
                             WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                  AND coalesce(t.snoozes, 0) < 100
                             THEN now() + coalesce(f.retry_in, 0) * interval '1 second'
                             ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                                  THEN NULL
                                  WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                       AND coalesce(t.snoozes, 0) < 100
                                  THEN NULL ELSE now() END
          FROM input AS f
         -- Looked up by primary key, the rows held as the index condition (version 11).
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           AND t.id = f.id
           -- Written so that it cannot steer the lookup to the partial index of RUNNING rows.
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = f.token
           -- Only a recorded cancel request ends a task CANCELED; an outcome is one of four
           -- (version 37: WAITING is a status, never an outcome).
           AND (f.status <> 'CANCELED' OR t.cancel_requested)
           AND f.status IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'SNOOZED')
        RETURNING t.id, t.status, t.queue
    ), freed AS (
        -- The tasks that stopped running free their slots of a running limit (version 33).
        SELECT pgtaskd.notify_freed(array_agg(done.queue)) AS sent FROM done
    ), notified AS (
        -- One row whatever `done` holds (an aggregate); volatile, so evaluated once, after
        -- every row of `done` was written. A task QUEUED again has not ended.
        SELECT pgtaskd.notify_done(array_agg(done.id)) AS sent FROM done
         WHERE done.status <> 'QUEUED'
    ), answers AS (
        SELECT f.id, d.status AS written,
               -- What a finish that wrote nothing found, as the row stands (not locked).
               CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.task_state AS c WHERE c.id = f.id) END
                   AS current,
               -- Skipped: not written, not held, and still this claim's.
               d.id IS NULL
                 AND NOT (f.id = ANY (ARRAY(SELECT held.id FROM held)))
                 AND EXISTS (SELECT 1 FROM pgtaskd.task_state AS c
                              WHERE c.id = f.id AND c.claim_token = f.token
                                AND coalesce(c.status, '') = 'RUNNING') AS skipped
          FROM input AS f
          LEFT JOIN done AS d ON d.id = f.id
         CROSS JOIN notified
         CROSS JOIN freed
    )
    SELECT array_agg(a.id ORDER BY a.id), array_agg(a.written ORDER BY a.id),
           array_agg(a.current ORDER BY a.id), array_agg(a.skipped ORDER BY a.id)
      INTO answer_ids, answer_written, answer_current, answer_skipped
      FROM answers AS a;
    -- The tasks that ended release or cancel those waiting on them, in this transaction
    -- (version 37).
    PERFORM pgtaskd.end_parents(ARRAY(
        SELECT u.id FROM unnest(answer_ids, answer_written) AS u(id, written)
         WHERE u.written IN ('SUCCEEDED', 'FAILED', 'CANCELED')));
    RETURN QUERY
    SELECT u.id, u.written, u.current, u.skipped
      FROM unnest(answer_ids, answer_written, answer_current, answer_skipped)
           AS u(id, written, current, skipped);
END
$$;
