-- pgtaskd schema, version 37: tasks that wait for other tasks (docs/dependencies.md).
--
-- A producer names a task's parents in the same INSERT, `depends_on bigint[]`, and what a
-- parent's failure does to it, `on_dep_failure` ('cancel' when unset, 'run', 'wait'). A task
-- with a parent that has not ended is WAITING and never claimed; it becomes QUEUED in the
-- transaction that commits the end of its last parent (the finish, the rescue's last failure,
-- a cancel, a parked result's write): every function that ends a task calls
-- `pgtaskd.end_parents`, which locks each waiting child (never another parent) and decides it
-- from the edges left in `pgtaskd.task_deps`. No periodic pass releases anything.
--
-- A parent's id is smaller than its child's (a CHECK), so no cycle can be written; an unknown
-- parent is refused naming it; `depends_on` never changes; a parent a task still waits on
-- cannot be deleted, and retention passes it over. `pgtaskd.enqueue_graph` inserts a graph
-- named by local refs and refuses a cycle; `pgtaskd.retry_with_dependents` brings back the
-- tasks a parent's failure canceled; `pgtaskd.check_deps` audits the edges.
--
-- The claim answers each task's parents and their outcomes (two more columns): daemons of
-- schema 36 read the columns they know and go on, but tell their handlers nothing of
-- parents, and show WAITING tasks as an unknown status: upgrade them with the schema.
-- Locks: `ACCESS EXCLUSIVE` on `pgtaskd.tasks` and `pgtaskd.task_state` for the new columns
-- and the status check, which reads every state row once (about a second per million).

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

ALTER TABLE pgtaskd.tasks
    ADD COLUMN depends_on bigint[],
    ADD COLUMN on_dep_failure text;
-- A task waits only for tasks inserted before it (a smaller id), so no cycle can be written;
-- at most 10,000 parents, none null; the three failure policies. NOT VALID as schema 37
-- added them (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_depends_on_earlier
        CHECK (id OPERATOR(pg_catalog.>) ALL (depends_on)
               AND pg_catalog.cardinality(depends_on) OPERATOR(pg_catalog.<=) 10000
               AND pg_catalog.array_position(depends_on, NULL) IS NULL) NOT VALID,
    ADD CONSTRAINT tasks_on_dep_failure
        CHECK (on_dep_failure OPERATOR(pg_catalog.=) ANY (ARRAY['cancel', 'run', 'wait'])) NOT VALID;

COMMENT ON COLUMN pgtaskd.tasks.depends_on IS
    'The ids of the tasks this one waits for (each smaller than its own): it is WAITING until they end; never changed after the insert.';
COMMENT ON COLUMN pgtaskd.tasks.on_dep_failure IS
    'What a parent that ends FAILED or CANCELED does to this task: cancel (unset), run, or wait for a retry that succeeds.';

-- The state: WAITING, and the parent whose failure canceled a task.
ALTER TABLE pgtaskd.task_state
    ADD COLUMN canceled_by bigint,
    DROP CONSTRAINT tasks_status_check,
    DROP CONSTRAINT tasks_error_when_failed;
ALTER TABLE pgtaskd.task_state
    ADD CONSTRAINT tasks_status_check
        CHECK (status IN ('WAITING', 'QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELED'));
-- An error on every FAILED row, none on SUCCEEDED or CANCELED rows (but those a parent's
-- failure canceled, which name it: schema 37), the last failed attempt's (or none) on QUEUED
-- and RUNNING rows; an output on SUCCEEDED rows only. NOT VALID as schema 19 added them to
-- the task rows, whose state schema 36 moved here, and schema 37 changed the first.
ALTER TABLE pgtaskd.task_state
    ADD CONSTRAINT tasks_error_when_failed
        CHECK ((status OPERATOR(pg_catalog.<>) 'FAILED' OR error IS NOT NULL)
               AND (error IS NULL OR status OPERATOR(pg_catalog.=) ANY (ARRAY['FAILED', 'QUEUED', 'RUNNING'])
                    OR (status OPERATOR(pg_catalog.=) 'CANCELED' AND canceled_by IS NOT NULL)))
        NOT VALID;

-- The edges a WAITING task still waits on, one row per (child, parent) (schema 37,
-- docs/dependencies.md): written by the producer's own statement, deleted in the transaction
-- that commits the parent's end (`pgtaskd.settle_waiting`). A row stays for a parent that
-- failed only where the child waits for a retry of it (`on_dep_failure` 'wait').
CREATE TABLE pgtaskd.task_deps (
    child  bigint NOT NULL,
    parent bigint NOT NULL,
    PRIMARY KEY (child, parent)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
-- A parent's end finds its children.
CREATE INDEX task_deps_parent_idx ON pgtaskd.task_deps (parent);
COMMENT ON TABLE pgtaskd.task_deps IS
    'pgtaskd: what each WAITING task still waits for; written and deleted by pgtaskd''s triggers and functions only';

-- The view, with each task's parents and policy at the end.
CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT s.id, s.queue, t.payload, s.status, s.priority, s.run_at, s.attempt,
       coalesce(s.max_attempts, pgtaskd.queue_max_attempts(s.queue)) AS max_attempts,
       s.cancel_requested, s.words, s.bytes, s.runes, s.error, s.lease_owner,
       s.lease_expires_at, t.created_at, s.started_at, s.finished_at, t.idempotency_key,
       s.claim_token, s.output, t.traceparent,
       coalesce((SELECT x.id FROM pgtaskd.site AS x), 'nosite') || '-' || s.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       s.runs, s.errors, s.snoozes, s.concurrency_key, t.depends_on, t.on_dep_failure
  FROM pgtaskd.task_state AS s
 CROSS JOIN LATERAL (SELECT x.payload, x.created_at, x.idempotency_key, x.traceparent,
                            x.depends_on, x.on_dep_failure
                       FROM pgtaskd.tasks AS x
                      WHERE x.id = s.id
                     OFFSET 0) AS t;

-- The tasks waiting on parents, for the list and the auditor (schema 37), and those a
-- parent's failure canceled, for `retry --with-dependents`.
CREATE INDEX tasks_waiting_idx ON pgtaskd.task_state (id) WHERE status = 'WAITING';
CREATE INDEX tasks_canceled_by_idx ON pgtaskd.task_state (canceled_by)
    WHERE canceled_by IS NOT NULL;

-- Decide what the ends of parents `parents` (null: of every parent that has ended) make of
-- the WAITING tasks `children`, in the transaction that commits those ends: an edge to a
-- parent that SUCCEEDED is gone; one to a parent that FAILED or was CANCELED is gone under
-- `on_dep_failure` 'run', stays under 'wait' (until a retry of the parent ends it), and under
-- 'cancel' (unset) cancels the child, naming the parent, and then its own dependents, all in
-- this transaction. A child no edge holds any more is QUEUED and a daemon is woken. No
-- periodic pass releases anything ("Released in the parent's commit").
CREATE FUNCTION pgtaskd.settle_waiting(children bigint[], parents bigint[]) RETURNS void
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
              JOIN pgtaskd.tasks AS t ON t.id = c.id
             -- `coalesce(status, '')`: found by primary key, never by a scan of the partial
             -- index of every WAITING task.
             WHERE c.id = ANY (settle_waiting.children) AND coalesce(c.status, '') = 'WAITING'
               -- No end here cancels it.
               AND NOT (coalesce(t.on_dep_failure, 'cancel') = 'cancel' AND EXISTS (
                        SELECT 1 FROM pgtaskd.task_deps AS d
                          JOIN pgtaskd.task_state AS p ON p.id = d.parent
                         WHERE d.child = c.id AND d.parent = ANY (settle_waiting.parents)
                           AND p.status IN ('FAILED', 'CANCELED')))
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
                                     JOIN pgtaskd.task_state AS p ON p.id = x.parent
                                    WHERE coalesce(p.status, '') IN ('QUEUED', 'RUNNING')
                                    LIMIT 1
                                      FOR SHARE OF p SKIP LOCKED) AS h)
        ), resolved AS (
            DELETE FROM pgtaskd.task_deps AS d
             USING pgtaskd.task_state AS p, pgtaskd.tasks AS t
             WHERE d.child = ANY (ARRAY(SELECT f.id FROM fast AS f))
               AND d.parent = ANY (settle_waiting.parents)
               AND p.id = d.parent AND t.id = d.child
               AND (p.status = 'SUCCEEDED'
                    OR (p.status IN ('FAILED', 'CANCELED') AND t.on_dep_failure = 'run'))
        )
        SELECT ARRAY(SELECT x.id FROM unnest(settle_waiting.children) AS x(id)
                      WHERE NOT (x.id = ANY (ARRAY(SELECT f.id FROM fast AS f))))
          INTO locked;
        IF cardinality(locked) = 0 THEN
            RETURN;
        END IF;
    END IF;
    -- The other children, locked in id order: a settle of a child waits for the one before
    -- it, and each statement below sees what that one committed. Where a parent failed, a
    -- cancel may cascade: every waiting task below these children is locked too, in the same
    -- order and the same statement, so that two cascades through one graph take their locks
    -- in one order and never deadlock.
    IF EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d
                 JOIN pgtaskd.task_state AS p ON p.id = d.parent
                WHERE d.child = ANY (locked)
                  AND (settle_waiting.parents IS NULL OR d.parent = ANY (settle_waiting.parents))
                  AND p.status IN ('FAILED', 'CANCELED')) THEN
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
        SELECT d.child, d.parent, p.status AS outcome,
               coalesce(t.on_dep_failure, 'cancel') AS policy
          FROM pgtaskd.task_deps AS d
          JOIN pgtaskd.task_state AS c ON c.id = d.child
          JOIN pgtaskd.task_state AS p ON p.id = d.parent
          JOIN pgtaskd.tasks AS t ON t.id = d.child
         WHERE d.child = ANY (locked)
           AND (settle_waiting.parents IS NULL OR d.parent = ANY (settle_waiting.parents))
           AND coalesce(c.status, '') = 'WAITING'
           AND p.status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
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
         WHERE s.id = f.child AND coalesce(s.status, '') = 'WAITING'
        RETURNING s.id
    )
    SELECT array_agg(n.id ORDER BY n.id) INTO canceled FROM canceled_now AS n;
    IF canceled IS NOT NULL THEN
        -- A canceled task waits for nothing any more; its own dependents are decided next,
        -- in this transaction (a cascade).
        DELETE FROM pgtaskd.task_deps AS d WHERE d.child = ANY (canceled);
        PERFORM pgtaskd.notify_done(canceled);
        PERFORM pgtaskd.end_parents(canceled);
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
END
$$;

