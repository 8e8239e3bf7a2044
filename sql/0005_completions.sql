-- pgtaskd schema, version 5: completion notifications and idempotent enqueue.
--
-- Completions. Every commit that makes tasks terminal also sends `NOTIFY pgtaskd_done` with
-- the ids of those tasks, comma-separated, in the same transaction: the notification arrives
-- only if the change committed. PostgreSQL refuses payloads of 8000 bytes or more, so the ids
-- are split over as many notifications as they need. A notification is a hint: whoever waits
-- for a task LISTENs first, then reads the row, then reads it again on each notification or
-- on a poll tick of its own. It reveals task ids only, to every role that can LISTEN.
--
-- Idempotent enqueue. A nullable `idempotency_key`, unique per queue where set (a partial
-- unique index, so `INSERT ... ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS
-- NOT NULL DO NOTHING` works). `pgtaskd.enqueue(..., idempotency_key => 'k')` returns the
-- existing task's id when the key is taken, for as long as that row exists.

-- Send the ids as `pgtaskd_done` notifications of fewer than 8000 bytes each. A group holds
-- the ids whose running length (id and comma) ends in the same 7900-byte window, so each
-- group is shorter than 7900 + the longest id (20 bytes with its comma).
CREATE FUNCTION pgtaskd.notify_done(ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgtaskd_done', string_agg(s.id::text, ',' ORDER BY s.n))
       FROM (SELECT u.id, u.n,
                    sum(length(u.id::text) + 1) OVER (ORDER BY u.n) AS reach
               FROM unnest(notify_done.ids) WITH ORDINALITY AS u(id, n)
              WHERE u.id IS NOT NULL) AS s
      GROUP BY s.reach / 7900;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.notify_done(bigint[]) FROM PUBLIC;

ALTER TABLE pgtaskd.tasks ADD COLUMN idempotency_key text;

CREATE UNIQUE INDEX tasks_idempotency_key_idx ON pgtaskd.tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The finish of version 4, every guard kept, now also notifying the tasks it ended: one
-- notification (split by size) per call, however many rows it wrote.
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
         WHERE t.id = f.id
           -- Found by primary key: the status test is written so that it cannot steer the
           -- lookup to the partial index of RUNNING rows.
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

-- The cancel of version 4, now notifying a QUEUED task it ends.
CREATE OR REPLACE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pgtaskd.tasks SET status = 'CANCELED', cancel_requested = true, finished_at = now()
     WHERE id = task_id AND status = 'QUEUED'
    RETURNING 'QUEUED', status INTO previous, current;
    IF FOUND THEN
        PERFORM pgtaskd.notify_done(ARRAY[task_id]);
        RETURN;
    END IF;

    UPDATE pgtaskd.tasks SET cancel_requested = true
     WHERE id = task_id AND status = 'RUNNING'
    RETURNING 'RUNNING', status INTO previous, current;
    IF FOUND THEN
        PERFORM pg_notify('pgtaskd_cancel', task_id::text);
        RETURN;
    END IF;

    SELECT status, status INTO previous, current FROM pgtaskd.tasks WHERE id = task_id;
END
$$;

-- Enqueue with an idempotency key. The five-argument function is replaced (a sixth argument
-- with a default beside it would make every shorter call ambiguous): the new one is created,
-- granted to the roles that could execute the old one, and the old one dropped.
-- Returns the new task's id, or the id of the task of this queue that already has the key
-- (whatever its payload: compare it yourself when that matters). A concurrent enqueue with
-- the same key waits for the first to commit or roll back, then returns its id or inserts.
CREATE FUNCTION pgtaskd.enqueue(
    payload         text,
    queue           text        DEFAULT 'default',
    priority        int         DEFAULT 0,
    run_at          timestamptz DEFAULT now(),
    max_attempts    int         DEFAULT 3,
    idempotency_key text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    found_id bigint;
BEGIN
    IF enqueue.idempotency_key IS NULL THEN
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts)
        VALUES (enqueue.payload, enqueue.queue, enqueue.priority::smallint, enqueue.run_at,
                enqueue.max_attempts)
        RETURNING id INTO found_id;
        RETURN found_id;
    END IF;
    -- The keyed row may be deleted (retention) between the conflict and the read: try again.
    FOR attempt IN 1..3 LOOP
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts, idempotency_key)
        VALUES (enqueue.payload, enqueue.queue, enqueue.priority::smallint, enqueue.run_at,
                enqueue.max_attempts, enqueue.idempotency_key)
        ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id INTO found_id;
        IF found_id IS NOT NULL THEN
            RETURN found_id;
        END IF;
        SELECT t.id INTO found_id
          FROM pgtaskd.tasks AS t
         WHERE t.queue = enqueue.queue AND t.idempotency_key = enqueue.idempotency_key;
        IF found_id IS NOT NULL THEN
            RETURN found_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idempotency key % of queue % is taken by a task this transaction cannot see',
        enqueue.idempotency_key, enqueue.queue
        USING ERRCODE = 'serialization_failure';
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text) FROM PUBLIC;

DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.enqueue(text, text, int, timestamptz, int)'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, '
                       'int, text) TO %I', grantee::regrole);
    END LOOP;
    -- Roles that may insert a payload may set its key.
    FOR grantee IN
        SELECT a.grantee
          FROM pg_attribute AS c, pg_class AS t, aclexplode(c.attacl) AS a
         WHERE t.oid = 'pgtaskd.tasks'::regclass
           AND c.attrelid = t.oid
           AND c.attname = 'payload'
           AND a.privilege_type = 'INSERT'
           AND a.grantee <> t.relowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT INSERT (idempotency_key) ON pgtaskd.tasks TO %I', grantee::regrole);
    END LOOP;
    -- Roles that can finish (daemons) send completions from the rescuer and the release.
    FOR grantee IN
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[])'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.notify_done(bigint[]) TO %I',
                       grantee::regrole);
    END LOOP;
END
$$;

DROP FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int);

CREATE OR REPLACE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8), '
                   'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint), '
                   'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[]), '
                   'pgtaskd.notify_done(bigint[]) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;
