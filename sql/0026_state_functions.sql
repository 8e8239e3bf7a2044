-- pgtaskd schema, version 26: the daemon's last statements on task state become functions;
-- producers read which queues are paused.
--
-- The claim and the finish were functions already; the heartbeat, the lease extension of a
-- single claim, the rescue of expired leases, the release of a claim without a result and
-- the re-read of a claim after a commit whose outcome is unknown were statements the daemon
-- sent itself, naming the state columns of `pgtaskd.tasks`. They are now functions of the
-- schema, with the same statements inside: every write of task state, and every read of it
-- under a row lock, is a function of `sql/`, so that a later schema can move the state out
-- of the table (docs/storage.md) by replacing their bodies, with no change to the daemon.
--
-- Each keeps the statement it replaces word for word (locks, fences, notifications), runs
-- with the caller's rights like `claim` and `finish`, and is granted to the daemon's role:
-- by `grant_daemon` from now on, and here to every role that may already call
-- `pgtaskd.finish`. Nothing else changes: a daemon of schema 25 may run while this is
-- applied, and stops at the schema check when restarted, as after every migration.
--
-- Producers may also read `pgtaskd.paused_queues` (`grant_producer`, and here every role
-- that may enqueue): `pgtaskd stats` and `GET /stats` read it, and failed for a producer with
-- "permission denied for table paused_queues"; whether its queue is paused is what a
-- producer whose tasks wait needs to know.

-- Extend by `lease_ms` the leases of the claims `tokens` of tasks `ids` (one token per id)
-- that are still held, without waiting for any row lock: a row another transaction holds is
-- answered with `task_extended` false (docs/design.md, "No one else's lock delays a batch").
-- A claim missing from the answer is no longer held.
CREATE FUNCTION pgtaskd.heartbeat(ids bigint[], tokens bigint[], lease_ms float8)
RETURNS TABLE (task_id bigint, task_extended boolean, task_cancel_requested boolean)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH held AS MATERIALIZED (
        SELECT k.id
          FROM pgtaskd.tasks AS k
         WHERE k.id = ANY (heartbeat.ids) AND k.claim_token = ANY (heartbeat.tokens)
           AND coalesce(k.status, '') = 'RUNNING'
         ORDER BY k.id
           FOR UPDATE SKIP LOCKED
    ), extended AS (
        UPDATE pgtaskd.tasks AS t
           SET lease_expires_at = now() + heartbeat.lease_ms * interval '1 millisecond'
          FROM held
         WHERE t.id = held.id
        RETURNING t.id, t.cancel_requested
    )
    SELECT e.id, true, e.cancel_requested FROM extended AS e
    UNION ALL
    SELECT k.id, false, k.cancel_requested
      FROM pgtaskd.tasks AS k
     WHERE k.id = ANY (heartbeat.ids) AND k.claim_token = ANY (heartbeat.tokens)
       AND coalesce(k.status, '') = 'RUNNING'
       AND k.id NOT IN (SELECT held.id FROM held);
END
$$;