-- The tasks `ended` ended in this transaction: decide for each task waiting on one of them
-- (`pgtaskd.settle_waiting`). Called by every function that ends a task, after its write: the
-- finish (and so the parked results' write), the rescue, a cancel and a release.
CREATE FUNCTION pgtaskd.end_parents(ended bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    children bigint[];
BEGIN
    IF end_parents.ended IS NULL OR cardinality(end_parents.ended) = 0 THEN
        RETURN;
    END IF;
    -- Each statement here must see what committed before it: a snapshot held from the
    -- transaction's start would miss a task inserted since with these as parents, or a parent's
    -- end, and leave a task waiting for ever.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a task ends only in a READ COMMITTED transaction (this one is %): the tasks waiting on it are decided from what has committed',
            pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = '0A000',
                  HINT = 'Cancel it in a transaction of its own, or SET TRANSACTION ISOLATION LEVEL READ COMMITTED first.';
    END IF;
    SELECT array_agg(DISTINCT d.child) INTO children
      FROM pgtaskd.task_deps AS d
     WHERE d.parent = ANY (end_parents.ended);
    IF children IS NOT NULL THEN
        PERFORM pgtaskd.settle_waiting(children, end_parents.ended);
    END IF;
END
$$;

-- Tasks `ids` just put back to QUEUED by a retry: those with parents wait again for each
-- parent that has not SUCCEEDED (WAITING), and are then decided as at their insert. The
-- parents are held first (FOR SHARE, in id order), so that a parent ending meanwhile either
-- has ended before (and reads so) or waits for this commit and then finds the edges.
CREATE FUNCTION pgtaskd.wait_again(ids bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    waiting bigint[];
BEGIN
    IF wait_again.ids IS NULL OR cardinality(wait_again.ids) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM pgtaskd.task_state AS p
      WHERE p.id = ANY (ARRAY(SELECT DISTINCT x.parent
                                FROM pgtaskd.tasks AS t
                               CROSS JOIN LATERAL unnest(t.depends_on) AS x(parent)
                               WHERE t.id = ANY (wait_again.ids)))
      ORDER BY p.id
        FOR SHARE;
    INSERT INTO pgtaskd.task_deps (child, parent)
    SELECT DISTINCT t.id, x.parent
      FROM pgtaskd.tasks AS t
     CROSS JOIN LATERAL unnest(t.depends_on) AS x(parent)
      JOIN pgtaskd.task_state AS s ON s.id = t.id AND coalesce(s.status, '') = 'QUEUED'
      JOIN pgtaskd.task_state AS p ON p.id = x.parent AND p.status <> 'SUCCEEDED'
     WHERE t.id = ANY (wait_again.ids)
        ON CONFLICT DO NOTHING;
    WITH waits AS (
        UPDATE pgtaskd.task_state AS s
           SET status = 'WAITING'
         WHERE s.id = ANY (wait_again.ids) AND coalesce(s.status, '') = 'QUEUED'
           AND EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.child = s.id)
        RETURNING s.id
    )
    SELECT array_agg(w.id ORDER BY w.id) INTO waiting FROM waits AS w;
    IF waiting IS NOT NULL THEN
        PERFORM pgtaskd.settle_waiting(waiting, NULL);
    END IF;
END
$$;

-- A FAILED or CANCELED task back to QUEUED as `pgtaskd.retry` does, and with it every task
-- its end canceled (`on_dep_failure` 'cancel'), and theirs, which wait for it again. One row
-- per task brought back: the task and its status before.
CREATE FUNCTION pgtaskd.retry_with_dependents(task_id bigint)
RETURNS TABLE (retried_id bigint, previous text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    first text;
    level bigint[];
    next_level bigint[];
BEGIN
    first := pgtaskd.retry(retry_with_dependents.task_id);
    retried_id := retry_with_dependents.task_id;
    previous := first;
    RETURN NEXT;
    IF first IS NULL OR first NOT IN ('FAILED', 'CANCELED') THEN
        RETURN;
    END IF;
    level := ARRAY[retry_with_dependents.task_id];
    LOOP
        WITH back AS (
            UPDATE pgtaskd.task_state AS t
               SET status = 'QUEUED',
                   attempt = 0,
                   snoozes = 0,
                   cancel_requested = false,
                   canceled_by = NULL,
                   error = NULL,
                   started_at = NULL,
                   finished_at = NULL,
                   run_at = now()
             WHERE t.id = ANY (ARRAY(SELECT k.id FROM pgtaskd.task_state AS k
                                      WHERE k.canceled_by = ANY (level)
                                        AND k.status = 'CANCELED'
                                      ORDER BY k.id
                                        FOR UPDATE))
               AND t.status = 'CANCELED'
            RETURNING t.id
        )
        SELECT array_agg(b.id ORDER BY b.id) INTO next_level FROM back AS b;
        EXIT WHEN next_level IS NULL;
        PERFORM pgtaskd.wait_again(next_level);
        RETURN QUERY SELECT u.id, 'CANCELED'::text FROM unnest(next_level) AS u(id);
        level := next_level;
    END LOOP;
END
$$;

-- An auditor for tests and operators: one row for every inconsistency of the dependency
-- edges it finds, in one snapshot; it repairs nothing. Empty is the only right answer.
CREATE FUNCTION pgtaskd.check_deps()
RETURNS TABLE (task_id bigint, problem text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Waiting for nothing.
    SELECT s.id, 'WAITING with no edge left'
      FROM pgtaskd.task_state AS s
     WHERE s.status = 'WAITING'
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.child = s.id)
    UNION ALL
    -- An edge its parent's end should have taken.
    SELECT d.child, format('an edge to task %s, which is %s', d.parent, coalesce(p.status, 'gone'))
      FROM pgtaskd.task_deps AS d
      LEFT JOIN pgtaskd.task_state AS p ON p.id = d.parent
      LEFT JOIN pgtaskd.tasks AS t ON t.id = d.child
     WHERE p.id IS NULL OR p.status = 'SUCCEEDED'
        OR (p.status IN ('FAILED', 'CANCELED') AND coalesce(t.on_dep_failure, 'cancel') <> 'wait')
    UNION ALL
    -- An edge of a task that does not wait.
    SELECT d.child, format('an edge to task %s, but the task is %s', d.parent, coalesce(c.status, 'gone'))
      FROM pgtaskd.task_deps AS d
      LEFT JOIN pgtaskd.task_state AS c ON c.id = d.child
     WHERE c.id IS NULL OR c.status <> 'WAITING'
    UNION ALL
    -- An edge the task never asked for.
    SELECT d.child, format('an edge to task %s, which it does not depend on', d.parent)
      FROM pgtaskd.task_deps AS d
      JOIN pgtaskd.tasks AS t ON t.id = d.child
     WHERE NOT (d.parent = ANY (coalesce(t.depends_on, '{}')))
    UNION ALL
    -- A waiting task missing the edge to a parent that has not ended, or that failed under
    -- 'wait': it would be released before that parent. Not under 'run', where a parent's
    -- first end takes the edge for good, and a retry of that parent leaves it QUEUED again.
    SELECT s.id, format('no edge to task %s, which is %s', x.parent, p.status)
      FROM pgtaskd.task_state AS s
      JOIN pgtaskd.tasks AS t ON t.id = s.id
     CROSS JOIN LATERAL unnest(t.depends_on) AS x(parent)
      JOIN pgtaskd.task_state AS p ON p.id = x.parent
     WHERE s.status = 'WAITING'
       AND p.status <> 'SUCCEEDED'
       AND coalesce(t.on_dep_failure, 'cancel') <> 'run'
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d
                        WHERE d.child = s.id AND d.parent = x.parent)
$$;

-- Insert a whole graph of tasks in one transaction, named by local refs: `graph` is a JSON
-- array of objects {"ref", "payload", and optionally "queue", "priority", "run_at",
-- "max_attempts", "idempotency_key", "concurrency_key", "on_dep_failure", "after"}, where
-- "after" lists refs of the graph (strings) and ids of tasks already there (numbers). Parents
-- are inserted before their children, so each parent's id is the smaller; a cycle is refused
-- naming it (`cycle: a -> b -> a`, each waiting for the next) and nothing is inserted. With
-- the caller's rights: a producer inserts as itself. One row per task: its ref and its id.
CREATE FUNCTION pgtaskd.enqueue_graph(graph jsonb)
RETURNS TABLE (ref text, task_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n         int;
    ords      jsonb;
    bad       text;
    e_parent  int[];
    e_child   int[];
    first_out int[];
    indegree  int[];
    ready     int[];
    placed    int[] := '{}';
    ids       bigint[];
    node      jsonb;
    u         int;
    v         int;
    i         int;
    head      int := 1;
    walk      int[];
    seen      int[];
    new_id    bigint;
BEGIN
    IF enqueue_graph.graph IS NULL OR jsonb_typeof(enqueue_graph.graph) <> 'array' THEN
        RAISE EXCEPTION 'enqueue_graph: the graph is a JSON array of tasks'
            USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(enqueue_graph.graph);
    IF n = 0 THEN
        RETURN;
    END IF;
    IF n > 100000 THEN
        RAISE EXCEPTION 'enqueue_graph: % tasks, at most 100000 in one graph', n
            USING ERRCODE = '54000';
    END IF;
    -- Each task an object with a ref of its own and a payload.
    SELECT format('task %s: %s', e.ord,
                  CASE WHEN jsonb_typeof(e.node) <> 'object' THEN 'not a JSON object'
                       WHEN jsonb_typeof(e.node -> 'ref') IS DISTINCT FROM 'string'
                            OR e.node ->> 'ref' = '' THEN '"ref" is not a non-empty string'
                       WHEN jsonb_typeof(e.node -> 'payload') IS DISTINCT FROM 'string'
                            THEN '"payload" is not a string'
                       ELSE '"after" is not an array of refs and ids' END)
      INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord)
     WHERE jsonb_typeof(e.node) <> 'object'
        OR jsonb_typeof(e.node -> 'ref') IS DISTINCT FROM 'string' OR e.node ->> 'ref' = ''
        OR jsonb_typeof(e.node -> 'payload') IS DISTINCT FROM 'string'
        OR (e.node ? 'after' AND (jsonb_typeof(e.node -> 'after') <> 'array'
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.node -> 'after') AS a
                        WHERE jsonb_typeof(a) NOT IN ('string', 'number'))))
     ORDER BY e.ord
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: %', bad USING ERRCODE = '22023';
    END IF;
    SELECT string_agg(DISTINCT e.node ->> 'ref', ', ') INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) AS e(node)
     GROUP BY e.node ->> 'ref' HAVING count(*) > 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: ref % names two tasks', bad USING ERRCODE = '22023';
    END IF;
    -- ref -> position, 1 to n.
    SELECT jsonb_object_agg(e.node ->> 'ref', e.ord) INTO ords
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord);
    SELECT format('task %s waits for ref %s, which the graph does not name',
                  e.node ->> 'ref', a #>> '{}')
      INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) AS e(node),
           jsonb_array_elements(coalesce(e.node -> 'after', '[]')) AS a
     WHERE jsonb_typeof(a) = 'string' AND NOT ords ? (a #>> '{}')
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: %', bad USING ERRCODE = '22023';
    END IF;
    -- The edges between refs, by parent: first_out[u] .. first_out[u + 1] - 1.
    SELECT coalesce(array_agg(x.p ORDER BY x.p, x.c), '{}'),
           coalesce(array_agg(x.c ORDER BY x.p, x.c), '{}')
      INTO e_parent, e_child
      FROM (SELECT DISTINCT (ords ->> (a #>> '{}'))::int AS p, e.ord::int AS c
              FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord),
                   jsonb_array_elements(coalesce(e.node -> 'after', '[]')) AS a
             WHERE jsonb_typeof(a) = 'string') AS x;
    indegree := array_fill(0, ARRAY[n]);
    first_out := array_fill(0, ARRAY[n + 1]);
    FOR i IN 1 .. coalesce(array_length(e_child, 1), 0) LOOP
        indegree[e_child[i]] := indegree[e_child[i]] + 1;
        first_out[e_parent[i]] := first_out[e_parent[i]] + 1;
    END LOOP;
    -- Counts to starts (prefix sums).
    v := 1;
    FOR u IN 1 .. n + 1 LOOP
        i := first_out[u];
        first_out[u] := v;
        v := v + i;
    END LOOP;
    -- Kahn's order, the graph's own order among tasks ready together.
    ready := ARRAY(SELECT g FROM generate_series(1, n) AS g WHERE indegree[g] = 0);
    WHILE head <= coalesce(array_length(ready, 1), 0) LOOP
        u := ready[head];
        head := head + 1;
        placed := placed || u;
        FOR i IN first_out[u] .. first_out[u + 1] - 1 LOOP
            indegree[e_child[i]] := indegree[e_child[i]] - 1;
            IF indegree[e_child[i]] = 0 THEN
                ready := ready || e_child[i];
            END IF;
        END LOOP;
    END LOOP;
    IF coalesce(array_length(placed, 1), 0) < n THEN
        -- Every task left waits for another task left: follow one such edge from each until
        -- a task comes round again.
        u := (SELECT min(g) FROM generate_series(1, n) AS g WHERE indegree[g] > 0);
        seen := array_fill(0, ARRAY[n]);
        walk := '{}';
        WHILE seen[u] = 0 LOOP
            seen[u] := coalesce(array_length(walk, 1), 0) + 1;
            walk := walk || u;
            SELECT min(x.p) INTO u
              FROM unnest(e_parent, e_child) AS x(p, c)
             WHERE x.c = u AND indegree[x.p] > 0;
        END LOOP;
        walk := walk[seen[u]:] || u;
        RAISE EXCEPTION 'cycle: %',
            (SELECT string_agg(enqueue_graph.graph -> (w.o - 1) ->> 'ref', ' -> ' ORDER BY w.k)
               FROM unnest(walk) WITH ORDINALITY AS w(o, k))
            USING ERRCODE = '22023';
    END IF;
    ids := array_fill(NULL::bigint, ARRAY[n]);
    FOREACH u IN ARRAY placed LOOP
        node := enqueue_graph.graph -> (u - 1);
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts,
                                   idempotency_key, concurrency_key, on_dep_failure, depends_on)
        VALUES (node ->> 'payload',
                coalesce(node ->> 'queue', 'default'),
                coalesce((node ->> 'priority')::smallint, 0),
                coalesce((node ->> 'run_at')::timestamptz, now()),
                (node ->> 'max_attempts')::int,
                node ->> 'idempotency_key',
                node ->> 'concurrency_key',
                node ->> 'on_dep_failure',
                nullif(ARRAY(SELECT CASE WHEN jsonb_typeof(a) = 'string'
                                         THEN ids[(ords ->> (a #>> '{}'))::int]
                                         ELSE (a #>> '{}')::bigint END
                               FROM jsonb_array_elements(coalesce(node -> 'after', '[]')) AS a),
                       '{}'))
        RETURNING id INTO new_id;
        ids[u] := new_id;
        ref := node ->> 'ref';
        task_id := new_id;
        RETURN NEXT;
    END LOOP;
END
$$;

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
                                  AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                             THEN now() + f.retry_in * interval '1 second'
                             WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                  AND t.snoozes < 100
                             THEN now() + coalesce(f.retry_in, 0) * interval '1 second'
                             ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
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

-- Take back up to `max_tasks` expired leases, other than those of instance `owner`: QUEUED
-- with a backoff while attempts remain, else FAILED; CANCELED where a cancel was requested.
-- Rows are picked with SKIP LOCKED and re-checked (still RUNNING, same token, lease still
-- expired), so rescuers of many daemons never fight and a lease extended meanwhile stays.
-- The tasks it ends are announced on `pgtaskd_done` in the same transaction. A claim whose
-- result a stopped daemon parked is left to `write_parked` ("Parked results", version 28).
CREATE OR REPLACE FUNCTION pgtaskd.rescue(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_attempt int, task_previous_owner text, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    answer_ids      bigint[];
    answer_attempts int[];
    answer_owners   text[];
    answer_statuses text[];
BEGIN
    WITH expired AS MATERIALIZED (
        SELECT k.id, k.attempt, k.claim_token, k.lease_owner
          FROM pgtaskd.task_state AS k
         WHERE k.status = 'RUNNING' AND k.lease_expires_at < now()
           AND k.lease_owner IS DISTINCT FROM rescue.owner
           -- A result is parked for this claim (version 28).
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.parked_results AS p
                            WHERE p.task_id = k.id AND p.claim_token = k.claim_token)
         ORDER BY k.lease_expires_at
         LIMIT rescue.max_tasks
           FOR UPDATE SKIP LOCKED
    ), rescued AS (
        UPDATE pgtaskd.task_state AS t
           SET status = CASE
                   WHEN t.cancel_requested THEN 'CANCELED'
                   WHEN t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue)) THEN 'QUEUED'
                   ELSE 'FAILED'
               END,
               error = CASE
                   WHEN NOT t.cancel_requested AND t.attempt >= coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                   THEN format('lease lost after %s attempts (last held by %s)',
                               t.attempt, t.lease_owner)
               END,
               -- A lost lease is a failed attempt (version 30).
               errors = CASE
                   WHEN t.cancel_requested THEN t.errors
                   ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs,
                            format('lease lost (last held by %s)', t.lease_owner))
               END,
               -- The n-th lost lease waits (n-1)^2 seconds, at most ten minutes.
               run_at = CASE
                   WHEN NOT t.cancel_requested AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                   THEN now() + least(power(t.attempt - 1, 2), 600) * interval '1 second'
                   ELSE t.run_at
               END,
               finished_at = CASE
                   WHEN t.cancel_requested OR t.attempt >= coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue)) THEN now()
               END,
               lease_owner = NULL,
               lease_expires_at = NULL
          FROM expired
         WHERE t.id = expired.id
           AND t.status = 'RUNNING'
           AND t.claim_token IS NOT DISTINCT FROM expired.claim_token
           AND t.lease_expires_at < now()
        RETURNING t.id, expired.attempt, expired.lease_owner, t.status, t.queue
    ), freed AS (
        SELECT pgtaskd.notify_freed(array_agg(r.queue)) AS sent FROM rescued AS r
    ), notified AS (
        SELECT pgtaskd.notify_done(array_agg(r.id)) AS sent
          FROM rescued AS r WHERE r.status <> 'QUEUED'
    )
    SELECT array_agg(r.id ORDER BY r.id), array_agg(r.attempt ORDER BY r.id),
           array_agg(r.lease_owner ORDER BY r.id), array_agg(r.status ORDER BY r.id)
      INTO answer_ids, answer_attempts, answer_owners, answer_statuses
      FROM rescued AS r CROSS JOIN notified CROSS JOIN freed;
    -- The tasks that ended release or cancel those waiting on them (version 37).
    PERFORM pgtaskd.end_parents(ARRAY(
        SELECT u.id FROM unnest(answer_ids, answer_statuses) AS u(id, status)
         WHERE u.status IN ('FAILED', 'CANCELED')));
    RETURN QUERY
    SELECT u.id, u.attempt, u.owner, u.status
      FROM unnest(answer_ids, answer_attempts, answer_owners, answer_statuses)
           AS u(id, attempt, owner, status);
