-- pgtaskd schema, version 45: a parent's end reads its dependents' rows by key whatever the
-- statistics say (docs/dependencies.md, "Released in the parent's commit").
--
-- `pgtaskd.settle_waiting` joined the edges to the state and task rows of the parents and
-- children. With statistics taken while the tables were empty, the planner walked the task
-- table for each child: a parent with 2,000 children ended in 1.4 s, the join filter
-- passing over 8,001,000 rows, in the finish that ended it. Each of those rows is now read
-- through a lookup by its key (a LATERAL subquery with OFFSET 0, a scalar subquery), as the
-- claim's are since schema 44. The producer's triggers for a task with parents
-- (`tasks_state`, `tasks_deps_settle`) checked each parent with a scan of the state table
-- per child under the same statistics (an INSERT of 2,000 children of one parent beside
-- 3,000 other tasks: 0.2 s, and 1.1 s at its commit); they look each row up by its key too.
--
-- Locks: none but the function's replacement.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

CREATE OR REPLACE FUNCTION pgtaskd.settle_waiting(children bigint[], parents bigint[]) RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each row found by its key, whatever the statistics say: a child of 10,000 parents is
-- decided by reading the edges it needs, never all of them.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_sort = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    canceled bigint[];
    below    bigint[];
    released bigint;
    locked   bigint[] := settle_waiting.children;
