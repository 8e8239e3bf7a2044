-- pgtaskd schema, version 4: a claim bounded in payload bytes, and CANCELED only where a
-- cancel was requested.
--
-- Bytes. A claim used to take up to `max_tasks` rows whatever their payloads weighed, so a
-- daemon could hold gigabytes of text it could not start. `pgtaskd.claim` now also takes
-- `max_bytes`: it stops adding rows, in claim order, once their payloads (octet_length, read
-- from the row or its TOAST pointer without loading the text) would pass that sum. With
-- `take_one` the first row is taken whatever its size, so a payload larger than the whole
-- budget still runs. When rows were left for the budget alone, one last row with a null
-- `task_id` carries the size of the first row left, so that the daemon knows to claim again
-- once it holds fewer bytes, rather than wait for the next poll. A payload larger than
-- `max_payload` (null: no limit) is claimed without its text: `task_payload` is null and the
-- daemon finishes it FAILED without ever loading it.
--
-- Cancel. Notifications are only hints, and any role may send one: a CANCELED row must come
-- from a cancel request recorded in the row. A cancel of a QUEUED task now sets
-- `cancel_requested` too, rows canceled under earlier versions get it, and a table constraint
-- makes CANCELED without it impossible. The finish refuses a CANCELED outcome for a row whose
-- cancel was not requested (it stays RUNNING, and the caller learns it is not the claim's to
-- end that way).
--
-- The schema-3 claim stays, so that daemons of the previous version keep running until they
-- are restarted (they refuse a newer schema at start).

CREATE FUNCTION pgtaskd.claim(
    queues      text[],
    max_tasks   bigint,
    owner       text,
    lease_ms    float8,
    max_bytes   bigint,
    take_one    boolean,
    max_payload bigint
) RETURNS TABLE (task_id bigint, task_attempt int, task_payload text, task_bytes bigint,
                 waited_s float8)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH candidates AS MATERIALIZED (
        SELECT c.id, c.priority, c.size
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                SELECT k.id, k.priority, octet_length(k.payload)::bigint AS size
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         ORDER BY c.priority DESC, c.id
         LIMIT claim.max_tasks
    ), sized AS MATERIALIZED (
        -- A payload that will not be loaded weighs nothing in the budget.
        SELECT s.id, s.size,
               row_number() OVER w AS n,
               sum(CASE WHEN s.size > claim.max_payload THEN 0 ELSE s.size END) OVER w AS running
          FROM candidates AS s
        WINDOW w AS (ORDER BY s.priority DESC, s.id)
    ), picked AS MATERIALIZED (
        SELECT z.id FROM sized AS z
         WHERE z.running <= claim.max_bytes OR (claim.take_one AND z.n = 1)
    ), claimed AS (
        UPDATE pgtaskd.tasks AS t
           SET status = 'RUNNING',
               attempt = t.attempt + 1,
               lease_owner = claim.owner,
               lease_expires_at = now() + claim.lease_ms * interval '1 millisecond',
               started_at = now()
         WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
           -- The re-check, written so that it cannot steer the row lookup to a partial
           -- index (stale statistics make those look tiny): the rows are found by primary key.
           AND coalesce(t.status, '') = 'QUEUED'
        RETURNING t.id, t.attempt, t.priority,
                  CASE WHEN octet_length(t.payload) > claim.max_payload THEN NULL
                       ELSE t.payload END AS payload,
                  octet_length(t.payload)::bigint AS size,
                  extract(epoch FROM now() - greatest(t.created_at, t.run_at))::float8 AS waited
    )
    -- In claim order, which is the order the daemon starts them in; then the row that says
    -- the budget left some out.
    (SELECT claimed.id, claimed.attempt, claimed.payload, claimed.size, claimed.waited
       FROM claimed
      ORDER BY claimed.priority DESC, claimed.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1);
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint)
    FROM PUBLIC;

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

UPDATE pgtaskd.tasks SET cancel_requested = true
 WHERE status = 'CANCELED' AND NOT cancel_requested;

ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_canceled_only_when_requested
        CHECK (status <> 'CANCELED' OR cancel_requested);

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
    )
    SELECT f.id, d.status,
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.tasks AS c WHERE c.id = f.id) END
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id;
END
$$;

-- Roles already granted the daemon's rights (they can execute the finish) get the new claim.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[])'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, '
                       'bigint, boolean, bigint) TO %I', grantee::regrole);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8), '
                   'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint), '
                   'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[]) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;