END
$$;

-- Give the claim `token` of task `id` back without a result, as a shutdown does: QUEUED with
-- the attempt not counted, or CANCELED where a cancel was requested. Without `wait`, a row
-- someone else holds fails with lock_not_available (55P03). One row: the status written
-- (null when the claim was not held) and the task's status now (null: no such task).
CREATE OR REPLACE FUNCTION pgtaskd.release(id bigint, token bigint, wait boolean)
RETURNS TABLE (written text, current text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    answer_written text;
    answer_current text;
BEGIN
    WITH unlocked AS MATERIALIZED (
        SELECT k.id FROM pgtaskd.task_state AS k
         WHERE NOT release.wait AND k.id = release.id
           FOR UPDATE NOWAIT
    ), done AS (
        UPDATE pgtaskd.task_state AS t
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED' ELSE 'QUEUED' END,
               attempt = CASE WHEN t.cancel_requested THEN t.attempt ELSE t.attempt - 1 END,
               started_at = CASE WHEN t.cancel_requested THEN t.started_at END,
               finished_at = CASE WHEN t.cancel_requested THEN now() END,
               lease_owner = NULL,
               lease_expires_at = NULL
         WHERE t.id = release.id AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = release.token
           AND (release.wait OR t.id IN (SELECT u.id FROM unlocked AS u))
        RETURNING t.id, t.status, t.queue
    ), freed AS (
        SELECT pgtaskd.notify_freed(array_agg(d.queue)) AS sent FROM done AS d
    ), notified AS (
        -- A release that ends the task (CANCELED) tells the waiters, in the same transaction.
        SELECT pgtaskd.notify_done(array_agg(d.id)) AS sent
          FROM done AS d WHERE d.status = 'CANCELED'
    )
    SELECT (SELECT d.status FROM done AS d),
           (SELECT k.status FROM pgtaskd.task_state AS k WHERE k.id = release.id)
      INTO answer_written, answer_current
      FROM notified CROSS JOIN freed;
    -- A release that ends the task releases or cancels those waiting on it (version 37).
    IF answer_written = 'CANCELED' THEN
        PERFORM pgtaskd.end_parents(ARRAY[release.id]);
    END IF;
    RETURN QUERY SELECT answer_written, answer_current;
END
$$;

-- Cancel a task: QUEUED to CANCELED at once, or a request recorded on a RUNNING task and
-- `NOTIFY pgtaskd_cancel`; returns the status before and after ("Cancel is a request").
-- With its owner's rights, so that producers need no UPDATE right.
CREATE OR REPLACE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- `coalesce(status, '')`: found by primary key, never by a scan of a partial index. A
    -- WAITING task is canceled as a QUEUED one is, and waits for nothing any more; the tasks
    -- waiting on it are decided in this transaction (version 37).
    SELECT status INTO previous FROM pgtaskd.task_state
     WHERE id = task_id AND coalesce(status, '') IN ('QUEUED', 'WAITING')
       FOR UPDATE;
    IF FOUND THEN
        UPDATE pgtaskd.task_state
           SET status = 'CANCELED', cancel_requested = true, finished_at = now(), error = NULL
         WHERE id = task_id AND coalesce(status, '') IN ('QUEUED', 'WAITING')
        RETURNING status INTO current;
    END IF;
    IF current IS NOT NULL THEN
        DELETE FROM pgtaskd.task_deps WHERE child = task_id;
        PERFORM pgtaskd.notify_done(ARRAY[task_id]);
        PERFORM pgtaskd.end_parents(ARRAY[task_id]);
        RETURN;
    END IF;

    UPDATE pgtaskd.task_state SET cancel_requested = true
     WHERE id = task_id AND coalesce(status, '') = 'RUNNING'
    RETURNING 'RUNNING', status INTO previous, current;
    IF FOUND THEN
        PERFORM pgtaskd.notify('pgtaskd_cancel', task_id::text);
        RETURN;
    END IF;

    SELECT status, status INTO previous, current FROM pgtaskd.task_state WHERE id = task_id;
END
$$;

-- A FAILED or CANCELED task back to QUEUED, as if new ("States").
CREATE OR REPLACE FUNCTION pgtaskd.retry(task_id bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    previous text;
BEGIN
    SELECT t.status INTO previous FROM pgtaskd.task_state AS t WHERE t.id = retry.task_id FOR UPDATE;
    IF previous IS NULL OR previous NOT IN ('FAILED', 'CANCELED') THEN
        RETURN previous;
    END IF;
    UPDATE pgtaskd.task_state AS t
       SET status = 'QUEUED',
           attempt = 0,
           snoozes = 0,
           cancel_requested = false,
           canceled_by = NULL,
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
    -- A task with parents waits again for those that have not SUCCEEDED (version 37).
    PERFORM pgtaskd.wait_again(ARRAY[retry.task_id]);
    PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    RETURN previous;
END
$$;

-- At most `max_rows` FAILED tasks of a queue above `after_id` back to QUEUED, as
-- `pgtaskd.retry` does; one batch per call, called until `retried` is 0 ("States").
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
DECLARE
    back bigint[];
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'pgtaskd.retry_failed: max_rows must be at least 1, not %', max_rows
            USING ERRCODE = '22023';
    END IF;
    WITH batch AS (
        SELECT t.id
          FROM pgtaskd.task_state AS t
         WHERE t.queue = retry_failed.queue
           AND t.status = 'FAILED'
           AND t.id > coalesce(retry_failed.after_id, 0)
         ORDER BY t.id
         LIMIT retry_failed.max_rows
           FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE pgtaskd.task_state AS t
           SET status = 'QUEUED',
               attempt = 0,
               snoozes = 0,
               cancel_requested = false,
               canceled_by = NULL,
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
    SELECT count(*), coalesce(max(done.id), coalesce(retry_failed.after_id, 0)),
           array_agg(done.id ORDER BY done.id)
      INTO retried, last_id, back
      FROM done;
    -- Tasks with parents wait again for those that have not SUCCEEDED (version 37).
    PERFORM pgtaskd.wait_again(back);
    IF retried > 0 THEN
        PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    END IF;
END
$$;

-- Retention's batch: delete up to `max_rows` finished tasks older than the window, oldest
-- first, from where the previous batch ended ("Vacuum"): their state rows and their task
-- rows (version 36). A task whose row another transaction holds is passed over, as is one
-- whose state row is held. With the owner's rights: the daemon's role may not lock or
-- update task rows (version 36).
CREATE OR REPLACE FUNCTION pgtaskd.prune(
    older_than_ms float8,
    max_rows      bigint,
    from_finished timestamptz
) RETURNS TABLE (deleted bigint, last_finished timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT k.id
          FROM pgtaskd.task_state AS k
         WHERE k.finished_at < now() - least(
                   prune.older_than_ms * interval '1 millisecond',
                   (SELECT min(s.retain) FROM pgtaskd.queue_settings AS s))
           AND k.finished_at >= coalesce(prune.from_finished, '-infinity')
           AND k.status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
           -- Never a parent a task still waits on (version 37): its dependents go first.
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.parent = k.id)
           -- A queue's own `retain` (version 33) over the daemon's setting.
           AND k.finished_at < now() - coalesce(
                   (SELECT s.retain FROM pgtaskd.queue_settings AS s
                     WHERE s.queue = k.queue),
                   prune.older_than_ms * interval '1 millisecond')
         ORDER BY k.finished_at
         LIMIT prune.max_rows
           FOR UPDATE SKIP LOCKED
    ), held AS MATERIALIZED (
        SELECT p.id
          FROM pgtaskd.tasks AS p
         WHERE p.id = ANY (ARRAY(SELECT picked.id FROM picked))
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgtaskd.task_state AS t
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           -- Found by primary key (see version 4), re-checked: still finished.
           AND coalesce(t.status, '') IN ('SUCCEEDED', 'FAILED', 'CANCELED')
        RETURNING t.id, t.finished_at
    ), tasks_gone AS (
        DELETE FROM pgtaskd.tasks AS r
         WHERE r.id = ANY (ARRAY(SELECT gone.id FROM gone))
    )
    SELECT count(*), max(gone.finished_at) FROM gone;
END
$$;

-- The producer's statement fills the state table itself, whatever its size (an INSERT, an
-- INSERT ... SELECT, a COPY): one INSERT ... SELECT per statement over its new rows. With the
-- owner's rights: producers have no right on the state table. Like every trigger, these do
-- not fire where `session_replication_role` is `replica` (a logical replication apply, a
-- restore with triggers disabled): those copy both tables. A task with parents is WAITING,
-- with an edge to each (version 37); each parent must exist.
CREATE OR REPLACE FUNCTION pgtaskd.tasks_state() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    missing bigint;
BEGIN
    INSERT INTO pgtaskd.task_state (id, queue, priority, run_at, max_attempts, concurrency_key,
                                    status)
    SELECT n.id, n.queue, n.priority, n.run_at, n.max_attempts, n.concurrency_key,
           CASE WHEN cardinality(n.depends_on) > 0 THEN 'WAITING' ELSE 'QUEUED' END
      FROM new_tasks AS n
    -- A state row loaded before its task row (a data-only restore of both tables) is kept.
        ON CONFLICT (id) DO NOTHING;
    IF EXISTS (SELECT 1 FROM new_tasks AS n WHERE cardinality(n.depends_on) > 0) THEN
        SELECT x.parent INTO missing
          FROM new_tasks AS n
         CROSS JOIN LATERAL unnest(n.depends_on) AS x(parent)
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = x.parent)
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
          JOIN pgtaskd.task_state AS s ON s.id = n.id AND s.status = 'WAITING'
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

