-- Lists over 1,000,000 finished tasks in the proposed layout (docs/storage.md, "What this
-- does not yet show", lists): the question is whether the dashboard's and `GET /tasks`'s
-- pages stay within what today's list indexes give (10-42 ms a page in `ui::million`) once
-- finished tasks are elements of outcome rows. Loads 1,000,000 tasks of 100 bytes in four
-- queues, ended SUCCEEDED in outcome rows of 50 (a finish's batch), then a later FAILED
-- outcome for 1% of them (a retry that failed; ids 7 modulo 100, all in queue q3), and times
-- six pages of 50, each twice (the second run is the figure). Run after schema.sql in a throwaway database:
--
--   psql -X -d DB -f docs/storage-prototype/schema.sql
--   psql -X -d DB -f docs/storage-prototype/lists_million.sql
--
-- JIT is off, as in the daemon's functions: the view's estimated cost passes
-- `jit_above_cost`, and compiling it took 150-330 ms a query on this machine, which would be
-- the whole of each figure.
\set ON_ERROR_STOP on
SET client_min_messages = warning;
SET jit = off;

INSERT INTO proposed.tasks (queue, payload)
SELECT 'q' || (g % 4), repeat('x', 100) FROM generate_series(1, 1000000) AS g;
TRUNCATE proposed.ready;
INSERT INTO proposed.outcomes (span, ids, tokens, statuses, attempts, words, bytes, runes,
                               errors, outputs, started_at)
SELECT int8range(min(id), max(id), '[]'), array_agg(id ORDER BY id),
       array_agg(id * 1024 ORDER BY id), array_agg('SUCCEEDED'::text ORDER BY id),
       array_agg(1 ORDER BY id), array_agg(17::bigint ORDER BY id),
       array_agg(100::bigint ORDER BY id), array_agg(100::bigint ORDER BY id),
       array_agg(NULL::text ORDER BY id), array_agg(NULL::text ORDER BY id),
       array_agg(now() ORDER BY id)
  FROM proposed.tasks GROUP BY (id - 1) / 50;
-- 1% failed in a later attempt: tokens above every earlier one.
INSERT INTO proposed.outcomes (span, ids, tokens, statuses, attempts, words, bytes, runes,
                               errors, outputs, started_at)
SELECT int8range(min(id), max(id), '[]'), array_agg(id ORDER BY id),
       array_agg((2000000 + f.n) * 1024 ORDER BY id), array_agg('FAILED'::text ORDER BY id),
       array_agg(2 ORDER BY id), array_agg(0::bigint ORDER BY id),
       array_agg(0::bigint ORDER BY id), array_agg(0::bigint ORDER BY id),
       array_agg('exit 1'::text ORDER BY id), array_agg(NULL::text ORDER BY id),
       array_agg(now() ORDER BY id)
  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM proposed.tasks WHERE id % 100 = 7) AS f
 GROUP BY f.n / 50;
CREATE INDEX outcomes_failed_idx ON proposed.outcomes (upper(span) DESC)
    WHERE 'FAILED' = ANY (statuses);
VACUUM ANALYZE proposed.tasks;
VACUUM ANALYZE proposed.outcomes;
VACUUM ANALYZE proposed.ready;
VACUUM ANALYZE proposed.claims;

-- The walk of lists.sql, with a queue filter: the newest `n` tasks of queue `in_queue` (null:
-- any) whose status is `want`, below id `below`.
CREATE OR REPLACE FUNCTION proposed.list_status(want text, below bigint, n int, in_queue text)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    r record;
    found bigint[] := '{}';
BEGIN
    FOR r IN SELECT x.span, x.ids, x.statuses FROM proposed.outcomes AS x
              WHERE want = ANY (x.statuses) AND lower(x.span) < below
              ORDER BY upper(x.span) DESC LOOP
        EXIT WHEN cardinality(found) >= n AND upper(r.span) <= found[n];
        found := ARRAY(
            SELECT c.id FROM (
                SELECT unnest(found) AS id
                UNION
                SELECT u.id FROM unnest(r.ids, r.statuses) AS u(id, status)
                 WHERE u.status = want AND u.id < below
                   AND (SELECT v.status FROM proposed.task_view AS v
                         WHERE v.id = u.id AND v.queue = coalesce(in_queue, v.queue)) = want
            ) AS c ORDER BY c.id DESC LIMIT n);
    END LOOP;
    RETURN QUERY SELECT unnest(found);
END
$$;

\timing on
\echo -- the newest 50 FAILED, by the walk over outcomes_failed_idx
SELECT count(*) FROM proposed.list_status('FAILED', 9223372036854775807, 50, NULL);
SELECT count(*) FROM proposed.list_status('FAILED', 9223372036854775807, 50, NULL);
\echo -- the newest 50 FAILED of queue q3, by the walk
SELECT count(*) FROM proposed.list_status('FAILED', 9223372036854775807, 50, 'q3');
SELECT count(*) FROM proposed.list_status('FAILED', 9223372036854775807, 50, 'q3');
\echo -- the newest 50 FAILED of queue q1, which has none: the walk visits every FAILED row
SELECT count(*) FROM proposed.list_status('FAILED', 9223372036854775807, 50, 'q1');
SELECT count(*) FROM proposed.list_status('FAILED', 9223372036854775807, 50, 'q1');
\echo -- a page of 50 FAILED below id 5,000, by the walk
SELECT count(*) FROM proposed.list_status('FAILED', 5000, 50, NULL);
SELECT count(*) FROM proposed.list_status('FAILED', 5000, 50, NULL);
\echo -- the newest 50 SUCCEEDED through the view (tasks_pkey backwards)
SELECT count(*) FROM (SELECT * FROM proposed.task_view WHERE status = 'SUCCEEDED'
                       ORDER BY id DESC LIMIT 50) AS s;
SELECT count(*) FROM (SELECT * FROM proposed.task_view WHERE status = 'SUCCEEDED'
                       ORDER BY id DESC LIMIT 50) AS s;
\echo -- the newest 50 SUCCEEDED of queue q1 below id 500,000, through the view
SELECT count(*) FROM (SELECT * FROM proposed.task_view WHERE queue = 'q1' AND status = 'SUCCEEDED'
                         AND id < 500000 ORDER BY id DESC LIMIT 50) AS s;
SELECT count(*) FROM (SELECT * FROM proposed.task_view WHERE queue = 'q1' AND status = 'SUCCEEDED'
                         AND id < 500000 ORDER BY id DESC LIMIT 50) AS s;
\timing off
\echo -- the walk answers what the view answers (the view visiting every task: seconds)
SELECT (SELECT array_agg(x ORDER BY x DESC)
          FROM proposed.list_status('FAILED', 9223372036854775807, 50, 'q3') AS x)
     = (SELECT array_agg(id ORDER BY id DESC)
          FROM (SELECT id FROM proposed.task_view WHERE queue = 'q3' AND status = 'FAILED'
                   AND id > 900000 ORDER BY id DESC LIMIT 50) AS v) AS same_as_the_view;
