-- pgtaskd schema, version 41: a lease owner of ten characters (docs/storage.md, "Built: a
-- lease owner of ten characters (schema 41)").
--
-- A claim writes as `task_state.lease_owner` only the last part of its daemon's instance id
-- (`host:pid:key`), the key of ten characters of [0-9a-z], where it wrote the whole id: the
-- RUNNING version of a state row, which a held snapshot keeps, no longer grows with the
-- host's name. `pgtaskd.task_view` answers `lease_owner` with the whole instance id of the
-- daemon whose id's last part is the key (`pgtaskd.lease_holder`), so readers see what they saw;
-- the rescuer's error names the daemon the same way. Leases written before keep their whole
-- ids, which the view answers as they are.
--
-- Locks: the view's and `pgtaskd.rescue`'s replacement, and `SHARE` on `pgtaskd.daemons` for
-- its index (a few rows); no task table is changed.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

-- Each daemon by its lease key, for `pgtaskd.lease_holder` (schema 41): one lookup per
-- RUNNING task the view reads, however many daemons are listed.
CREATE INDEX daemons_lease_key_idx ON pgtaskd.daemons ((pg_catalog.split_part(instance, ':', -1)));

-- The daemon that holds a lease, as `pgtaskd daemons` names it (schema 41): a claim writes
-- only the last part of its daemon's instance id (`host:pid:key`) as `lease_owner`, a key of
-- ten characters, so that the version of a state row that a held snapshot keeps does not
-- grow with the host's name. An owner that is no listed daemon's key (a daemon forgotten an
-- hour after its last heartbeat, or a lease written before schema 41, which holds a whole
-- id) is answered as it is. Executable by every role, as `queue_max_attempts` is: the view,
-- which runs with its reader's rights, calls both; a caller learns a daemon's id only from
-- its key.
CREATE FUNCTION pgtaskd.lease_holder(owner text) RETURNS text
LANGUAGE sql STABLE STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT pg_catalog.min(d.instance) FROM pgtaskd.daemons AS d
                      WHERE pg_catalog.split_part(d.instance, ':', -1) OPERATOR(pg_catalog.=) owner),
                    owner)
$$;

CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT s.id, s.queue, t.payload, s.status, s.priority, s.run_at, s.attempt,
       coalesce(s.max_attempts, pgtaskd.queue_max_attempts(s.queue)) AS max_attempts,
       s.cancel_requested, coalesce(s.words, 0) AS words, coalesce(s.bytes, 0) AS bytes,
       coalesce(s.runes, 0) AS runes, s.error, pgtaskd.lease_holder(s.lease_owner) AS lease_owner,
       s.lease_expires_at, t.created_at, s.started_at, s.finished_at, t.idempotency_key,
       s.claim_token, s.output, t.traceparent,
       coalesce((SELECT x.id FROM pgtaskd.site AS x), 'nosite') || '-' || s.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       coalesce(s.runs, 0) AS runs, s.errors, coalesce(s.snoozes, 0) AS snoozes,
       s.concurrency_key, t.depends_on, t.on_dep_failure,
       t.tags, t.metadata, s.progress, s.progress_at, t.batch_id
  FROM pgtaskd.task_state AS s
 CROSS JOIN LATERAL (SELECT x.payload, x.created_at, x.idempotency_key, x.traceparent,
                            x.depends_on, x.on_dep_failure, x.tags, x.metadata, x.batch_id
                       FROM pgtaskd.tasks AS x
                      WHERE x.id = s.id
                     OFFSET 0) AS t;

-- The rescuer: `owner` is the rescuing daemon's key; the error of a lease lost and the
-- previous owner it answers name the daemon that held it.
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
                               t.attempt, pgtaskd.lease_holder(t.lease_owner))
               END,
               -- A lost lease is a failed attempt (version 30).
               errors = CASE
                   WHEN t.cancel_requested THEN t.errors
                   ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs,
                            format('lease lost (last held by %s)', pgtaskd.lease_holder(t.lease_owner)))
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
        RETURNING t.id, expired.attempt, pgtaskd.lease_holder(expired.lease_owner) AS lease_owner,
                  t.status, t.queue
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