-- A task deleted (retention deletes both rows itself; an operator's DELETE too) takes its
-- state with it.
CREATE OR REPLACE FUNCTION pgtaskd.tasks_state_gone() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held record;
BEGIN
    -- A task another task still waits on stays (version 37): retention takes the dependents
    -- first.
    SELECT d.parent, d.child INTO held
      FROM pgtaskd.task_deps AS d
     WHERE d.parent OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o))
       AND NOT (d.child OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o)))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'task % cannot be deleted: task % waits for it', held.parent, held.child
            USING ERRCODE = '23503',
                  HINT = 'Cancel or delete the waiting task first.';
    END IF;
    DELETE FROM pgtaskd.task_deps AS d
     WHERE d.child OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o));
    DELETE FROM pgtaskd.task_state AS s
     WHERE s.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o));
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.tasks_state_truncate() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    TRUNCATE pgtaskd.task_state, pgtaskd.task_deps;
    RETURN NULL;
END
$$;

-- The schema's owner may still change a task's queue, priority, attempts or key, or move a
-- QUEUED task's `run_at` (pgtaskd never does): the state's copies follow. Its id never
-- changes: that would part the task from its state; nor do its parents (version 37).
CREATE OR REPLACE FUNCTION pgtaskd.tasks_state_copy() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.id OPERATOR(pg_catalog.<>) OLD.id THEN
        RAISE EXCEPTION 'the id of a task does not change (task %)', OLD.id
            USING ERRCODE = '42501';
    END IF;
    IF (NEW.depends_on, NEW.on_dep_failure) IS DISTINCT FROM (OLD.depends_on, OLD.on_dep_failure) THEN
        RAISE EXCEPTION 'the parents of a task do not change (task %)', OLD.id
            USING ERRCODE = '42501';
    END IF;
    UPDATE pgtaskd.task_state AS s
       SET queue = NEW.queue,
           priority = NEW.priority,
           max_attempts = NEW.max_attempts,
           concurrency_key = NEW.concurrency_key,
           run_at = CASE WHEN s.status OPERATOR(pg_catalog.=) 'QUEUED'
                              AND NEW.run_at IS DISTINCT FROM OLD.run_at
                         THEN NEW.run_at ELSE s.run_at END
     WHERE s.id OPERATOR(pg_catalog.=) NEW.id;
    RETURN NULL;
