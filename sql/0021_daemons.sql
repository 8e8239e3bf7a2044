-- pgtaskd schema, version 21: the daemons connected say which queues they serve, so that a
-- queue no daemon serves shows as such (`stats`, the dashboard, `/metrics`, `pgtaskd
-- daemons`, the warning of `pgtaskd enqueue`) instead of looking healthy while its oldest
-- task ages for ever.
--
-- - `pgtaskd.daemons`: one row per running daemon (all of its lanes together), written by
--   the daemon itself: inserted at its start, after the schema check; `heartbeat_at` renewed
--   every `heartbeat_every`; deleted at a clean stop. A row whose heartbeat is older than
--   three of its periods counts as gone (a daemon killed, or cut off from the database);
--   any daemon deletes the rows whose heartbeat is older than an hour.
-- - Readers need no function: `SELECT ... FROM pgtaskd.daemons WHERE heartbeat_at >= now() -
--   3 * heartbeat_every` are the live ones. The daemon role writes it; operators and
--   producers read it (`grant_daemon`, `grant_operator`, `grant_producer`, re-created here,
--   and the roles already granted, found by their rights on `pgtaskd.tasks`).

CREATE TABLE pgtaskd.daemons (
    instance        text        PRIMARY KEY,
    version         text        NOT NULL,
    queues          text[]      NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_every interval    NOT NULL,

    CONSTRAINT daemons_heartbeat_every_positive
        CHECK (heartbeat_every OPERATOR(pg_catalog.>) interval '0')
);

COMMENT ON TABLE pgtaskd.daemons IS
    'pgtaskd: the daemons running, their queues and heartbeats; stale after 3 heartbeat periods';

-- Every role that reads the tasks reads the daemons; the daemon role (it deletes tasks)
-- writes them. Every name and operator is pg_catalog's: nothing resolves through the
-- migrating role's search_path.
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
           AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON pgtaskd.daemons TO %s', grantee::pg_catalog.regrole);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_class AS t, pg_catalog.aclexplode(t.relacl) AS a
         WHERE t.oid OPERATOR(pg_catalog.=) 'pgtaskd.tasks'::pg_catalog.regclass::pg_catalog.oid
           AND a.privilege_type OPERATOR(pg_catalog.=) 'DELETE'
           AND a.grantee OPERATOR(pg_catalog.<>) t.relowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
    LOOP
        EXECUTE pg_catalog.format('GRANT INSERT, UPDATE, DELETE ON pgtaskd.daemons TO %s',
                               grantee::pg_catalog.regrole);
    END LOOP;
END
$$;

-- The producer's rights of version 19, and reading the daemons.
CREATE OR REPLACE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
END
$$;

-- The daemon's rights of version 19, and its row in the daemons.
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
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint) '
                   'TO %I', role_name);
END
$$;

-- The operator's rights of version 9, and reading the daemons.
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
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
END
$$;
