-- pgtaskd schema, version 39: batches with a callback, and handlers' progress
-- (docs/dependencies.md, "Batches"; docs/handlers.md, "Progress").
--
-- Batches: `pgtaskd.open_batch` makes a callback task, WAITING, and a row of `pgtaskd.batches`;
-- producers insert members with `batch_id` until `pgtaskd.seal_batch`. The callback is
-- released (QUEUED, or CANCELED under 'success' when a member did not succeed) exactly once,
-- in the transaction that commits the end of the batch's last member after the seal, or the
-- seal itself; every function that ends a task calls `pgtaskd.end_batches` through
-- `pgtaskd.end_parents`. No row is written per member beyond the member itself: most ends hold
-- another member still running (FOR SHARE) and leave the decision to it; the others lock the
-- batch's row and read what has committed. No periodic pass ends a batch.
--
-- Progress: `task_state.progress` (a JSON object of at most 4 KiB, never cleared) and
-- `progress_at`, written by `pgtaskd.write_progress` fenced on the claim token; the claim
-- answers it to the next attempt.
--
-- The claim answers three more columns (the progress, the batch, a callback's counts): daemons
-- of schema 38 read the columns they know and go on, but tell their handlers nothing of them.
-- Locks: `ACCESS EXCLUSIVE` on `pgtaskd.tasks` and `pgtaskd.task_state` for the new columns
-- (no rewrite, no scan: the new CHECKs are NOT VALID).

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

ALTER TABLE pgtaskd.tasks
    ADD COLUMN batch_id bigint;

ALTER TABLE pgtaskd.task_state
    ADD COLUMN batch_id bigint,
    ADD COLUMN callback_of bigint,
    ADD COLUMN progress jsonb,
    ADD COLUMN progress_at timestamptz,
    DROP CONSTRAINT tasks_error_when_failed;
-- An error on every FAILED row, none on SUCCEEDED or CANCELED rows (but those a parent's
-- failure canceled, which name it, and batch callbacks canceled by their batch's failures),
-- the last failed attempt's (or none) on QUEUED and RUNNING rows. NOT VALID as before.
ALTER TABLE pgtaskd.task_state
    ADD CONSTRAINT tasks_error_when_failed
        CHECK ((status OPERATOR(pg_catalog.<>) 'FAILED' OR error IS NOT NULL)
               AND (error IS NULL OR status OPERATOR(pg_catalog.=) ANY (ARRAY['FAILED', 'QUEUED', 'RUNNING'])
                    OR (status OPERATOR(pg_catalog.=) 'CANCELED'
                        AND (canceled_by IS NOT NULL OR callback_of IS NOT NULL))))
        NOT VALID;
-- Progress is a JSON object of at most 4 KiB (schema 39). NOT VALID as schema 39 added it.
ALTER TABLE pgtaskd.task_state
    ADD CONSTRAINT tasks_progress_check
        CHECK (pg_catalog.jsonb_typeof(progress) OPERATOR(pg_catalog.=) 'object'
               AND pg_catalog.octet_length(progress::text) OPERATOR(pg_catalog.<=) 4096) NOT VALID;

-- Batches (schema 39, docs/dependencies.md, "Batches"): a callback task that runs once, after
-- the batch is sealed and its last member has ended. Members are tasks with `batch_id`; no
-- row is written per member beyond the member itself. `ended_at` and the counts are written
-- once, in the transaction that ends the last member (or seals a batch whose members have all
-- ended).
CREATE TABLE pgtaskd.batches (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The callback task: WAITING until the batch ends.
    callback    bigint      NOT NULL,
    -- 'success': the callback runs only if every member SUCCEEDED, else it is CANCELED;
    -- 'finish': it runs whatever they did.
    callback_on text        NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    sealed_at   timestamptz,
    ended_at    timestamptz,
    -- The members by outcome, counted at the end.
    succeeded   bigint,
    failed      bigint,
    canceled    bigint,

    CONSTRAINT batches_callback_on CHECK (callback_on IN ('success', 'finish')),
    CONSTRAINT batches_ended_when_sealed CHECK (ended_at IS NULL OR sealed_at IS NOT NULL)
);
CREATE UNIQUE INDEX batches_callback_idx ON pgtaskd.batches (callback);
COMMENT ON TABLE pgtaskd.batches IS
    'pgtaskd: batches of tasks and their callbacks; written by pgtaskd.open_batch, pgtaskd.seal_batch and the ends of members only';

-- The members of each batch by status (schema 39): a member's end finds one still running,
-- and the batch's end counts them.
CREATE INDEX tasks_batch_idx ON pgtaskd.task_state (batch_id, status) WHERE batch_id IS NOT NULL;

-- The view, with each task's progress and batch at the end.
CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT s.id, s.queue, t.payload, s.status, s.priority, s.run_at, s.attempt,
       coalesce(s.max_attempts, pgtaskd.queue_max_attempts(s.queue)) AS max_attempts,
       s.cancel_requested, s.words, s.bytes, s.runes, s.error, s.lease_owner,
       s.lease_expires_at, t.created_at, s.started_at, s.finished_at, t.idempotency_key,
       s.claim_token, s.output, t.traceparent,
       coalesce((SELECT x.id FROM pgtaskd.site AS x), 'nosite') || '-' || s.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       s.runs, s.errors, s.snoozes, s.concurrency_key, t.depends_on, t.on_dep_failure,
       t.tags, t.metadata, s.progress, s.progress_at, t.batch_id
  FROM pgtaskd.task_state AS s
 CROSS JOIN LATERAL (SELECT x.payload, x.created_at, x.idempotency_key, x.traceparent,
                            x.depends_on, x.on_dep_failure, x.tags, x.metadata, x.batch_id
                       FROM pgtaskd.tasks AS x
                      WHERE x.id = s.id
                     OFFSET 0) AS t;

-- Open a batch (version 39, docs/dependencies.md, "Batches"): its callback task, in queue
-- `callback_queue` with `payload`, is WAITING until the batch is sealed and its last member
-- has ended; it then runs if `callback_on` is 'finish', or is 'success' and every member
-- SUCCEEDED, and is CANCELED otherwise. Answers the batch's id; members are inserted with it
-- as `batch_id`.
CREATE FUNCTION pgtaskd.open_batch(callback_queue text, callback_on text, payload text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    callback_id bigint;
    new_batch   bigint;
BEGIN
    IF open_batch.callback_on IS NULL OR open_batch.callback_on NOT IN ('success', 'finish') THEN
        RAISE EXCEPTION 'a batch''s callback runs on success or on finish, not on %',
            coalesce(open_batch.callback_on, 'null')
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO pgtaskd.tasks (queue, payload)
    VALUES (coalesce(open_batch.callback_queue, 'default'), open_batch.payload)
    RETURNING id INTO callback_id;
    INSERT INTO pgtaskd.batches (callback, callback_on)
    VALUES (callback_id, open_batch.callback_on)
    RETURNING id INTO new_batch;
    UPDATE pgtaskd.task_state AS s
       SET status = 'WAITING', callback_of = new_batch
     WHERE s.id = callback_id;
    RETURN new_batch;
END
$$;

-- Decide batch `batch_id`, whose row the caller holds locked: if it is sealed and has not
-- ended, and no member is WAITING, QUEUED or RUNNING (read after the lock: every end
-- committed before it is seen), it ends now: the members are counted by outcome, and its
-- callback is QUEUED (a daemon is woken) or CANCELED naming the counts, once.
CREATE FUNCTION pgtaskd.decide_batch(batch_id bigint) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    b           record;
    n_succeeded bigint;
    n_failed    bigint;
    n_canceled  bigint;
BEGIN
    SELECT x.id, x.callback, x.callback_on, x.sealed_at, x.ended_at INTO b
      FROM pgtaskd.batches AS x
     WHERE x.id = decide_batch.batch_id;
    IF NOT FOUND OR b.sealed_at IS NULL OR b.ended_at IS NOT NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pgtaskd.task_state AS m
                WHERE m.batch_id = b.id AND m.status IN ('WAITING', 'QUEUED', 'RUNNING')) THEN
        RETURN;
    END IF;
    -- The callback's row first: a retry or a cancel of it in flight commits before it is read
    -- below, and a retry that follows reads the batch ended.
    PERFORM 1 FROM pgtaskd.task_state AS s WHERE s.id = b.callback FOR UPDATE;
    SELECT count(*) FILTER (WHERE m.status = 'SUCCEEDED'),
           count(*) FILTER (WHERE m.status = 'FAILED'),
           count(*) FILTER (WHERE m.status = 'CANCELED')
      INTO n_succeeded, n_failed, n_canceled
      FROM pgtaskd.task_state AS m
     WHERE m.batch_id = b.id;
    UPDATE pgtaskd.batches AS x
       SET ended_at = now(), succeeded = n_succeeded, failed = n_failed, canceled = n_canceled
     WHERE x.id = b.id;
    IF b.callback_on = 'finish' OR (n_failed = 0 AND n_canceled = 0) THEN
        UPDATE pgtaskd.task_state AS s
           SET status = 'QUEUED', run_at = greatest(s.run_at, now())
         WHERE s.id = b.callback AND coalesce(s.status, '') = 'WAITING';
        IF FOUND THEN
            PERFORM pgtaskd.notify('pgtaskd_tasks', '');
        END IF;
    ELSE
        UPDATE pgtaskd.task_state AS s
           SET status = 'CANCELED',
               cancel_requested = true,
               error = format('batch %s: %s of its %s members failed and %s were canceled',
                              b.id, n_failed, n_succeeded + n_failed + n_canceled, n_canceled),
               finished_at = now()
         WHERE s.id = b.callback AND coalesce(s.status, '') = 'WAITING';
        IF FOUND THEN
            PERFORM pgtaskd.notify_done(ARRAY[b.callback]);
            PERFORM pgtaskd.end_parents(ARRAY[b.callback]);
        END IF;
    END IF;
END
$$;

-- The tasks `ended` ended in this transaction (called by `pgtaskd.end_parents`, so by every
-- function that ends a task): decide each batch one of them was a member of. Most ends are
-- not their batch's last: a batch with another member QUEUED or RUNNING, held here (FOR
-- SHARE, passing over rows another transaction holds) so that it cannot end before this
-- commit, is left to that member's end, which will see this one. Otherwise the batch's row is
-- locked (FOR NO KEY UPDATE, in id order: producers adding members hold FOR KEY SHARE, which
-- does not wait for it; a seal holds FOR UPDATE) and the batch is decided from what has
-- committed (`pgtaskd.decide_batch`). No periodic pass ends a batch.
CREATE FUNCTION pgtaskd.end_batches(ended bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    open_ids bigint[];
    b        bigint;
BEGIN
    -- Read by primary key (the filter, not the condition, names `batch_id`: the index of
    -- members would read every member of every batch).
    SELECT array_agg(DISTINCT s.batch_id)
               FILTER (WHERE s.batch_id IS NOT NULL
                         AND s.status IN ('SUCCEEDED', 'FAILED', 'CANCELED'))
      INTO open_ids
      FROM pgtaskd.task_state AS s
     WHERE s.id = ANY (end_batches.ended);
    IF open_ids IS NULL THEN
        RETURN;
    END IF;
    open_ids := ARRAY(
        SELECT x.id FROM unnest(open_ids) AS x(id)
         WHERE NOT EXISTS (SELECT 1
                             FROM (SELECT m.id
                                     FROM pgtaskd.task_state AS m
                                    WHERE m.batch_id = x.id
                                      AND m.status IN ('QUEUED', 'RUNNING')
                                    LIMIT 1
                                      FOR SHARE OF m SKIP LOCKED) AS h)
         ORDER BY x.id);
    IF cardinality(open_ids) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM pgtaskd.batches AS x
      WHERE x.id = ANY (open_ids) AND x.ended_at IS NULL
      ORDER BY x.id
        FOR NO KEY UPDATE;
    FOREACH b IN ARRAY open_ids LOOP
        PERFORM pgtaskd.decide_batch(b);
    END LOOP;
END
$$;

-- Seal batch `batch_id`: no member can join it any more, and it ends once its last member
-- has ended (at once if they all have). Waits for the producers still adding members (their
-- FOR KEY SHARE), so that each member they commit is counted. Answers the batch's state after:
-- 'sealed' or 'ended'. Sealing a sealed batch changes nothing.
CREATE FUNCTION pgtaskd.seal_batch(batch_id bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    sealed timestamptz;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a batch is sealed only in a READ COMMITTED transaction (this one is %): its end is decided from what has committed',
            pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = '0A000',
                  HINT = 'Seal it in a transaction of its own, or SET TRANSACTION ISOLATION LEVEL READ COMMITTED first.';
    END IF;
    SELECT x.sealed_at INTO sealed
      FROM pgtaskd.batches AS x
     WHERE x.id = seal_batch.batch_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % does not exist', seal_batch.batch_id
            USING ERRCODE = 'P0002';
    END IF;
    IF sealed IS NULL THEN
        UPDATE pgtaskd.batches AS x SET sealed_at = now() WHERE x.id = seal_batch.batch_id;
    END IF;
    PERFORM pgtaskd.decide_batch(seal_batch.batch_id);
    RETURN (SELECT CASE WHEN x.ended_at IS NULL THEN 'sealed' ELSE 'ended' END
              FROM pgtaskd.batches AS x
             WHERE x.id = seal_batch.batch_id);
END
$$;

-- Write handlers' progress (version 39, docs/handlers.md): for each task `ids[i]` still
-- RUNNING under the claim `tokens[i]`, `progress[i]` (a JSON object of at most 4 KiB), passing
-- over rows another transaction holds (a flush never waits; the next one tries again). Answers
-- the ids written. A write from a claim that is no longer current changes nothing; progress is
-- never cleared, so the next attempt reads what the last one wrote.
CREATE FUNCTION pgtaskd.write_progress(ids bigint[], tokens bigint[], progress jsonb[])
RETURNS TABLE (task_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT DISTINCT ON (u.id) u.id, u.token, u.progress
          FROM unnest(write_progress.ids, write_progress.tokens, write_progress.progress)
               AS u(id, token, progress)
         ORDER BY u.id
    ), held AS MATERIALIZED (
        SELECT k.id FROM pgtaskd.task_state AS k
         WHERE k.id = ANY (write_progress.ids)
         ORDER BY k.id
           FOR NO KEY UPDATE SKIP LOCKED
    ), written AS (
        UPDATE pgtaskd.task_state AS t
           SET progress = i.progress, progress_at = now()
          FROM input AS i
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           AND t.id = i.id
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = i.token
           AND jsonb_typeof(i.progress) = 'object'
           AND octet_length(i.progress::text) <= 4096
        RETURNING t.id
    )
    SELECT written.id FROM written;
END
$$;

-- settle_waiting answers the tasks its cascade canceled, so that the batches are decided once.
DROP FUNCTION pgtaskd.settle_waiting(bigint[], bigint[]);

-- The tasks `ended` ended in this transaction: decide for each task waiting on one of them
-- (`pgtaskd.settle_waiting`). Called by every function that ends a task, after its write: the
-- finish (and so the parked results' write), the rescue, a cancel and a release.
CREATE OR REPLACE FUNCTION pgtaskd.end_parents(ended bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    children  bigint[];
    all_ended bigint[];
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
        -- With the tasks its cascade canceled (version 39).
        all_ended := end_parents.ended || pgtaskd.settle_waiting(children, end_parents.ended);
    END IF;
    -- The batches they were members of, each row locked once, in id order (version 39).
    PERFORM pgtaskd.end_batches(coalesce(all_ended, end_parents.ended));
END
$$;

-- Decide what the ends of parents `parents` (null: of every parent that has ended) make of
-- the WAITING tasks `children`, in the transaction that commits those ends: an edge to a
-- parent that SUCCEEDED is gone; one to a parent that FAILED or was CANCELED is gone under
-- `on_dep_failure` 'run', stays under 'wait' (until a retry of the parent ends it), and under
-- 'cancel' (unset) cancels the child, naming the parent, and then its own dependents, all in
-- this transaction. A child no edge holds any more is QUEUED and a daemon is woken. No
-- periodic pass releases anything ("Released in the parent's commit").
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
            RETURN '{}';
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

-- At the producer's commit, each new task with parents (version 37): its parents are held
-- (FOR SHARE, in id order) until that commit, so that an end of one of them either committed
-- before (and is decided here, as `pgtaskd.settle_waiting` decides it) or waits for this
-- commit and then finds the task's edges. A parent deleted meanwhile fails the commit.
CREATE OR REPLACE FUNCTION pgtaskd.tasks_deps_settle() RETURNS trigger
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
    PERFORM pgtaskd.end_batches(pgtaskd.settle_waiting(ARRAY[NEW.id], NULL));
    RETURN NULL;
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
    -- A member of a batch that has not ended stays (version 39): the batch's end counts it.
    SELECT o.id, o.batch_id INTO held
      FROM gone_tasks AS o
      JOIN pgtaskd.batches AS b ON b.id OPERATOR(pg_catalog.=) o.batch_id
     WHERE b.ended_at IS NULL
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'task % cannot be deleted: it is a member of batch %, which has not ended', held.id, held.batch_id
            USING ERRCODE = '23503',
                  HINT = 'Seal the batch and let its members end (or cancel them) first.';
    END IF;
    SELECT o.id, b.id AS batch_id INTO held
      FROM gone_tasks AS o
      JOIN pgtaskd.batches AS b ON b.callback OPERATOR(pg_catalog.=) o.id
     WHERE b.ended_at IS NULL
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'task % cannot be deleted: it is the callback of batch %, which has not ended', held.id, held.batch_id
            USING ERRCODE = '23503',
                  HINT = 'Seal the batch and let its members end (or cancel them) first.';
    END IF;
    DELETE FROM pgtaskd.task_deps AS d
     WHERE d.child OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o));
    -- An ended batch goes with its callback.
    DELETE FROM pgtaskd.batches AS b
     WHERE b.callback OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o))
       AND b.ended_at IS NOT NULL;
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
    TRUNCATE pgtaskd.task_state, pgtaskd.task_deps, pgtaskd.batches;
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
    IF NEW.batch_id IS DISTINCT FROM OLD.batch_id THEN
        RAISE EXCEPTION 'the batch of a task does not change (task %)', OLD.id
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
           -- Never a member of a batch that has not ended (version 39): its end counts it.
           AND (k.batch_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                                WHERE b.id = k.batch_id AND b.ended_at IS NULL))
           -- Nor the callback of one (canceled by hand): the batch's end looks for it.
           AND (k.callback_of IS NULL
                OR NOT EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                                WHERE b.id = k.callback_of AND b.ended_at IS NULL))
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

