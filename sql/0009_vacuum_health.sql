-- pgtaskd schema, version 9: vacuum health.
--
-- `pgtaskd.vacuum_health()` answers, in one row, whether the task table is bloating and
-- whether vacuum is held back (docs/design.md, "Vacuum health"):
--
-- - the table's live and dead tuples (the statistics system's estimates), seconds since its
--   last manual vacuum and autovacuum (null: never since the statistics were reset), how many
--   of each ran, and its heap, TOAST (table and index) and index sizes in bytes;
-- - the oldest xmin horizon that can hold back vacuum of `pgtaskd.tasks`, and what holds it:
--   a session (by its snapshot, when it is connected to this database, or by its transaction
--   id, whichever database it is in: every snapshot taken here keeps a running xid running), a
--   prepared transaction, or a replication slot's `xmin` (a slot's `catalog_xmin` holds back
--   only the catalogs). Its age in transactions, and in seconds where the server knows when it
--   began (a session's `xact_start`, a prepared transaction's `prepared`; a slot has no
--   time): null when that is unknown. The caller's own session and vacuums in progress are
--   left out. Null columns when nothing holds it.
--
-- What it returns about another session is its pid, its `application_name` and its state
-- (`active`, `idle in transaction`, ...), and never its query, its user or its client address;
-- a slot is named, a prepared transaction is not (its gid is the application's text).
--
-- It runs with its owner's rights (the role that migrated), because `pg_stat_activity` hides
-- the `state` and `xact_start` of other roles' sessions from a role without
-- `pg_read_all_stats`: the daemon's role needs no such right. It sees what its owner sees:
-- `sees_all_sessions` says whether the owner is a superuser or has `pg_read_all_stats` (or
-- `pg_monitor`). When not, the pid, `application_name`, `backend_xid` and `backend_xmin` of
-- every session are still known (PostgreSQL shows them to everyone), but the age in seconds
-- and the state of other roles' sessions are null, and the daemon estimates the age itself.
-- Granted by `grant_daemon` and `grant_operator`, re-created here, and to every role that
-- could already pause a queue (the daemon and operator roles of version 6).

CREATE FUNCTION pgtaskd.vacuum_health(
    OUT live_tuples         bigint,
    OUT dead_tuples         bigint,
    OUT vacuum_age_s        float8,
    OUT autovacuum_age_s    float8,
    OUT vacuum_count        bigint,
    OUT autovacuum_count    bigint,
    OUT table_bytes         bigint,
    OUT toast_bytes         bigint,
    OUT index_bytes         bigint,
    OUT horizon_kind        text,
    OUT horizon_xid         bigint,
    OUT horizon_age_xids    bigint,
    OUT horizon_age_s       float8,
    OUT holder_pid          int,
    OUT holder_name         text,
    OUT holder_state        text,
    OUT sees_all_sessions   boolean
) RETURNS record
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH vacuuming AS (
    SELECT v.pid FROM pg_stat_progress_vacuum AS v
), holders (kind, xid, since, pid, name, state) AS (
    -- A snapshot of this database (or of no database: a WAL sender's hot_standby_feedback).
    SELECT 'session', a.backend_xmin, a.xact_start, a.pid, a.application_name, a.state
      FROM pg_stat_activity AS a
     WHERE a.backend_xmin IS NOT NULL
       AND (a.datname = current_database() OR a.datid IS NULL)
       AND a.pid <> pg_backend_pid()
       AND a.pid NOT IN (SELECT vacuuming.pid FROM vacuuming)
    UNION ALL
    -- A transaction that wrote, in any database.
    SELECT 'session', a.backend_xid, a.xact_start, a.pid, a.application_name, a.state
      FROM pg_stat_activity AS a
     WHERE a.backend_xid IS NOT NULL
       AND a.pid <> pg_backend_pid()
       AND a.pid NOT IN (SELECT vacuuming.pid FROM vacuuming)
    UNION ALL
    SELECT 'prepared_transaction', p.transaction, p.prepared, NULL::int, NULL::text, NULL::text
      FROM pg_prepared_xacts AS p
    UNION ALL
    SELECT 'replication_slot', s.xmin, NULL::timestamptz, s.active_pid, s.slot_name::text,
           NULL::text
      FROM pg_replication_slots AS s
     WHERE s.xmin IS NOT NULL
), oldest AS (
    SELECT h.kind, h.xid, age(h.xid)::bigint AS age_xids, h.since, h.pid, h.name, h.state
      FROM holders AS h
     ORDER BY age(h.xid) DESC, h.kind, h.pid
     LIMIT 1
), tasks AS (
    SELECT c.oid, c.reltoastrelid FROM pg_class AS c WHERE c.oid = 'pgtaskd.tasks'::regclass
)
SELECT pg_stat_get_live_tuples(t.oid),
       pg_stat_get_dead_tuples(t.oid),
       extract(epoch FROM now() - pg_stat_get_last_vacuum_time(t.oid))::float8,
       extract(epoch FROM now() - pg_stat_get_last_autovacuum_time(t.oid))::float8,
       pg_stat_get_vacuum_count(t.oid),
       pg_stat_get_autovacuum_count(t.oid),
       pg_relation_size(t.oid),
       CASE WHEN t.reltoastrelid = 0 THEN 0 ELSE pg_total_relation_size(t.reltoastrelid) END,
       pg_indexes_size(t.oid),
       o.kind,
       o.xid::text::bigint,
       o.age_xids,
       extract(epoch FROM now() - o.since)::float8,
       o.pid,
       o.name,
       o.state,
       pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
  FROM tasks AS t
  LEFT JOIN oldest AS o ON true
$$;

REVOKE ALL ON FUNCTION pgtaskd.vacuum_health() FROM PUBLIC;

COMMENT ON FUNCTION pgtaskd.vacuum_health() IS
    'pgtaskd: bloat of pgtaskd.tasks and the oldest xmin horizon holding back its vacuum; no query text';

-- The daemon's rights of version 7, and the vacuum health.
CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer, and steer queues like
    -- an operator; `/metrics` and `/readyz` read the vacuum health.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations, pgtaskd.paused_queues TO %I',
                   role_name);
    -- Each daemon flags itself idle (version 7).
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskd.idle_daemons TO %I',
                   role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8), '
                   'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint), '
                   'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[]), '
                   'pgtaskd.notify_done(bigint[]), pgtaskd.vacuum_health() '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint) '
                   'TO %I', role_name);
END
$$;

-- The operator's rights of version 6, and the vacuum health.
CREATE OR REPLACE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.paused_queues, '
                   'pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.pause_queue(text), '
                   'pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.vacuum_health() TO %I', role_name);
END
$$;

-- Roles already granted the daemon's or the operator's rights (they can pause a queue) read
-- the vacuum health too.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT a.grantee
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'pgtaskd.pause_queue(text)'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.vacuum_health() TO %s',
                       grantee::regrole);
    END LOOP;
END
$$;
