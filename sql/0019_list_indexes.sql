-- pgtaskd schema, version 19: `GET /tasks` (and `pgtaskd list`) filtered by a queue or a
-- status that few rows have stays fast on a table of millions of finished rows.
--
-- The list reads newest first (`ORDER BY id DESC LIMIT n`, a page below the last id shown).
-- Without a filter, or with one most rows pass, the primary key read backwards finds a page
-- at once; a filter few rows pass made that read walk past every other row: 131 ms for a
-- queue of 10 rows among 1,000,000 finished ones, 338 ms for a queue and status with none,
-- and as much for a status no row has (the dashboard asks for FAILED tasks every few
-- seconds). Two indexes give those filters their own ordered range (0.1-0.4 ms a page,
-- first or deep; docs/http.md, "Listing tasks"):
--
-- - `tasks_list_queue_idx` (queue, status, id): a queue and a status read in id order; a
--   queue alone, when it holds few rows, read whole and sorted;
-- - `tasks_list_status_idx` (status, id) on finished rows only: a status alone. QUEUED and
--   RUNNING rows are few and have their partial indexes already, and a row is added to this
--   one only once, when it finishes.
--
-- Building them takes the table's SHARE lock, which holds inserts, claims and finishes for
-- the build (7 s for both on a million rows, measured on a 2-core machine shared with other
-- work). To build them without that pause, create them before migrating, with these same
-- definitions and CONCURRENTLY:
--   CREATE INDEX CONCURRENTLY tasks_list_queue_idx ON pgtaskd.tasks (queue, status, id);
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
        RAISE EXCEPTION 'pgtaskd schema 19: the index % is invalid (a CREATE INDEX CONCURRENTLY '
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
    PERFORM pg_catalog.set_config('pgtaskd.lock_timeout_before_19',
                                  pg_catalog.current_setting('lock_timeout'), true);
    IF waits OPERATOR(pg_catalog.=) interval '0'
       OR waits OPERATOR(pg_catalog.>) interval '10 seconds' THEN
        PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS tasks_list_queue_idx ON pgtaskd.tasks (queue, status, id);

CREATE INDEX IF NOT EXISTS tasks_list_status_idx ON pgtaskd.tasks (status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

SELECT pg_catalog.set_config('lock_timeout',
                             pg_catalog.current_setting('pgtaskd.lock_timeout_before_19'), true);