END
$$;

-- Run as the schema's owner (the role that migrated). A producer inserts the columns a
-- producer chooses, reads, enqueues and cancels; never a status, a lease or a result.
CREATE OR REPLACE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_state, pgtaskd.task_view TO %I',
                   role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent, concurrency_key, depends_on, on_dep_failure) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
    -- Graphs of tasks (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue_graph(jsonb) TO %I', role_name);
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
    -- The CLI's schema check (version 23).
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
    -- Which queues are paused, for `pgtaskd stats` (version 26).
    EXECUTE format('GRANT SELECT ON pgtaskd.paused_queues TO %I', role_name);
    -- The schedules (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
    -- The queues' limits and defaults (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
END
$$;

-- What `pgtaskd run` and the one-shot commands need; no DDL, no vacuum.
CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update state rows, never a task row
    -- (version 36); retention deletes finished tasks with the owner's rights; the CLI and
    -- the HTTP API insert like a producer, and steer queues like an operator; `/metrics` and
    -- `/readyz` read the vacuum health.
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT, UPDATE ON pgtaskd.task_state TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent, concurrency_key, depends_on, on_dep_failure) '
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
    -- Schedules: read, fired, and steered like queues (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean), '
                   'pgtaskd.remove_schedule(text), pgtaskd.pause_schedule(text, boolean), '
                   'pgtaskd.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz) '
                   'TO %I', role_name);
    -- Limits: read and set like queues, counted and written by the claim (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON pgtaskd.queue_starts TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.set_queue(text, jsonb), '
                   'pgtaskd.notify_freed(text[]) TO %I', role_name);
    -- Dependencies: each end decides its dependents; graphs, retries with dependents and the
    -- auditor (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.end_parents(bigint[]), '
                   'pgtaskd.enqueue_graph(jsonb), pgtaskd.retry_with_dependents(bigint), '
                   'pgtaskd.check_deps() TO %I', role_name);
