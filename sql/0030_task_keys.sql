-- pgtaskd schema, version 30: what a handler is told. A key that stays the same for every
-- attempt of a task, a count of the task's runs that never goes back, and every failed
-- attempt's error.
--
-- Handlers were given the claim's token as their idempotency key: unique per claim, so a
-- task whose first attempt failed, or whose lease was lost, ran its side effects again under
-- a new key. The task's key is now `<site>-<id>-<created>`: the database's own random id
-- (`pgtaskd.site`, made once here, so that two databases' task 7 differ), the task's id, and
-- its insert time in microseconds (after a failover that lost the old primary's last
-- commits an id can name two tasks; their insert times differ). It is the same for every
-- claim of the task, and `pgtaskd.task_view` shows it as `task_key` (docs/handlers.md, "What
-- a handler is told").
--
-- `attempt` goes back when a shutdown gives a claim back (a release uses no attempt up), so
-- a handler could not tell a re-run from a first run. `runs` counts every start of the
-- task's work, set by the claim, never lowered (a retry resets `attempt`, not `runs`).
-- `errors` keeps the last ten failed attempts' errors (a finish's failure, a lost lease),
-- each at most 2,000 characters, with its attempt, run and time; `error` stays the last.
--
-- The claim returns the run, the key, the producer's idempotency key and the trace context
-- (read by a second statement until now): its result changes, so it is dropped and created
-- again with the grants it had. Stop the daemons before applying it (docs/upgrading.md,
-- "Schema 30"): a daemon of an earlier release refuses the schema.

-- The database's own id: one row, made here, readable by everyone (it is no secret: it
-- tells one database's task keys from another's).
CREATE TABLE pgtaskd.site (
    id         text        PRIMARY KEY
                           DEFAULT pg_catalog.substr(pg_catalog.md5(pg_catalog.random()::text
                               OPERATOR(pg_catalog.||) pg_catalog.clock_timestamp()::text
                               OPERATOR(pg_catalog.||) pg_catalog.pg_backend_pid()::text), 1, 16),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE UNIQUE INDEX site_one_row ON pgtaskd.site ((true));
COMMENT ON TABLE pgtaskd.site IS
    'pgtaskd: this database''s own random id, the first part of every task key (one row)';
GRANT SELECT ON pgtaskd.site TO PUBLIC;
INSERT INTO pgtaskd.site DEFAULT VALUES;

-- The site id is never changed or deleted: every task's key is made of it.
CREATE FUNCTION pgtaskd.keep_site() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'pgtaskd.site is not changed or deleted: its id is the first part of every task key'
        USING ERRCODE = '42501';
END
$$;
CREATE TRIGGER site_kept BEFORE UPDATE OR DELETE ON pgtaskd.site
    FOR EACH ROW EXECUTE FUNCTION pgtaskd.keep_site();
CREATE TRIGGER site_kept_whole BEFORE TRUNCATE ON pgtaskd.site
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.keep_site();
REVOKE ALL ON FUNCTION pgtaskd.keep_site() FROM PUBLIC;

ALTER TABLE pgtaskd.tasks
    ADD COLUMN runs int NOT NULL DEFAULT 0,
    ADD COLUMN errors jsonb;
COMMENT ON COLUMN pgtaskd.tasks.runs IS
    'How many times the task''s work was started (every claim; never lowered, not even by a retry).';
COMMENT ON COLUMN pgtaskd.tasks.errors IS
    'The last ten failed attempts: [{"attempt", "run", "at", "error"}], oldest first; each error at most 2,000 characters.';

-- `history` with the failure of attempt `attempt` (run `run`) appended, the last ten kept.
-- A history that is not an array (written by hand) starts again.
CREATE FUNCTION pgtaskd.error_history(history jsonb, attempt int, run int, error text)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(jsonb_agg(e.entry ORDER BY e.n), '[]'::jsonb)
      FROM (SELECT h.entry, h.n
              FROM jsonb_array_elements(
                       CASE WHEN jsonb_typeof(error_history.history) = 'array'
                            THEN error_history.history ELSE '[]'::jsonb END
                       || jsonb_build_array(jsonb_build_object(
                              'attempt', error_history.attempt,
                              'run', error_history.run,
                              'at', now(),
                              -- Its head (what failed) and its tail (where stderr ends).
                              'error', CASE WHEN char_length(error_history.error) <= 2000
                                            THEN coalesce(error_history.error, '')
                                            ELSE left(error_history.error, 500) || ' … '
                                                 || right(error_history.error, 1497) END)))
                   WITH ORDINALITY AS h(entry, n)
             ORDER BY h.n DESC
             LIMIT 10) AS e
$$;


-- The view gains the key, the runs and the errors, after its columns of version 24.
CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT t.id, t.queue, t.payload, t.status, t.priority, t.run_at, t.attempt, t.max_attempts,
       t.cancel_requested, t.words, t.bytes, t.runes, t.error, t.lease_owner,
       t.lease_expires_at, t.created_at, t.started_at, t.finished_at, t.idempotency_key,
       t.claim_token, t.output, t.traceparent,
       coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || t.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       t.runs, t.errors
  FROM pgtaskd.tasks AS t;

-- The claim, returning what the handler is told; the grants it had are kept.
DO $$
BEGIN
    CREATE TEMPORARY TABLE claim_grantees_30 ON COMMIT DROP AS
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint)'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0;
END
$$;
DROP FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint);

