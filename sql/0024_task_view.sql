-- pgtaskd schema, version 24: `pgtaskd.task_view`, the relation to read a task's state and
-- results from.
--
-- Today it is every column of `pgtaskd.tasks`, in the same order, with the same names and
-- types, and it reads the same rows: a query moved from the table to the view answers the
-- same, with the same plan (a view of one table is folded into the query). It exists because
-- the table will not keep those columns: the storage layout of docs/storage.md writes a task
-- once, and keeps its state (status, attempt, lease, results) in narrow tables of their own.
-- From then on `pgtaskd.tasks` holds what the producer wrote, still the target of the
-- producers' INSERT, COPY and ON CONFLICT, and `pgtaskd.task_view` is where status, words,
-- bytes, runes, output and error are read (docs/upgrading.md, "Schema 24").
--
-- Read-only: no role is granted INSERT, UPDATE or DELETE on it; tasks are still enqueued
-- into `pgtaskd.tasks`, and moved by the functions.

CREATE VIEW pgtaskd.task_view AS
SELECT t.id, t.queue, t.payload, t.status, t.priority, t.run_at, t.attempt, t.max_attempts,
       t.cancel_requested, t.words, t.bytes, t.runes, t.error, t.lease_owner,
       t.lease_expires_at, t.created_at, t.started_at, t.finished_at, t.idempotency_key,
       t.claim_token, t.output, t.traceparent
  FROM pgtaskd.tasks AS t;

-- With the reader's rights, not the owner's (PostgreSQL 15 and later): a row-level security
-- policy or a column grant on `pgtaskd.tasks` holds through the view as on the table. Before
-- 15 a view reads with its owner's rights; there, give the view only to roles that may read
-- every row of the table.
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int OPERATOR(pg_catalog.>=) 150000 THEN
        EXECUTE 'ALTER VIEW pgtaskd.task_view SET (security_invoker = true)';
    END IF;
END
$$;

COMMENT ON VIEW pgtaskd.task_view IS
    'pgtaskd: every task with its state and results: SELECT status, words, bytes, runes, output, error FROM pgtaskd.task_view WHERE id = $1';

-- The grant functions give the view to every role they give `SELECT` on the table.
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
END
$$;

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
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.retry_failed(text, integer, bigint) '
                   'TO %I', role_name);
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_view, pgtaskd.paused_queues, '
                   'pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.pause_queue(text), '
                   'pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.retry_failed(text, integer, bigint), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.vacuum_health() TO %I', role_name);
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
END
$$;

-- Every role that may read the table now may read the view: the roles granted before this
-- version, and any an operator granted `SELECT` on the table by hand.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_class AS t, pg_catalog.aclexplode(t.relacl) AS a
         WHERE t.oid OPERATOR(pg_catalog.=) 'pgtaskd.tasks'::pg_catalog.regclass::pg_catalog.oid
           AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
           AND a.grantee OPERATOR(pg_catalog.<>) t.relowner
    LOOP
        IF grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN
            GRANT SELECT ON pgtaskd.task_view TO PUBLIC;
        ELSE
            EXECUTE pg_catalog.format('GRANT SELECT ON pgtaskd.task_view TO %s',
                                   grantee::pg_catalog.regrole);
        END IF;
    END LOOP;
END
$$;