-- Extend the lease of claim `token` of task `id`, waiting for its row if another transaction
-- holds it (up to the session's `lock_timeout`): one row with `cancel_requested`, none when
-- the claim is no longer held.
CREATE FUNCTION pgtaskd.extend_lease(id bigint, token bigint, lease_ms float8)
RETURNS TABLE (task_cancel_requested boolean)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    UPDATE pgtaskd.tasks AS t
       SET lease_expires_at = now() + extend_lease.lease_ms * interval '1 millisecond'
     WHERE t.id = extend_lease.id AND t.claim_token = extend_lease.token
       AND coalesce(t.status, '') = 'RUNNING'
    RETURNING t.cancel_requested;
END
$$;

-- Take back up to `max_tasks` expired leases, other than those of instance `owner`: QUEUED
-- with a backoff while attempts remain, else FAILED; CANCELED where a cancel was requested.
-- Rows are picked with SKIP LOCKED and re-checked (still RUNNING, same token, lease still
-- expired), so rescuers of many daemons never fight and a lease extended meanwhile stays.
-- The tasks it ends are announced on `pgtaskd_done` in the same transaction.
CREATE FUNCTION pgtaskd.rescue(max_tasks bigint, owner text)
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

-- Give the claim `token` of task `id` back without a result, as a shutdown does: QUEUED with
-- the attempt not counted, or CANCELED where a cancel was requested. Without `wait`, a row
-- someone else holds fails with lock_not_available (55P03). One row: the status written
-- (null when the claim was not held) and the task's status now (null: no such task).
CREATE FUNCTION pgtaskd.release(id bigint, token bigint, wait boolean)
RETURNS TABLE (written text, current text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH unlocked AS MATERIALIZED (
        SELECT k.id FROM pgtaskd.tasks AS k
         WHERE NOT release.wait AND k.id = release.id
           FOR UPDATE NOWAIT
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED' ELSE 'QUEUED' END,
               attempt = CASE WHEN t.cancel_requested THEN t.attempt ELSE t.attempt - 1 END,
               started_at = CASE WHEN t.cancel_requested THEN t.started_at END,
               finished_at = CASE WHEN t.cancel_requested THEN now() END,
               lease_owner = NULL,
               lease_expires_at = NULL
         WHERE t.id = release.id AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = release.token
           AND (release.wait OR t.id IN (SELECT u.id FROM unlocked AS u))
        RETURNING t.id, t.status
    ), notified AS (
        -- A release that ends the task (CANCELED) tells the waiters, in the same transaction.
        SELECT pgtaskd.notify_done(array_agg(d.id)) AS sent
          FROM done AS d WHERE d.status = 'CANCELED'
    )
    SELECT (SELECT d.status FROM done AS d),
           (SELECT k.status FROM pgtaskd.tasks AS k WHERE k.id = release.id)
      FROM notified;
END
$$;

-- Where the claim of task `id` stands, read after any transaction that still holds the row
-- (`FOR SHARE`), such as one whose commit outcome is unknown: waiting for it with `wait`,
-- else failing with lock_not_available (55P03). No row: no such task.
CREATE FUNCTION pgtaskd.claim_state(id bigint, wait boolean)
RETURNS TABLE (task_status text, task_attempt int, task_claim bigint)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF claim_state.wait THEN
        RETURN QUERY
        SELECT k.status, k.attempt, k.claim_token FROM pgtaskd.tasks AS k
         WHERE k.id = claim_state.id
           FOR SHARE;
    ELSE
        RETURN QUERY
        SELECT k.status, k.attempt, k.claim_token FROM pgtaskd.tasks AS k
         WHERE k.id = claim_state.id
           FOR SHARE NOWAIT;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.heartbeat(bigint[], bigint[], float8) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.extend_lease(bigint, bigint, float8) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.rescue(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.release(bigint, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.claim_state(bigint, boolean) FROM PUBLIC;

-- The roles that may finish claims may heartbeat, rescue, release and re-read them.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[], boolean)'::pg_catalog.regprocedure::pg_catalog.oid
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION '
                                  'pgtaskd.heartbeat(bigint[], bigint[], float8), '
                                  'pgtaskd.extend_lease(bigint, bigint, float8), '
                                  'pgtaskd.rescue(bigint, text), '
                                  'pgtaskd.release(bigint, bigint, boolean), '
                                  'pgtaskd.claim_state(bigint, boolean) TO %s',
                                  grantee::pg_catalog.regrole);
    END LOOP;
END
$$;

-- The daemon's rights of version 24, and the functions above.
CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer, and steer queues like
    -- an operator; `/metrics` and `/readyz` read the vacuum health.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent) '
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
END
$$;

-- Every role that may enqueue reads which queues are paused.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'pgtaskd.enqueue(text, text, int, timestamptz, int, text)'::pg_catalog.regprocedure::pg_catalog.oid
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON pgtaskd.paused_queues TO %s',
                                  grantee::pg_catalog.regrole);
    END LOOP;
END
$$;

-- The producer's rights of version 24, and reading which queues are paused.
CREATE OR REPLACE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_view TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
    -- The CLI's schema check (version 23).
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
    -- Which queues are paused, for `pgtaskd stats` (version 26).
    EXECUTE format('GRANT SELECT ON pgtaskd.paused_queues TO %I', role_name);
END
$$;