END
$$;

-- An operator reads, pauses, resumes, retries and cancels; inserts and claims nothing.
CREATE OR REPLACE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_state, pgtaskd.task_view, '
                   'pgtaskd.paused_queues, '
                   'pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.pause_queue(text), '
                   'pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.retry_failed(text, integer, bigint), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.vacuum_health() TO %I', role_name);
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
    -- Schedules: read and steered (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean), '
                   'pgtaskd.remove_schedule(text), pgtaskd.pause_schedule(text, boolean) '
                   'TO %I', role_name);
    -- Limits and defaults: read and set (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.set_queue(text, jsonb) TO %I', role_name);
    -- Retries with dependents and the dependencies' auditor (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.retry_with_dependents(bigint), '
                   'pgtaskd.check_deps() TO %I', role_name);
END
$$;

-- Before the CHECK of each new task with parents (version 37): a parent not older than the
-- task is named, as not existing (ids only grow), or, written by the owner with an id of its
-- choosing, as newer.
CREATE FUNCTION pgtaskd.tasks_parents_check() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    newer bigint;
BEGIN
    SELECT max(x.parent) INTO newer
      FROM unnest(NEW.depends_on) AS x(parent)
     WHERE x.parent >= NEW.id;
    IF newer IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = newer) THEN
            RAISE EXCEPTION 'task % may depend only on tasks inserted before it, not on task % (tasks_depends_on_earlier)',
                NEW.id, newer
                USING ERRCODE = '23514', CONSTRAINT = 'tasks_depends_on_earlier';
        END IF;
        RAISE EXCEPTION 'task depends on task %, which does not exist', newer
            USING ERRCODE = '23503';
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_parents_check() FROM PUBLIC;
CREATE TRIGGER tasks_parents_check BEFORE INSERT ON pgtaskd.tasks
    FOR EACH ROW
    WHEN (pg_catalog.cardinality(NEW.depends_on) OPERATOR(pg_catalog.>) 0)
    EXECUTE FUNCTION pgtaskd.tasks_parents_check();