BEGIN
    IF settle_waiting.parents IS NOT NULL THEN
        -- Most ends are not the last of their child's: a child with another parent QUEUED
        -- or RUNNING, held here (FOR SHARE, passing over one another transaction holds) so
        -- that it cannot end before this commit, is not released now, and that parent's end
        -- will see these edges gone. Every end of such a row locks it first (a claim, a
        -- finish batch, a rescue pass over it, and the claim is then settled alone; a cancel
        -- and a release wait). Such a child loses its edges to these parents without being
        -- locked, so that the parents of one child do not wait for one another's commits
        -- ("Released in the parent's commit"). A settle never locks a QUEUED or RUNNING
        -- row, so this hold waits for no one and makes no settle wait. The parent held is
        -- the newest, the last a claim would take.
        WITH candidates AS MATERIALIZED (
            SELECT c.id
              FROM pgtaskd.task_state AS c
             -- Every other row by its key too, through a lookup the planner cannot turn into
             -- a walk of the table (schema 45).
             CROSS JOIN LATERAL (SELECT r.on_dep_failure
                                   FROM pgtaskd.tasks AS r
                                  WHERE r.id = c.id
                                 OFFSET 0) AS t
             -- `coalesce(status, '')`: found by primary key, never by a scan of the partial
             -- index of every WAITING task.
             WHERE c.id = ANY (settle_waiting.children) AND coalesce(c.status, '') = 'WAITING'
               -- No end here cancels it.
               AND NOT (coalesce(t.on_dep_failure, 'cancel') = 'cancel' AND EXISTS (
                        SELECT 1 FROM pgtaskd.task_deps AS d
                         WHERE d.child = c.id AND d.parent = ANY (settle_waiting.parents)
                           AND (SELECT p.status FROM pgtaskd.task_state AS p
                                 WHERE p.id = d.parent) IN ('FAILED', 'CANCELED')))
        ), fast AS MATERIALIZED (
            -- Only then a parent is held: never for a child decided below anyway.
            SELECT c.id
              FROM candidates AS c
             WHERE EXISTS (SELECT 1
                             FROM (SELECT p.id
                                     -- The child's edges, newest parent first (`OFFSET 0`:
                                     -- read from the edges' key, never from the newest
                                     -- task of all backwards).
                                     FROM (SELECT d.parent
                                             FROM pgtaskd.task_deps AS d
                                            WHERE d.child = c.id
                                              AND NOT (d.parent = ANY (settle_waiting.parents))
                                            ORDER BY d.parent DESC
                                           OFFSET 0) AS x
                                    CROSS JOIN LATERAL (
                                           SELECT q.id FROM pgtaskd.task_state AS q
                                            WHERE q.id = x.parent
                                              AND coalesce(q.status, '') IN ('QUEUED', 'RUNNING')
                                              FOR SHARE SKIP LOCKED) AS p
                                    LIMIT 1) AS h)
        ), resolved AS (
            DELETE FROM pgtaskd.task_deps AS d
             WHERE d.child = ANY (ARRAY(SELECT f.id FROM fast AS f))
               AND d.parent = ANY (settle_waiting.parents)
               AND ((SELECT p.status FROM pgtaskd.task_state AS p WHERE p.id = d.parent)
                        = 'SUCCEEDED'
                    OR ((SELECT p.status FROM pgtaskd.task_state AS p WHERE p.id = d.parent)
                            IN ('FAILED', 'CANCELED')
                        AND (SELECT t.on_dep_failure FROM pgtaskd.tasks AS t
                              WHERE t.id = d.child) = 'run'))
        )
        SELECT ARRAY(SELECT x.id FROM unnest(settle_waiting.children) AS x(id)
                      WHERE NOT (x.id = ANY (ARRAY(SELECT f.id FROM fast AS f))))
          INTO locked;
        IF cardinality(locked) = 0 THEN
            RETURN '{}';
        END IF;
    END IF;
    -- The other children, locked in id order: a settle of a child waits for the one before
    -- it, and each statement below sees what that one committed. Where a parent failed, a
    -- cancel may cascade: every waiting task below these children is locked too, in the same
    -- order and the same statement, so that two cascades through one graph take their locks
    -- in one order and never deadlock.
    IF EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d
                WHERE d.child = ANY (locked)
                  AND (settle_waiting.parents IS NULL OR d.parent = ANY (settle_waiting.parents))
                  AND (SELECT p.status FROM pgtaskd.task_state AS p WHERE p.id = d.parent)
                      IN ('FAILED', 'CANCELED')) THEN
        PERFORM 1 FROM pgtaskd.task_state AS c
          WHERE c.id = ANY (ARRAY(
                    WITH RECURSIVE below (id) AS (
                        SELECT x.id FROM unnest(locked) AS x(id)
                        UNION
                        SELECT d.child FROM pgtaskd.task_deps AS d JOIN below AS b ON d.parent = b.id)
                    SELECT below.id FROM below))
            AND coalesce(c.status, '') = 'WAITING'
          ORDER BY c.id
            FOR UPDATE;
    ELSE
        PERFORM 1 FROM pgtaskd.task_state AS c
          WHERE c.id = ANY (locked) AND coalesce(c.status, '') = 'WAITING'
          ORDER BY c.id
            FOR UPDATE;
    END IF;
    WITH ended AS MATERIALIZED (
        -- Each edge of these children to a parent that has ended, with the child's policy.
        SELECT e.child, e.parent, e.outcome, coalesce(e.on_dep_failure, 'cancel') AS policy
          FROM (SELECT d.child, d.parent,
                       (SELECT p.status FROM pgtaskd.task_state AS p
                         WHERE p.id = d.parent) AS outcome,
                       (SELECT c.status FROM pgtaskd.task_state AS c
                         WHERE c.id = d.child) AS child_status,
                       t.on_dep_failure
                  FROM pgtaskd.task_deps AS d
                 CROSS JOIN LATERAL (SELECT r.on_dep_failure
                                       FROM pgtaskd.tasks AS r
                                      WHERE r.id = d.child
                                     OFFSET 0) AS t
                 WHERE d.child = ANY (locked)
                   AND (settle_waiting.parents IS NULL
                        OR d.parent = ANY (settle_waiting.parents))
                OFFSET 0) AS e
         WHERE coalesce(e.child_status, '') = 'WAITING'
           AND e.outcome IN ('SUCCEEDED', 'FAILED', 'CANCELED')
    ), resolved AS (
        DELETE FROM pgtaskd.task_deps AS d
         USING ended AS e
         WHERE d.child = e.child AND d.parent = e.parent
           AND (e.outcome = 'SUCCEEDED' OR e.policy = 'run')
    ), failing AS (
        -- The first parent that failed, named in the error.
        SELECT DISTINCT ON (e.child) e.child, e.parent, e.outcome
          FROM ended AS e
         WHERE e.outcome <> 'SUCCEEDED' AND e.policy = 'cancel'
         ORDER BY e.child, e.parent
    ), canceled_now AS (
        UPDATE pgtaskd.task_state AS s
           SET status = 'CANCELED',
               cancel_requested = true,
               canceled_by = f.parent,
               error = format('parent task %s %s', f.parent, lower(f.outcome)),
               finished_at = now()
          FROM failing AS f
         -- The failing children by their keys: the join alone could walk the whole table.
         WHERE s.id = ANY (ARRAY(SELECT g.child FROM failing AS g))
           AND s.id = f.child AND coalesce(s.status, '') = 'WAITING'
        RETURNING s.id
    )
    SELECT array_agg(n.id ORDER BY n.id) INTO canceled FROM canceled_now AS n;
    IF canceled IS NOT NULL THEN
        -- A canceled task waits for nothing any more; its own dependents are decided next,
        -- in this transaction (a cascade).
        DELETE FROM pgtaskd.task_deps AS d WHERE d.child = ANY (canceled);
        PERFORM pgtaskd.notify_done(canceled);
        SELECT array_agg(DISTINCT d.child) INTO below
          FROM pgtaskd.task_deps AS d
         WHERE d.parent = ANY (canceled);
        IF below IS NOT NULL THEN
            canceled := canceled || pgtaskd.settle_waiting(below, canceled);
        END IF;
    END IF;
    -- The children no edge holds: QUEUED, due from now at the earliest.
    WITH queued AS (
        UPDATE pgtaskd.task_state AS s
           SET status = 'QUEUED', run_at = greatest(s.run_at, now())
         WHERE s.id = ANY (locked) AND coalesce(s.status, '') = 'WAITING'
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.child = s.id)
        RETURNING s.id
    )
    SELECT count(*) INTO released FROM queued;
    IF released > 0 THEN
        PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    END IF;
    -- Every task canceled here and below, for the caller's batches (version 39).
    RETURN coalesce(canceled, '{}');
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.tasks_state() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each parent and child row by its key, whatever the statistics say (schema 45).
SET enable_seqscan = off
AS $$
DECLARE
    missing bigint;