-- Version 29's claim, with the run, the key, the producer's key and the trace context.
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
                 task_key text, task_idempotency_key text, task_traceparent text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- Flushed before the daemon runs the work (version 25): with `synchronous_commit = off` a
    -- crash could lose a claim already answered, and the sequence's last values with it, and
    -- the same task would be claimed again under the same token. `local`, not `on`: a daemon
    -- whose server waits for a synchronous standby that is not there commits with `local`,
    -- and so must its claims.
    IF pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    END IF;
    RETURN QUERY
    WITH candidates AS MATERIALIZED (
        -- No position (either half null) is before every task: all of it is "the lower
        -- priorities" below (a smallint priority is always under 32768), read from the
        -- start of the queue.
        SELECT c.id, c.priority, c.size
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                -- After the position: the rest of its priority...
                SELECT k.id, k.priority, octet_length(k.payload)::bigint AS size
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority = claim.after_priority
                   AND k.id > claim.after_id
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
        UNION ALL
        SELECT c.id, c.priority, c.size
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                -- ...then the lower priorities.
                SELECT k.id, k.priority, octet_length(k.payload)::bigint AS size
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority < CASE WHEN claim.after_id IS NULL THEN 32768
                                         ELSE coalesce(claim.after_priority, 32768) END
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
         ORDER BY 2 DESC, 1
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
               -- Every start of the task's work, never given back (version 30); a row from
               -- before version 30 counts from its attempts.
               runs = greatest(t.runs, t.attempt) + 1,
               -- The server's timeline above the sequence's value (version 25): a new
               -- primary's sequence may be behind the old one's after a failover.
               claim_token = (SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN 0::bigint
                                          ELSE ((('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(
                                                    pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                                                 - 1) % 65536) << 47 END)
                             | (pg_catalog.nextval('pgtaskd.claim_tokens') & 140737488355327),
               lease_owner = claim.owner,
               lease_expires_at = now() + claim.lease_ms * interval '1 millisecond',
               started_at = now()
         WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
           -- Found by primary key, never through a partial index (see version 4).
           AND coalesce(t.status, '') = 'QUEUED'
        RETURNING t.id, t.attempt, t.priority, t.claim_token,
                  CASE WHEN octet_length(t.payload) > claim.max_payload THEN NULL
                       ELSE t.payload END AS payload,
                  octet_length(t.payload)::bigint AS size,
                  extract(epoch FROM now() - greatest(t.created_at, t.run_at))::float8 AS waited,
                  t.runs,
                  -- The task's key, as `pgtaskd.task_view` spells it (version 30).
                  coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || t.id || '-'
                      || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
                  t.idempotency_key, t.traceparent
    )
    (SELECT claimed.id, claimed.attempt, claimed.payload, claimed.size, claimed.waited,
            claimed.priority::int, claimed.claim_token, claimed.runs, claimed.task_key,
            claimed.idempotency_key, claimed.traceparent
       FROM claimed
      ORDER BY claimed.priority DESC, claimed.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8, NULL::int, NULL::bigint,
            NULL::int, NULL::text, NULL::text, NULL::text
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1);
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint) FROM PUBLIC;
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN SELECT g.grantee FROM claim_grantees_30 AS g
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, '
                       'bigint, boolean, bigint, int, bigint) TO %s', grantee::regrole);
    END LOOP;
END
$$;

