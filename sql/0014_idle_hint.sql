-- pgtaskd schema, version 14: inserts skip the trigger's function while no daemon is idle.
--
-- Since version 7 an insert notifies only while some daemon is flagged idle, and the NOTIFY
-- lock no longer serializes producers. What each INSERT still paid was the call of the
-- trigger's PL/pgSQL function (a SECURITY DEFINER call and one query of the flags table),
-- even while every daemon was busy: with 64 producers committing single-row INSERTs and no
-- daemon, 84-106% (median 86%) of the commits per second of the trigger disabled, in 6
-- interleaved 15 s pgbench runs on a 2-core machine.
--
-- `pgtaskd.idle_until` holds, in milliseconds since 1970, the latest expiry of a live flag (0
-- or never set: none), and the trigger gets a `WHEN` condition that reads it: while it is in
-- the past, PostgreSQL evaluates that condition and does not call the function at all. The
-- condition only filters: when it passes, the function checks the flags table exactly as
-- before, so a value later than the truth costs a call and never a wrong notification.
--
-- The value is kept by a trigger on the flags table, so that every write of a flag (a daemon
-- going idle, renewing, going busy, stopping; an operator's DELETE) sets it from the table.
-- Writers take their turn (a lock on the flags table that conflicts only with itself, so
-- neither the writes of the flags nor the insert trigger's reads wait for it, and only a role
-- that may write the flags can take it), and each reads the table after the previous one
-- committed, so the last value set is always computed from every committed flag: two daemons
-- going idle and busy at once never leave the value without the idle one's flag. The value
-- is set before the writing transaction commits, so an idle daemon's flag counts for the
-- condition no later than it counts for the function; the wake-up protocol (docs/design.md,
-- "Idle flags") is unchanged.
--
-- The sequence is UNLOGGED where the server has them (PostgreSQL 15 and later), like the
-- flags table: a crash or a promotion resets both, to "no daemon idle", until the daemons flag
-- themselves again. Reading it needs SELECT on it, granted to PUBLIC (it tells when a daemon
-- is idle, nothing else); an inserting role without that right (the grant revoked) inserts
-- as before and never notifies: the condition checks the right first, and its inserts wait
-- for the daemons' poll tick.
--
-- The trigger is re-created under its name, and left disabled if an operator had disabled it
-- (`ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify` still turns notifications off).

DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 150000 THEN
        EXECUTE 'CREATE UNLOGGED SEQUENCE pgtaskd.idle_until AS bigint MINVALUE 0 START 0';
    ELSE
        EXECUTE 'CREATE SEQUENCE pgtaskd.idle_until AS bigint MINVALUE 0 START 0';
    END IF;
END
$$;

COMMENT ON SEQUENCE pgtaskd.idle_until IS
    'pgtaskd: latest expiry of a live idle flag, ms since 1970; the insert trigger runs only before it';

GRANT SELECT ON SEQUENCE pgtaskd.idle_until TO PUBLIC;

-- Runs with its owner's rights (daemons need no right on the sequence) and, like the insert
-- trigger's function, names everything it uses instead of setting a search_path.
CREATE FUNCTION pgtaskd.set_idle_until() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
BEGIN
    -- One writer of the value at a time, each reading the flags after the last committed.
    LOCK TABLE pgtaskd.idle_daemons IN SHARE UPDATE EXCLUSIVE MODE;
    PERFORM pg_catalog.setval('pgtaskd.idle_until'::pg_catalog.regclass,
                              coalesce(
                                  (SELECT pg_catalog.date_part('epoch', pg_catalog.max(d.expires_at))
                                          OPERATOR(pg_catalog.*) 1000
                                     FROM pgtaskd.idle_daemons AS d
                                    WHERE d.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()),
                                  0)::bigint);
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.set_idle_until() FROM PUBLIC;

CREATE TRIGGER idle_daemons_set_idle_until
    AFTER INSERT OR UPDATE OR DELETE ON pgtaskd.idle_daemons
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.set_idle_until();

-- The flags already written count from now.
SELECT pg_catalog.setval('pgtaskd.idle_until',
                         coalesce((SELECT date_part('epoch', max(expires_at)) * 1000
                                     FROM pgtaskd.idle_daemons
                                    WHERE expires_at > now()), 0)::bigint);

DO $$
DECLARE
    was_enabled "char";
BEGIN
    SELECT t.tgenabled INTO was_enabled
      FROM pg_trigger AS t
     WHERE t.tgrelid = 'pgtaskd.tasks'::regclass AND t.tgname = 'tasks_notify';
    DROP TRIGGER IF EXISTS tasks_notify ON pgtaskd.tasks;
    -- Evaluated as the inserting role; every name is resolved now, not at each insert, so
    -- the producer's search_path cannot reach into it.
    CREATE TRIGGER tasks_notify
        AFTER INSERT ON pgtaskd.tasks
        FOR EACH STATEMENT
        WHEN (pg_catalog.has_sequence_privilege('pgtaskd.idle_until'::pg_catalog.regclass, 'SELECT')
              AND pg_catalog.pg_sequence_last_value('pgtaskd.idle_until'::pg_catalog.regclass)::float8
                  > pg_catalog.date_part('epoch', pg_catalog.now()) * 1000)
        EXECUTE FUNCTION pgtaskd.notify_tasks();
    IF was_enabled = 'D' THEN
        ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify;
    ELSIF was_enabled IN ('R', 'A') THEN
        EXECUTE format('ALTER TABLE pgtaskd.tasks ENABLE %s TRIGGER tasks_notify',
                       CASE was_enabled WHEN 'R' THEN 'REPLICA' ELSE 'ALWAYS' END);
    END IF;
END
$$;