-- At the producer's commit, each new task with parents (version 37): its parents are held
-- (FOR SHARE, in id order) until that commit, so that an end of one of them either committed
-- before (and is decided here, as `pgtaskd.settle_waiting` decides it) or waits for this
-- commit and then finds the task's edges. A parent deleted meanwhile fails the commit.
CREATE FUNCTION pgtaskd.tasks_deps_settle() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = d.parent)
     LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'task depends on task %, which does not exist', missing
            USING ERRCODE = '23503';
    END IF;
    PERFORM pgtaskd.settle_waiting(ARRAY[NEW.id], NULL);
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_deps_settle() FROM PUBLIC;
CREATE CONSTRAINT TRIGGER tasks_deps_settle AFTER INSERT ON pgtaskd.tasks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (pg_catalog.cardinality(NEW.depends_on) OPERATOR(pg_catalog.>) 0)
    EXECUTE FUNCTION pgtaskd.tasks_deps_settle();

DROP TRIGGER tasks_state_copy ON pgtaskd.tasks;
CREATE TRIGGER tasks_state_copy
    AFTER UPDATE OF id, queue, priority, run_at, max_attempts, concurrency_key, depends_on,
                    on_dep_failure ON pgtaskd.tasks
    FOR EACH ROW
    WHEN ((OLD.id, OLD.queue, OLD.priority, OLD.run_at, OLD.max_attempts, OLD.concurrency_key,
           OLD.depends_on, OLD.on_dep_failure)
          IS DISTINCT FROM
          (NEW.id, NEW.queue, NEW.priority, NEW.run_at, NEW.max_attempts, NEW.concurrency_key,
           NEW.depends_on, NEW.on_dep_failure))
    EXECUTE FUNCTION pgtaskd.tasks_state_copy();

-- The claim, answering each task's parents; the grants it had are kept.
DO $$
BEGIN
    CREATE TEMPORARY TABLE claim_grantees_37 ON COMMIT DROP AS
        SELECT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint)'::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0;
END
$$;
DROP FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint);

