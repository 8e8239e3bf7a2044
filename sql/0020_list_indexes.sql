-- pgtaskd schema, version 20: `GET /tasks` (and `pgtaskd list`) filtered by a queue or a
-- status that few rows have stays fast on a table of millions of finished rows.
--
-- The list reads newest first (`ORDER BY id DESC LIMIT n`, a page below the last id shown).
-- Without a filter, or with one most rows pass, the primary key read backwards finds a page
-- at once; a filter few rows pass made that read walk past every other row: 131 ms for a
-- queue of 10 rows among 1,000,000 finished ones, 338 ms for a queue and status with none,
-- and as much for a status no row has (the dashboard asks for FAILED tasks every few
-- seconds). Now a page takes 0.1-0.7 ms, first or deep (docs/http.md, "Listing tasks"):
--
-- - `tasks_list_queue_idx` (queue, status, id) and `tasks_list_status_idx` (status, id) give a
--   queue and a status, or a status, their own range in id order. Both hold finished rows
--   only: QUEUED and RUNNING rows have their partial indexes already, and a row enters these
--   once, when it finishes. The claim, the finish and the cancel never name a finished status
--   (see version 4), so they cannot be planned on these. With a full (queue, status, id)
--   index, 3 of 6 runs of `pgtaskd bench --mode ceiling` (20,000 tasks) scanned it about
--   24,000 times and fell from 4,300-5,100 to 580-930 tasks/s, the server's CPU per task 25
--   times over: a statement of the claim-and-finish loop, planned once per session while the
--   table's statistics said it was empty, had been planned on it;
-- - a queue alone is listed as one branch per status (src/queue/list.rs);
-- - `tasks_queue_status`, statistics of queue and status together: a status common in the
--   table and absent from a queue (the failures all in one queue) was estimated as if spread
--   evenly, and its branch read through the status index past every row of that status
--   (36-70 ms a page); the pair's most common values put it right.
--
-- Building them takes the table's SHARE lock, which holds inserts, claims and finishes for
-- the build (7 s for both on a million rows, measured on a 2-core machine shared with other
-- work). To build them without that pause, create them before migrating, with these same
-- definitions and CONCURRENTLY:
--   CREATE INDEX CONCURRENTLY tasks_list_queue_idx ON pgtaskd.tasks (queue, status, id)
--       WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');
--   CREATE INDEX CONCURRENTLY tasks_list_status_idx ON pgtaskd.tasks (status, id)
--       WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');
-- and this migration keeps them. A build CONCURRENTLY that failed leaves an invalid index of
-- that name, which the migration refuses (nothing changed) rather than keep: drop it and
-- migrate again. The lock is waited for at most 10 s (less when the session's `lock_timeout`
-- is shorter), as schema 14's.

DO $$
DECLARE
    invalid text;
BEGIN
    SELECT pg_catalog.string_agg(c.relname::text, ', ') INTO invalid
      FROM pg_catalog.pg_index AS i
      JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid
      JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
     WHERE n.nspname OPERATOR(pg_catalog.=) 'pgtaskd'
       AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['tasks_list_queue_idx', 'tasks_list_status_idx'])
       AND NOT i.indisvalid;
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'pgtaskd schema 20: the index % is invalid (a CREATE INDEX CONCURRENTLY '
                        'that failed)', invalid
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'DROP INDEX CONCURRENTLY pgtaskd.<name>, then run pgtaskd migrate '
                         'again (or build it CONCURRENTLY again first); nothing was changed';
    END IF;
END
$$;

DO $$
DECLARE
    waits interval := pg_catalog.current_setting('lock_timeout')::interval;
BEGIN
    PERFORM pg_catalog.set_config('pgtaskd.lock_timeout_before_20',
                                  pg_catalog.current_setting('lock_timeout'), true);
    IF waits OPERATOR(pg_catalog.=) interval '0'
       OR waits OPERATOR(pg_catalog.>) interval '10 seconds' THEN
        PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS tasks_list_queue_idx ON pgtaskd.tasks (queue, status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

CREATE INDEX IF NOT EXISTS tasks_list_status_idx ON pgtaskd.tasks (status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

CREATE STATISTICS pgtaskd.tasks_queue_status (mcv) ON queue, status FROM pgtaskd.tasks;

SELECT pg_catalog.set_config('lock_timeout',
                             pg_catalog.current_setting('pgtaskd.lock_timeout_before_20'), true);
