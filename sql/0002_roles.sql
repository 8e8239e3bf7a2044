-- pgtaskd schema, version 2: least privilege.
--
--   SELECT pgtaskd.grant_producer('app');      -- insert, read and cancel tasks; nothing else
--   SELECT pgtaskd.grant_daemon('pgtaskd');    -- what `pgtaskd run` needs; no DDL
--
-- Run them as the role that ran `pgtaskd migrate` (the owner of the schema). A producer may
-- insert only the columns a producer chooses (queue, payload, priority, run_at,
-- max_attempts): never a status, a lease or a result. Cancelling goes through
-- request_cancel, which runs with its owner's rights, so producers need no UPDATE right.

ALTER FUNCTION pgtaskd.request_cancel(bigint)
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION pgtaskd.request_cancel(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.cancel(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.claim(text[], bigint, text, float8) FROM PUBLIC;

CREATE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;

CREATE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8) TO %I',
                   role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.grant_producer(name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.grant_daemon(name) FROM PUBLIC;