BEGIN
    INSERT INTO pgtaskd.task_state (id, queue, priority, run_at, max_attempts, concurrency_key,
                                    status, batch_id)
    SELECT n.id, n.queue, n.priority, n.run_at, n.max_attempts, n.concurrency_key,
           CASE WHEN cardinality(n.depends_on) > 0 THEN 'WAITING' ELSE 'QUEUED' END,
           n.batch_id
      FROM new_tasks AS n
    -- A state row loaded before its task row (a data-only restore of both tables) is kept.
        ON CONFLICT (id) DO NOTHING;
    IF EXISTS (SELECT 1 FROM new_tasks AS n WHERE cardinality(n.depends_on) > 0) THEN
        SELECT x.parent INTO missing
          FROM new_tasks AS n
         CROSS JOIN LATERAL unnest(n.depends_on) AS x(parent)
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = x.parent OFFSET 0)
         LIMIT 1;
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'task depends on task %, which does not exist', missing
                USING ERRCODE = '23503';
        END IF;
        -- The edges of the tasks that wait (not those of a restored task that ended).
        INSERT INTO pgtaskd.task_deps (child, parent)
        SELECT DISTINCT n.id, x.parent
          FROM new_tasks AS n
         CROSS JOIN LATERAL unnest(n.depends_on) AS x(parent)
         WHERE EXISTS (SELECT 1 FROM pgtaskd.task_state AS s
                        WHERE s.id = n.id AND s.status = 'WAITING' OFFSET 0)
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.tasks_deps_settle() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each parent row by its key, whatever the statistics say (schema 45).
SET enable_seqscan = off
AS $$
DECLARE
    missing bigint;
BEGIN
    PERFORM 1 FROM pgtaskd.task_state AS p
      WHERE p.id = ANY (ARRAY(SELECT d.parent FROM pgtaskd.task_deps AS d
                               WHERE d.child = NEW.id))
      ORDER BY p.id
        FOR SHARE;
    SELECT d.parent INTO missing
      FROM pgtaskd.task_deps AS d
     WHERE d.child = NEW.id
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = d.parent OFFSET 0)
     LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'task depends on task %, which does not exist', missing
            USING ERRCODE = '23503';
    END IF;
    PERFORM pgtaskd.end_batches(pgtaskd.settle_waiting(ARRAY[NEW.id], NULL));
    RETURN NULL;
END
$$;
