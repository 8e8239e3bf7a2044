-- pgtaskd schema, version 23: the daemons connected say which handler runs each queue they
-- serve, so that two daemons that would run one queue's tasks differently are seen.
--
-- `pgtaskd.daemons.handlers` is parallel to `queues`: the k-th entry is how the daemon runs
-- the k-th queue: `text-stats`, or `exec:` / `http:` followed by a fingerprint of the command
-- or the URL (eight hex digits of a hash: the URL itself may carry a key, and is not
-- written). NULL for a daemon of schema 21 or 22, which did not say.
--
-- A daemon that would run a queue with the built-in text-stats (it has no `[queues.NAME]`
-- section) while a live daemon runs that queue with a handler of its own refuses to start:
-- it would mark the queue's tasks SUCCEEDED with word counts and never run their work. Other
-- differences (another command, another handler) are logged by each daemon that sees them,
-- as a rolling change of a queue's handler goes through them.

ALTER TABLE pgtaskd.daemons ADD COLUMN handlers text[];

COMMENT ON COLUMN pgtaskd.daemons.handlers IS
    'pgtaskd: how the daemon runs each of its queues (parallel to queues): text-stats, exec:FINGERPRINT or http:FINGERPRINT';

-- Producers may use the CLI (`pgtaskd enqueue`, `status`, `wait`, `cancel`), which checks the
-- schema's version first: they read `pgtaskd.schema_migrations` too, as operators and daemons
-- do. The roles already granted (those that may insert tasks) get it here.
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
    -- The CLI's schema check (version 23).
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
END
$$;

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
        EXECUTE pg_catalog.format('GRANT SELECT ON pgtaskd.schema_migrations TO %s',
                               grantee::pg_catalog.regrole);
    END LOOP;
END
$$;