-- Claim: QUEUED to RUNNING for up to `max_tasks` tasks of the served queues, one winner per
-- task ("One winner"), within a byte budget ("Bounded memory"), skipping paused queues,
-- optionally after a position ("Claims after a position"), each with a claim token of its
-- own ("One claim, one token"). The planner settings keep its plan right under statistics
-- taken while the table was empty ("SQL interface", "Functions").
CREATE FUNCTION pgtaskd.claim(
    queues         text[],
    max_tasks      bigint,
    owner          text,
    lease_ms       float8,
    max_bytes      bigint,
    take_one       boolean,
    max_payload    bigint,
    after_priority int,
    after_id       bigint
) RETURNS TABLE (task_id bigint, task_attempt int, task_payload text, task_bytes bigint,
                 waited_s float8, task_priority int, task_claim bigint, task_run int,
                 task_key text, task_idempotency_key text, task_traceparent text,
                 task_parents text, task_parent_count int)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    open_queues text[] := claim.queues;
    rated       text[] := '{}';
    limited_ids bigint[] := '{}';
    again_in    float8;
    settings    record;
    decided_at  timestamptz;
    running_now bigint;
    started     bigint;
    oldest      timestamptz;
    room        bigint;
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    END IF;
    -- Limited queues, in name order (so that two claims never wait for each other's locks in
    -- turn; they do not wait at all).
    FOR settings IN
        SELECT s.queue, s.max_running, s.max_running_per_key, s.rate_limit, s.rate_period
          FROM pgtaskd.queue_settings AS s
         WHERE s.queue = ANY (claim.queues)
           AND (s.max_running IS NOT NULL OR s.max_running_per_key IS NOT NULL
                OR s.rate_limit IS NOT NULL)
         ORDER BY s.queue
    LOOP
        open_queues := pg_catalog.array_remove(open_queues, settings.queue);
        CONTINUE WHEN EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p
                               WHERE p.queue = settings.queue);
        IF NOT pg_catalog.pg_try_advisory_xact_lock(1885828196, pg_catalog.hashtext(settings.queue)) THEN
            -- Another claim decides for this queue now: call again shortly.
            again_in := least(coalesce(again_in, 0.02), 0.02);
            CONTINUE;
        END IF;
        -- Each statement from here sees what the previous holder of the lock committed.
        decided_at := pg_catalog.clock_timestamp();
        room := claim.max_tasks;
        IF settings.max_running IS NOT NULL THEN
            SELECT count(*) INTO running_now
              FROM pgtaskd.task_state AS k
             WHERE k.status = 'RUNNING' AND k.queue = settings.queue;
            room := least(room, settings.max_running - running_now);
        END IF;
        IF settings.rate_limit IS NOT NULL THEN
            rated := rated || settings.queue;
            -- A start counts for its window and 50 ms more: a handler starts a little after its
            -- claim, by a delay that varies.
            DELETE FROM pgtaskd.queue_starts AS r
             WHERE r.queue = settings.queue
               AND r.started_at <= decided_at - settings.rate_period - interval '50 milliseconds';
            SELECT count(*), min(r.started_at) INTO started, oldest
              FROM pgtaskd.queue_starts AS r
             WHERE r.queue = settings.queue;
            room := least(room, settings.rate_limit - started);
            IF started >= settings.rate_limit THEN
                again_in := least(coalesce(again_in, 'infinity'),
                                  greatest(extract(epoch FROM oldest + settings.rate_period
                                                   + interval '50 milliseconds' - decided_at)::float8,
                                           0.001));
            END IF;
        END IF;
        CONTINUE WHEN room <= 0;
        IF settings.max_running_per_key IS NULL THEN
            limited_ids := limited_ids || ARRAY(
                SELECT k.id FROM pgtaskd.task_state AS k
                 WHERE k.status = 'QUEUED' AND k.queue = settings.queue AND k.run_at <= now()
                   AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS p WHERE p.id = k.id)
                 ORDER BY k.priority DESC, k.id
                 LIMIT room
                   FOR UPDATE SKIP LOCKED);
        ELSE
            -- The first tasks in claim order (a bounded read) whose key has a slot left,
            -- counting the ones taken before it; tasks without a key are not counted by key.
            -- Then locked, skipping what another transaction holds.
            limited_ids := limited_ids || ARRAY(
                SELECT k.id FROM pgtaskd.task_state AS k
                 WHERE k.id = ANY (ARRAY(
                        SELECT r.id
                          FROM (SELECT w.id, w.priority, w.concurrency_key,
                                       row_number() OVER (PARTITION BY w.concurrency_key
                                                          ORDER BY w.priority DESC, w.id) AS nth
                                  FROM (SELECT q.id, q.priority, q.concurrency_key
                                          FROM pgtaskd.task_state AS q
                                         WHERE q.status = 'QUEUED' AND q.queue = settings.queue
                                           AND q.run_at <= now()
                                           AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS p
                                                        WHERE p.id = q.id)
                                         ORDER BY q.priority DESC, q.id
                                         LIMIT 1000 + claim.max_tasks) AS w) AS r
                          LEFT JOIN (SELECT b.concurrency_key, count(*) AS n
                                       FROM pgtaskd.task_state AS b
                                      WHERE b.status = 'RUNNING' AND b.queue = settings.queue
                                        AND b.concurrency_key IS NOT NULL
                                      GROUP BY b.concurrency_key) AS busy
                            ON busy.concurrency_key = r.concurrency_key
                         WHERE r.concurrency_key IS NULL
                            OR coalesce(busy.n, 0) + r.nth <= settings.max_running_per_key
                         ORDER BY r.priority DESC, r.id
                         LIMIT room))
                   AND coalesce(k.status, '') = 'QUEUED'
                   FOR UPDATE SKIP LOCKED);
        END IF;
    END LOOP;
    RETURN QUERY
    WITH candidates AS MATERIALIZED (
        SELECT c.id, c.priority, c.size
          FROM unnest(open_queues) AS q(name)
         CROSS JOIN LATERAL (
                -- After the position: the rest of its priority...
                -- The payload's size from the task row; a state row without its task row
                -- (written by hand) is never claimed.
                SELECT k.id, k.priority, octet_length(p.payload)::bigint AS size
                  FROM pgtaskd.task_state AS k
                  JOIN pgtaskd.tasks AS p ON p.id = k.id
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority = claim.after_priority
                   AND k.id > claim.after_id
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE OF k SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
        UNION ALL
        SELECT c.id, c.priority, c.size
          FROM unnest(open_queues) AS q(name)
         CROSS JOIN LATERAL (
                -- ...then the lower priorities.
                -- The payload's size from the task row; a state row without its task row
                -- (written by hand) is never claimed.
                SELECT k.id, k.priority, octet_length(p.payload)::bigint AS size
                  FROM pgtaskd.task_state AS k
                  JOIN pgtaskd.tasks AS p ON p.id = k.id
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority < CASE WHEN claim.after_id IS NULL THEN 32768
                                         ELSE coalesce(claim.after_priority, 32768) END
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE OF k SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
        UNION ALL
        -- The limited queues' tasks, picked and locked above.
        SELECT k.id, k.priority, octet_length(p.payload)::bigint AS size
          FROM pgtaskd.task_state AS k
          JOIN pgtaskd.tasks AS p ON p.id = k.id
         WHERE k.id = ANY (limited_ids)
         ORDER BY 2 DESC, 1
         LIMIT claim.max_tasks
    ), sized AS MATERIALIZED (
        SELECT s.id, s.size,
               row_number() OVER w AS n,
               sum(CASE WHEN s.size > claim.max_payload THEN 0 ELSE s.size END) OVER w AS running
          FROM candidates AS s
        WINDOW w AS (ORDER BY s.priority DESC, s.id)
    ), picked AS MATERIALIZED (
        SELECT z.id FROM sized AS z
         WHERE z.running <= claim.max_bytes OR (claim.take_one AND z.n = 1)
    ), claimed AS (
        UPDATE pgtaskd.task_state AS t
           SET status = 'RUNNING',
               attempt = t.attempt + 1,
               runs = greatest(t.runs, t.attempt) + 1,
               claim_token = (SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN 0::bigint
                                          ELSE ((('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(
                                                    pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                                                 - 1) % 65536) << 47 END)
                             | (pg_catalog.nextval('pgtaskd.claim_tokens') & 140737488355327),
               lease_owner = claim.owner,
               lease_expires_at = now() + claim.lease_ms * interval '1 millisecond',
               started_at = now()
          -- The task as its producer wrote it: the payload and what the handler is told.
          FROM pgtaskd.tasks AS p
         WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
           AND coalesce(t.status, '') = 'QUEUED'
           AND p.id = t.id
        RETURNING t.id, t.attempt, t.priority, t.claim_token, t.queue,
                  CASE WHEN octet_length(p.payload) > claim.max_payload THEN NULL
                       ELSE p.payload END AS payload,
                  octet_length(p.payload)::bigint AS size,
                  extract(epoch FROM now() - greatest(p.created_at, t.run_at))::float8 AS waited,
                  t.runs,
                  coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || t.id || '-'
                      || (extract(epoch FROM p.created_at) * 1000000)::bigint AS task_key,
                  p.idempotency_key, p.traceparent,
                  -- Its parents and how each ended, the first 200 (version 37).
                  CASE WHEN cardinality(p.depends_on) > 0 THEN
                      (SELECT string_agg(x.parent || '=' || coalesce(s.status, 'GONE'), ','
                                         ORDER BY x.parent)
                         FROM (SELECT DISTINCT u.parent
                                 FROM unnest(p.depends_on) AS u(parent)
                                ORDER BY u.parent
                                LIMIT 200) AS x
                         LEFT JOIN pgtaskd.task_state AS s ON s.id = x.parent)
                  END AS parents,
                  CASE WHEN cardinality(p.depends_on) > 0 THEN
                      (SELECT count(DISTINCT u.parent)::int FROM unnest(p.depends_on) AS u(parent))
                  ELSE 0 END AS parent_count
    ), starts AS (
        -- Each start of a rate-limited queue, for the next claims to count.
        INSERT INTO pgtaskd.queue_starts (queue, started_at)
        SELECT claimed.queue, coalesce(decided_at, now()) FROM claimed
         WHERE claimed.queue = ANY (rated)
    )
    (SELECT claimed.id, claimed.attempt, claimed.payload, claimed.size, claimed.waited,
            claimed.priority::int, claimed.claim_token, claimed.runs, claimed.task_key,
            claimed.idempotency_key, claimed.traceparent, claimed.parents,
            claimed.parent_count
       FROM claimed
      ORDER BY claimed.priority DESC, claimed.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8, NULL::int, NULL::bigint,
            NULL::int, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1)
    UNION ALL
    SELECT NULL::bigint, NULL::int, NULL::text, NULL::bigint, again_in, NULL::int, NULL::bigint,
           NULL::int, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int
     WHERE again_in IS NOT NULL;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint) FROM PUBLIC;
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN SELECT g.grantee FROM claim_grantees_37 AS g
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, '
                                  'bigint, boolean, bigint, int, bigint) TO %s', grantee::regrole);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.settle_waiting(bigint[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.end_parents(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.wait_again(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.retry_with_dependents(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.check_deps() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.enqueue_graph(jsonb) FROM PUBLIC;

-- The roles granted before keep what they did: a role that inserts tasks by column may name
-- parents; one that finishes claims ends parents, and runs graphs, retries with dependents
-- and the auditor; one that retries (an operator) retries with dependents and audits; one
-- that enqueues inserts graphs.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT c.grantee
          FROM information_schema.column_privileges AS c
         WHERE c.table_schema OPERATOR(pg_catalog.=) 'pgtaskd'
           AND c.table_name OPERATOR(pg_catalog.=) 'tasks'
           AND c.column_name OPERATOR(pg_catalog.=) 'payload'
           AND c.privilege_type OPERATOR(pg_catalog.=) 'INSERT'
           AND c.grantee OPERATOR(pg_catalog.<>) 'PUBLIC'
           AND c.grantee::name OPERATOR(pg_catalog.<>) (SELECT pg_catalog.pg_get_userbyid(k.relowner)
                                                          FROM pg_catalog.pg_class AS k
                                                         WHERE k.oid OPERATOR(pg_catalog.=) 'pgtaskd.tasks'::pg_catalog.regclass)
    LOOP
        EXECUTE pg_catalog.format('GRANT INSERT (depends_on, on_dep_failure) ON pgtaskd.tasks TO %I',
                                  r.grantee);
    END LOOP;
    FOR r IN
        SELECT a.grantee::regrole AS grantee, p.proname
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pgtaskd'::pg_catalog.regnamespace
           AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['finish', 'retry', 'enqueue'])
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        IF r.proname OPERATOR(pg_catalog.=) 'finish' THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.end_parents(bigint[]), '
                                      'pgtaskd.enqueue_graph(jsonb), pgtaskd.retry_with_dependents(bigint), '
                                      'pgtaskd.check_deps() TO %s', r.grantee);
        ELSIF r.proname OPERATOR(pg_catalog.=) 'retry' THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.retry_with_dependents(bigint), '
                                      'pgtaskd.check_deps() TO %s', r.grantee);
        ELSE
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue_graph(jsonb) TO %s',
                                      r.grantee);
        END IF;
    END LOOP;
END
$$;