-- An auditor for tests and operators: one row for every inconsistency of the dependency
-- edges it finds, in one snapshot; it repairs nothing. Empty is the only right answer.
CREATE OR REPLACE FUNCTION pgtaskd.check_deps()
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
       -- A batch's callback waits for its batch, not for edges (version 39).
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                        WHERE b.id = s.callback_of AND b.ended_at IS NULL)
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
    UNION ALL
    -- A batch whose end was missed: sealed, every member ended, and not ended (version 39).
    SELECT b.callback, format('batch %s is sealed and its members have ended, but it has not ended', b.id)
      FROM pgtaskd.batches AS b
     WHERE b.sealed_at IS NOT NULL AND b.ended_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS m
                        WHERE m.batch_id = b.id AND m.status IN ('WAITING', 'QUEUED', 'RUNNING'))
    UNION ALL
    -- A callback left waiting by its batch's end, or let go before it.
    SELECT s.id, format('the callback of batch %s is %s, but the batch %s', b.id, s.status,
                        CASE WHEN b.ended_at IS NULL THEN 'has not ended' ELSE 'has ended' END)
      FROM pgtaskd.batches AS b
      JOIN pgtaskd.task_state AS s ON s.id = b.callback
     WHERE (b.ended_at IS NOT NULL AND s.status = 'WAITING')
        OR (b.ended_at IS NULL AND s.status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED'))
    UNION ALL
    -- A batch that ended without counting every member (members retried after the end
    -- change their outcome, and retention takes some: neither adds one).
    SELECT b.callback, format('batch %s counted %s members, but has %s',
                              b.id, b.succeeded + b.failed + b.canceled, m.n)
      FROM pgtaskd.batches AS b
     CROSS JOIN LATERAL (SELECT count(*) AS n FROM pgtaskd.task_state AS x
                          WHERE x.batch_id = b.id) AS m
     WHERE b.ended_at IS NOT NULL
       AND m.n > b.succeeded + b.failed + b.canceled
$$;

-- Tasks `ids` just put back to QUEUED by a retry: those with parents wait again for each
-- parent that has not SUCCEEDED (WAITING), and are then decided as at their insert. The
-- parents are held first (FOR SHARE, in id order), so that a parent ending meanwhile either
-- has ended before (and reads so) or waits for this commit and then finds the edges.
CREATE OR REPLACE FUNCTION pgtaskd.wait_again(ids bigint[]) RETURNS void
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
        -- The batches of the tasks it canceled (version 39).
        PERFORM pgtaskd.end_batches(pgtaskd.settle_waiting(waiting, NULL));
    END IF;
    -- A batch's callback brought back before its batch has ended waits for it again (version
    -- 39): the batch's end releases it.
    UPDATE pgtaskd.task_state AS s
       SET status = 'WAITING'
     WHERE s.id = ANY (wait_again.ids) AND coalesce(s.status, '') = 'QUEUED'
       AND s.callback_of IS NOT NULL
       AND EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                    WHERE b.id = s.callback_of AND b.ended_at IS NULL);
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
                   'traceparent, concurrency_key, depends_on, on_dep_failure, tags, metadata, batch_id) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
    -- Graphs of tasks (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue_graph(jsonb) TO %I', role_name);
    -- Batches: opened, sealed and read (version 39).
    EXECUTE format('GRANT SELECT ON pgtaskd.batches TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.open_batch(text, text, text), '
                   'pgtaskd.seal_batch(bigint) TO %I', role_name);
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
                   'traceparent, concurrency_key, depends_on, on_dep_failure, tags, metadata, batch_id) '
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
    -- Batches, and the handlers' progress (version 39).
    EXECUTE format('GRANT SELECT ON pgtaskd.batches TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.open_batch(text, text, text), '
                   'pgtaskd.seal_batch(bigint), '
                   'pgtaskd.write_progress(bigint[], bigint[], jsonb[]) TO %I', role_name);
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
    -- Batches: read and sealed (version 39).
    EXECUTE format('GRANT SELECT ON pgtaskd.batches TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.seal_batch(bigint) TO %I', role_name);
END
$$;

-- Before each new member of a batch (version 39): the batch must exist and not be sealed.
-- Its row is held FOR KEY SHARE until the producer's commit: a seal (FOR UPDATE) waits for
-- it, so the member is counted; the ends of other members (FOR NO KEY UPDATE) do not.
CREATE FUNCTION pgtaskd.tasks_batch_check() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    batch record;
BEGIN
    SELECT b.sealed_at, b.callback INTO batch
      FROM pgtaskd.batches AS b
     WHERE b.id OPERATOR(pg_catalog.=) NEW.batch_id
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % does not exist', NEW.batch_id
            USING ERRCODE = '23503';
    END IF;
    -- The callback waits for the member: the member cannot wait for it.
    IF batch.callback OPERATOR(pg_catalog.=) ANY (NEW.depends_on) THEN
        RAISE EXCEPTION 'a member of batch % cannot depend on its callback, task %', NEW.batch_id, batch.callback
            USING ERRCODE = '23514';
    END IF;
    IF batch.sealed_at IS NOT NULL THEN
        RAISE EXCEPTION 'batch % is sealed: no task can join it', NEW.batch_id
            USING ERRCODE = '55000',
                  HINT = 'Open another batch (pgtaskd.open_batch).';
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_batch_check() FROM PUBLIC;
CREATE TRIGGER tasks_batch_check BEFORE INSERT ON pgtaskd.tasks
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL)
    EXECUTE FUNCTION pgtaskd.tasks_batch_check();

