-- pgtaskd schema, version 11: the finish and the cancel find their rows by primary key,
-- whatever the statistics said when they were planned.
--
-- A PL/pgSQL function plans its statements once per session and keeps the plans until the
-- table's statistics or definition change. A daemon that starts while the table is empty, or
-- right after a vacuum of an emptied queue (its statistics then say "no rows" however the
-- table grows, until the next vacuum or analyze), plans them for a table of nothing:
--
-- - version 5's finish joined its input to the table, and for a table of one row the cheapest
--   join was a hash join reading the table through a full scan of the primary key, filtered:
--   every finish then read every row of the table (measured: a steady stream after a drain of
--   the emptied table fell from 8,000 to under 2,000 tasks/s until autovacuum's first analyze
--   replanned it). The rows are now picked by `id = ANY (ids)`, an index condition on the
--   primary key that bounds the scan to the batch whatever the estimates; the join to the
--   input that gives each row its values is a hash join (nested loops are disabled: with the
--   input rescanned per row, a batch of 512 would cost 512 x 512 comparisons);
-- - version 5's cancel tested `status = 'QUEUED'` and `status = 'RUNNING'` beside the id:
--   for a table of one row, a scan of the whole partial index of QUEUED (or RUNNING) rows,
--   filtered by id, cost as little as the primary-key lookup, and was chosen; with a backlog
--   of a million rows every cancel read all of them. The status tests are now written so
--   that no partial index matches them (as the claim's re-check has been since version 4).
--
-- Behaviour, guards, results and notifications are version 5's.

CREATE OR REPLACE FUNCTION pgtaskd.finish(
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
SET enable_nestloop = off
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
         -- The rows are looked up by primary key, the batch's ids as the index condition:
         -- however small the planner thought the table, the scan reads the batch only.
         WHERE t.id = ANY (finish.ids)
           AND t.id = f.id
           -- Written so that it cannot steer the lookup to the partial index of RUNNING rows.
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.attempt = f.attempt
           AND t.lease_owner = finish.owner
           -- Only a recorded cancel request ends a task CANCELED.
           AND (f.status <> 'CANCELED' OR t.cancel_requested)
        RETURNING t.id, t.status
    ), notified AS (
        -- One row whatever `done` holds (an aggregate); volatile, so evaluated once, after
        -- every row of `done` was written.
        SELECT pgtaskd.notify_done(array_agg(done.id)) AS sent FROM done
    )
    SELECT f.id, d.status,
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.tasks AS c WHERE c.id = f.id) END
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id
     CROSS JOIN notified;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- `coalesce(status, '')`: found by primary key, never by a scan of a partial index.
    UPDATE pgtaskd.tasks SET status = 'CANCELED', cancel_requested = true, finished_at = now()
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
