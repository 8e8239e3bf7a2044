-- pgtaskd schema, version 7: NOTIFY only while some daemon waits for work.
--
-- Every transaction that sent a NOTIFY takes, at commit, a lock shared by the whole cluster
-- and holds it through its WAL flush, so concurrent producers whose inserts notify commit one
-- after another. A daemon that is busy does not need the hint: it scans again after every
-- scan that found work. So each daemon flags itself in `pgtaskd.idle_daemons` while it waits
-- for work, with an expiry it renews at every poll tick (a daemon killed without a goodbye
-- stops counting once its flag expires), and the insert trigger notifies only while some flag
-- is live. The wake-up protocol and the one window it leaves to the poll tick are in
-- docs/design.md, "Idle flags".
--
-- The table is UNLOGGED: a flag is a hint about this moment, worth no WAL, no fsync and no
-- replication. A crash or a promotion empties it; every daemon then reconnects (its LISTEN
-- session was lost with the server), scans, and flags itself again before its last claim, so
-- no insert is missed for it; until then the inserts do not notify, and nobody listens.
-- A standby cannot read it, and never needs to: the trigger runs only where rows are
-- inserted.
--
-- The trigger keeps its name: `ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify` still
-- turns notifications off. Its function now runs with its owner's rights, so producers need
-- no right on the flags.

CREATE UNLOGGED TABLE pgtaskd.idle_daemons (
    instance   text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

COMMENT ON TABLE pgtaskd.idle_daemons IS
    'pgtaskd: daemons waiting for work; inserts send NOTIFY pgtaskd_tasks only while one is live';

-- One read of a table of a few rows per INSERT or COPY statement, and a notification only
-- when a flag is live. `now()` is the producer's transaction start: a long transaction may
-- take an expired flag for live, and notifies in vain, never the other way round.
CREATE OR REPLACE FUNCTION pgtaskd.notify_tasks() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgtaskd.idle_daemons AS d WHERE d.expires_at > now()) THEN
        PERFORM pg_notify('pgtaskd_tasks', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer, and steer queues like
    -- an operator; each daemon flags itself idle and busy.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations, pgtaskd.paused_queues TO %I',
                   role_name);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskd.idle_daemons TO %I',
                   role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.claim(text[], bigint, text, float8), '
                   'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint), '
                   'pgtaskd.finish(text, bigint[], int[], text[], bigint[], bigint[], bigint[], text[]), '
                   'pgtaskd.notify_done(bigint[]) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint) '
                   'TO %I', role_name);
END
$$;

-- Roles already granted the daemon's rights (they can execute the finish) flag themselves
-- as `grant_daemon` now allows.
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
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskd.idle_daemons TO %I',
                       grantee::regrole);
    END LOOP;
END
$$;