-- The finish and the rescue keep every failed attempt's error.
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
BEGIN
    RETURN QUERY
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
            SELECT k.id FROM pgtaskd.tasks AS k
             WHERE NOT finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE SKIP LOCKED) AS h
        UNION ALL
        -- ...or, asked to wait, every one of them.
        SELECT w.id FROM (
            SELECT k.id FROM pgtaskd.tasks AS k
             WHERE finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE) AS w
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           -- Tried again: a failed attempt with a delay, attempts left, no cancel.
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED'
                             WHEN f.status = 'FAILED' AND f.retry_in IS NOT NULL
                                  AND t.attempt < t.max_attempts THEN 'QUEUED'
                             ELSE f.status END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.runes END,
               output = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.output END,
               error = CASE WHEN t.cancel_requested OR f.status <> 'FAILED' THEN NULL ELSE f.error END,
               -- Every failed attempt's error, the last ten (version 30).
               errors = CASE WHEN t.cancel_requested OR f.status <> 'FAILED' THEN t.errors
                             ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs, f.error) END,
               run_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                  AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
                             THEN now() + f.retry_in * interval '1 second' ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
                                  THEN NULL ELSE now() END
          FROM input AS f
         -- Looked up by primary key, the rows held as the index condition (version 11).
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           AND t.id = f.id
           -- Written so that it cannot steer the lookup to the partial index of RUNNING rows.
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = f.token
           -- Only a recorded cancel request ends a task CANCELED.
           AND (f.status <> 'CANCELED' OR t.cancel_requested)
        RETURNING t.id, t.status
    ), notified AS (
        -- One row whatever `done` holds (an aggregate); volatile, so evaluated once, after
        -- every row of `done` was written. A task QUEUED again has not ended.
        SELECT pgtaskd.notify_done(array_agg(done.id)) AS sent FROM done
         WHERE done.status <> 'QUEUED'
    )
    SELECT f.id, d.status,
           -- What a finish that wrote nothing found, as the row stands (not locked).
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.tasks AS c WHERE c.id = f.id) END,
           -- Skipped: not written, not held, and still this claim's.
           d.id IS NULL
             AND NOT (f.id = ANY (ARRAY(SELECT held.id FROM held)))
             AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS c
                          WHERE c.id = f.id AND c.claim_token = f.token
                            AND coalesce(c.status, '') = 'RUNNING')
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id
     CROSS JOIN notified;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.rescue(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_attempt int, task_previous_owner text, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT k.id, k.attempt, k.claim_token, k.lease_owner
          FROM pgtaskd.tasks AS k
         WHERE k.status = 'RUNNING' AND k.lease_expires_at < now()
           AND k.lease_owner IS DISTINCT FROM rescue.owner
           -- A result is parked for this claim (version 28).
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.parked_results AS p
                            WHERE p.task_id = k.id AND p.claim_token = k.claim_token)
         ORDER BY k.lease_expires_at
         LIMIT rescue.max_tasks
           FOR UPDATE SKIP LOCKED
    ), rescued AS (
        UPDATE pgtaskd.tasks AS t
           SET status = CASE
                   WHEN t.cancel_requested THEN 'CANCELED'
                   WHEN t.attempt < t.max_attempts THEN 'QUEUED'
                   ELSE 'FAILED'
               END,
               error = CASE
                   WHEN NOT t.cancel_requested AND t.attempt >= t.max_attempts
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
                   WHEN NOT t.cancel_requested AND t.attempt < t.max_attempts
                   THEN now() + least(power(t.attempt - 1, 2), 600) * interval '1 second'
                   ELSE t.run_at
               END,
               finished_at = CASE
                   WHEN t.cancel_requested OR t.attempt >= t.max_attempts THEN now()
               END,
               lease_owner = NULL,
               lease_expires_at = NULL
          FROM expired
         WHERE t.id = expired.id
           AND t.status = 'RUNNING'
           AND t.claim_token IS NOT DISTINCT FROM expired.claim_token
           AND t.lease_expires_at < now()
        RETURNING t.id, expired.attempt, expired.lease_owner, t.status
    ), notified AS (
        SELECT pgtaskd.notify_done(array_agg(r.id)) AS sent
          FROM rescued AS r WHERE r.status <> 'QUEUED'
    )
    SELECT r.id, r.attempt, r.lease_owner, r.status
      FROM rescued AS r CROSS JOIN notified;
END
$$;
