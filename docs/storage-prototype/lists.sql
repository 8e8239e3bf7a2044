-- Lists by a rare status in the proposed layout (docs/storage.md, "What this does not yet
-- show", lists): after a drain (bench.sql), 1% of the tasks get a later FAILED outcome (as
-- a retry that failed would append), in rows of 100 like a finish's; then the newest 50
-- FAILED are listed three ways: through the view (no index: every task visited), and by the
-- walk over the index of the outcome rows that hold a FAILED (proposed.list_status), first
-- page and a page deep down; today's layout, the same tasks FAILED, answers from its list
-- index. Run by run.sh after the drains; psql variables: none.
\set ON_ERROR_STOP on
SET client_min_messages = warning;

-- 1% of the drained tasks failed in a later attempt (a token above every earlier one).
INSERT INTO proposed.outcomes (span, ids, tokens, statuses, attempts, words, bytes, runes,
                               errors, outputs, started_at)
SELECT int8range(min(id), max(id), '[]'), array_agg(id ORDER BY id),
       array_agg((nextval('proposed.claims_seq') * 1024) ORDER BY id),
       array_agg('FAILED'::text ORDER BY id), array_agg(2 ORDER BY id), array_agg(0::bigint ORDER BY id),
       array_agg(0::bigint ORDER BY id), array_agg(0::bigint ORDER BY id),
       array_agg('exit 1'::text ORDER BY id), array_agg(NULL::text ORDER BY id),
       array_agg(now() ORDER BY id)
  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM proposed.tasks WHERE id % 100 = 7) AS f
 GROUP BY f.n / 100;
UPDATE today.tasks SET status = 'FAILED', words = 0, bytes = 0, runes = 0, error = 'exit 1'
 WHERE id % 100 = 7;
CREATE INDEX IF NOT EXISTS tasks_list_status_idx ON today.tasks (status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

-- The index of the outcome rows that hold a FAILED, newest ids first.
CREATE INDEX outcomes_failed_idx ON proposed.outcomes (upper(span) DESC)
    WHERE 'FAILED' = ANY (statuses);
VACUUM ANALYZE proposed.outcomes;
VACUUM ANALYZE today.tasks;

-- The newest `n` tasks whose status is `want` below id `below`: walk the outcome rows that
-- hold `want` by the top of their span, newest first; take their ids of that status below the
-- cursor, each checked to be its task's status now (its latest outcome, not QUEUED or RUNNING
-- again); stop once `n` are found and the next row's span tops out under the n-th (no later
-- row can hold a larger id).
CREATE OR REPLACE FUNCTION proposed.list_status(want text, below bigint, n int)
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
                   AND (SELECT v.status FROM proposed.task_view AS v WHERE v.id = u.id) = want
            ) AS c ORDER BY c.id DESC LIMIT n);
    END LOOP;
    RETURN QUERY SELECT unnest(found);
END
$$;

\echo -- the newest 50 FAILED: through the view (every task visited)
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON)
SELECT id FROM proposed.task_view WHERE status = 'FAILED' ORDER BY id DESC LIMIT 50;
\echo -- the same, by the walk over outcomes_failed_idx: the first page, and one below id 5,000
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON)
SELECT * FROM proposed.list_status('FAILED', 9223372036854775807, 50);
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON)
SELECT * FROM proposed.list_status('FAILED', 5000, 50);
\echo -- both walks answer what the view answers
SELECT (SELECT array_agg(x ORDER BY x DESC) FROM proposed.list_status('FAILED', 9223372036854775807, 50) AS x)
     = (SELECT array_agg(id ORDER BY id DESC) FROM (SELECT id FROM proposed.task_view
         WHERE status = 'FAILED' ORDER BY id DESC LIMIT 50) AS v) AS first_page_same,
       (SELECT array_agg(x ORDER BY x DESC) FROM proposed.list_status('FAILED', 5000, 50) AS x)
     = (SELECT array_agg(id ORDER BY id DESC) FROM (SELECT id FROM proposed.task_view
         WHERE status = 'FAILED' AND id < 5000 ORDER BY id DESC LIMIT 50) AS v) AS deep_page_same;
\echo -- the same in the layout of today, from its list index
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON)
SELECT id FROM today.tasks WHERE status = 'FAILED' ORDER BY id DESC LIMIT 50;