DROP TRIGGER tasks_state_copy ON pgtaskd.tasks;
CREATE TRIGGER tasks_state_copy
    AFTER UPDATE OF id, queue, priority, run_at, max_attempts, concurrency_key, depends_on,
                    on_dep_failure, batch_id ON pgtaskd.tasks
    FOR EACH ROW
    WHEN ((OLD.id, OLD.queue, OLD.priority, OLD.run_at, OLD.max_attempts, OLD.concurrency_key,
           OLD.depends_on, OLD.on_dep_failure, OLD.batch_id)
          IS DISTINCT FROM
          (NEW.id, NEW.queue, NEW.priority, NEW.run_at, NEW.max_attempts, NEW.concurrency_key,
           NEW.depends_on, NEW.on_dep_failure, NEW.batch_id))
    EXECUTE FUNCTION pgtaskd.tasks_state_copy();

-- The claim, answering each task's progress and batch; the grants it had are kept.
DO $$
BEGIN
    CREATE TEMPORARY TABLE claim_grantees_39 ON COMMIT DROP AS
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
                 task_parents text, task_parent_count int, task_progress text,
                 task_batch bigint, task_batch_counts text)
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
                  ELSE 0 END AS parent_count,
                  -- The progress earlier attempts left, its batch, and a callback's counts
                  -- (version 39).
                  t.progress::text AS progress,
                  coalesce(t.batch_id, t.callback_of) AS batch,
                  CASE WHEN t.callback_of IS NOT NULL THEN
                      (SELECT format('succeeded=%s,failed=%s,canceled=%s',
                                     b.succeeded, b.failed, b.canceled)
                         FROM pgtaskd.batches AS b
                        WHERE b.id = t.callback_of AND b.ended_at IS NOT NULL)
                  END AS batch_counts
    ), starts AS (
        -- Each start of a rate-limited queue, for the next claims to count.
        INSERT INTO pgtaskd.queue_starts (queue, started_at)
        SELECT claimed.queue, coalesce(decided_at, now()) FROM claimed
         WHERE claimed.queue = ANY (rated)
    )
    (SELECT claimed.id, claimed.attempt, claimed.payload, claimed.size, claimed.waited,
            claimed.priority::int, claimed.claim_token, claimed.runs, claimed.task_key,
            claimed.idempotency_key, claimed.traceparent, claimed.parents,
            claimed.parent_count, claimed.progress, claimed.batch, claimed.batch_counts
       FROM claimed
      ORDER BY claimed.priority DESC, claimed.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8, NULL::int, NULL::bigint,
            NULL::int, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int,
            NULL::text, NULL::bigint, NULL::text
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1)
    UNION ALL
    SELECT NULL::bigint, NULL::int, NULL::text, NULL::bigint, again_in, NULL::int, NULL::bigint,
           NULL::int, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int,
            NULL::text, NULL::bigint, NULL::text
     WHERE again_in IS NOT NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint) FROM PUBLIC;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT g.grantee FROM claim_grantees_39 AS g LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint) TO %I',
                                  r.grantee::pg_catalog.regrole);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.open_batch(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.decide_batch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.end_batches(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.seal_batch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.write_progress(bigint[], bigint[], jsonb[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.settle_waiting(bigint[], bigint[]) FROM PUBLIC;

-- The roles granted before: producers and daemons insert members, open, seal and read
-- batches; daemons write progress; operators read and seal batches.
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
        EXECUTE pg_catalog.format('GRANT INSERT (batch_id) ON pgtaskd.tasks TO %I', r.grantee);
    END LOOP;
    FOR r IN
        SELECT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.enqueue_graph(jsonb)'::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON pgtaskd.batches TO %I', r.grantee::pg_catalog.regrole);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.open_batch(text, text, text), pgtaskd.seal_batch(bigint) TO %I',
                                  r.grantee::pg_catalog.regrole);
    END LOOP;
    FOR r IN
        SELECT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[], boolean)'::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.write_progress(bigint[], bigint[], jsonb[]) TO %I',
                                  r.grantee::pg_catalog.regrole);
    END LOOP;
    FOR r IN
        SELECT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.retry_with_dependents(bigint)'::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON pgtaskd.batches TO %I', r.grantee::pg_catalog.regrole);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtaskd.seal_batch(bigint) TO %I',
                                  r.grantee::pg_catalog.regrole);
    END LOOP;
END
$$;
