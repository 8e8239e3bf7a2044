-- pgtaskd schema, version 14: inserts skip the trigger's function while no daemon is idle.
--
-- Since version 7 an insert notifies only while some daemon is flagged idle, and the NOTIFY
-- lock no longer serializes producers. What each INSERT still paid was the call of the
-- trigger's PL/pgSQL function (a SECURITY DEFINER call and one query of the flags table),
-- even while every daemon was busy: with 64 producers committing single-row INSERTs and no
-- daemon, 74-93% (median 83%) of the commits per second of the trigger disabled, in 6
-- interleaved 15 s pgbench runs on a 2-core machine (this version: 87-106%, median 91%).
--
-- `pgtaskd.idle_until` holds, in milliseconds since 1970, the latest expiry of a live flag (0
-- or never set: none), and the trigger gets a `WHEN` condition that reads it: while it is in
-- the past, PostgreSQL evaluates that condition and does not call the function at all. The
-- condition only filters: when it passes, the function checks the flags table exactly as
-- before, so a value later than the truth costs a call and never a wrong notification.
--
-- The value is kept by a trigger on the flags table, so that every write of a flag (a daemon
-- going idle, renewing, going busy, stopping; an operator's DELETE) sets it from the table.
-- Writers take their turn, before they lock any row (a lock on the flags table that conflicts
-- only with itself and with vacuum's, so neither the writes of the flags nor the insert
-- trigger's reads wait for it, and only a role that may write the flags can take it), and each
-- reads the table after the previous one committed, so the last value a committed write set
-- is computed from every committed flag: two daemons going idle and busy at once never leave
-- the value without the idle one's flag. A writer that cannot get its turn within half a
-- second (a vacuum of the flags table) only raises the value. The value is set before the
-- writing transaction commits, so an idle daemon's flag counts for the condition no later
-- than it counts for the function; the wake-up protocol (docs/design.md,
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

-- Applying this takes `pgtaskd.tasks`'s ACCESS EXCLUSIVE lock for a moment (to re-create the
-- trigger), which a running vacuum of the table or a long producer transaction holds up while
-- every insert queues behind the request: the migration waits for it at most 10 s (less when
-- the session's `lock_timeout` is shorter) and then fails with a lock timeout; run it again,
-- ideally with the daemons stopped. That lock is taken before the flags table's, so running
-- daemons' flag writes wait only for the last statements of the migration once it has it; an
-- operator's transaction that writes flags and then inserts tasks meanwhile can deadlock with
-- it, and then one of the two fails: run it again.
--
-- Everything here runs with `search_path = pg_catalog, pg_temp` (restored at the end), so
-- that no operator, function or type of someone's own in a schema on the migrating role's
-- path (`public`, `"$user"`) is resolved by the statements below or stored in the trigger.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('pgtaskd.search_path_before_14',
                                  pg_catalog.current_setting('search_path'), true);
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
END
$$;

DO $$
DECLARE
    waits interval := pg_catalog.current_setting('lock_timeout')::interval;
BEGIN
    PERFORM pg_catalog.set_config('pgtaskd.lock_timeout_before_14',
                                  pg_catalog.current_setting('lock_timeout'), true);
    IF waits OPERATOR(pg_catalog.=) interval '0'
       OR waits OPERATOR(pg_catalog.>) interval '10 seconds' THEN
        PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    END IF;
END
$$;

DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int OPERATOR(pg_catalog.>=) 150000 THEN
        EXECUTE 'CREATE UNLOGGED SEQUENCE pgtaskd.idle_until AS bigint MINVALUE 0 START 0';
    ELSE
        EXECUTE 'CREATE SEQUENCE pgtaskd.idle_until AS bigint MINVALUE 0 START 0';
    END IF;
END
$$;

COMMENT ON SEQUENCE pgtaskd.idle_until IS
    'pgtaskd: latest expiry of a live idle flag, ms since 1970; the insert trigger runs only before it';

GRANT SELECT ON SEQUENCE pgtaskd.idle_until TO PUBLIC;

DO $$
DECLARE
    was_enabled "char";
BEGIN
    SELECT t.tgenabled INTO was_enabled
      FROM pg_catalog.pg_trigger AS t
     WHERE t.tgrelid OPERATOR(pg_catalog.=) 'pgtaskd.tasks'::pg_catalog.regclass
       AND t.tgname OPERATOR(pg_catalog.=) 'tasks_notify';
    DROP TRIGGER IF EXISTS tasks_notify ON pgtaskd.tasks;
    -- Evaluated as the inserting role. Every name and operator is resolved now, not at each
    -- insert, and each is qualified, so neither the producer's search_path nor the migrating
    -- role's (an operator of someone's own in `public`) can reach into it.
    CREATE TRIGGER tasks_notify
        AFTER INSERT ON pgtaskd.tasks
        FOR EACH STATEMENT
        WHEN (pg_catalog.has_sequence_privilege('pgtaskd.idle_until'::pg_catalog.regclass, 'SELECT')
              AND pg_catalog.pg_sequence_last_value('pgtaskd.idle_until'::pg_catalog.regclass)::pg_catalog.float8
                  OPERATOR(pg_catalog.>)
                  (pg_catalog.date_part('epoch', pg_catalog.now()) OPERATOR(pg_catalog.*) 1000::pg_catalog.float8))
        EXECUTE FUNCTION pgtaskd.notify_tasks();
    IF was_enabled OPERATOR(pg_catalog.=) 'D' THEN
        ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify;
    ELSIF was_enabled OPERATOR(pg_catalog.=) 'R' OR was_enabled OPERATOR(pg_catalog.=) 'A' THEN
        EXECUTE pg_catalog.format('ALTER TABLE pgtaskd.tasks ENABLE %s TRIGGER tasks_notify',
                                  CASE WHEN was_enabled OPERATOR(pg_catalog.=) 'R' THEN 'REPLICA' ELSE 'ALWAYS' END);
    END IF;
END
$$;

-- The latest expiry of a live flag, in whole milliseconds rounded up (an infinite one as the
-- largest value the sequence takes), or 0.
CREATE FUNCTION pgtaskd.idle_flags_until() RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER
AS $$
    SELECT least(coalesce(pg_catalog.ceil(pg_catalog.date_part('epoch', pg_catalog.max(d.expires_at))
                                          OPERATOR(pg_catalog.*) 1000::pg_catalog.float8),
                          0),
                 9.2e18::pg_catalog.float8)::bigint
      FROM pgtaskd.idle_daemons AS d
     WHERE d.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
$$;

REVOKE ALL ON FUNCTION pgtaskd.idle_flags_until() FROM PUBLIC;

-- Before a statement writes any flag, before it locks any row: take the turn (a lock that
-- conflicts only with itself and with vacuum's, analyze's and index builds' own), so that
-- a writer holding row locks never waits for it (no deadlock with an operator's transaction
-- that writes several flags). Tried without waiting, for at most half a second and once per
-- statement (an `INSERT ... ON CONFLICT DO UPDATE` fires the insert's and the update's
-- triggers): a `VACUUM`, an `ANALYZE` or a `CREATE INDEX CONCURRENTLY` of the flags table,
-- left open in an operator's transaction, must not stall a daemon's flag write until its lock
-- timeout. Without the turn, the statement goes on, and its value may only raise the
-- sequence (unless the turn is free by then, see below).
-- Like the insert trigger's function, these run with their owner's rights (daemons need
-- no right on the sequence) and name everything they use instead of setting a search_path.
CREATE FUNCTION pgtaskd.take_idle_turn() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    this_statement text := pg_catalog.statement_timestamp()::text;
BEGIN
    IF pg_catalog.current_setting('pgtaskd.idle_turn', true)
       OPERATOR(pg_catalog.=) ('missed ' OPERATOR(pg_catalog.||) this_statement) THEN
        RETURN NULL;
    END IF;
    FOR attempt IN 1..50 LOOP
        BEGIN
            LOCK TABLE pgtaskd.idle_daemons IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;
            PERFORM pg_catalog.set_config('pgtaskd.idle_turn', 'held', true);
            RETURN NULL;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.01);
        END;
    END LOOP;
    PERFORM pg_catalog.set_config('pgtaskd.idle_turn',
                                  'missed ' OPERATOR(pg_catalog.||) this_statement, true);
    RETURN NULL;
END
$$;

-- After a statement wrote flags: with the turn (held, or free by now: tried once more, so
-- that a writer that missed it holds it from here to its commit and a later writer cannot
-- set the value without its flag), set the value from the flags (read after the previous
-- holder committed); without it, only raise it.
CREATE FUNCTION pgtaskd.set_idle_until() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    held boolean := coalesce(pg_catalog.current_setting('pgtaskd.idle_turn', true)
                             OPERATOR(pg_catalog.=) 'held', false);
    flags_until bigint;
BEGIN
    IF NOT held THEN
        BEGIN
            LOCK TABLE pgtaskd.idle_daemons IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;
            held := true;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END IF;
    flags_until := pgtaskd.idle_flags_until();
    IF held THEN
        PERFORM pg_catalog.setval('pgtaskd.idle_until'::pg_catalog.regclass, flags_until);
    ELSE
        PERFORM pg_catalog.setval('pgtaskd.idle_until'::pg_catalog.regclass,
                                  greatest(
                                      coalesce(pg_catalog.pg_sequence_last_value(
                                                   'pgtaskd.idle_until'::pg_catalog.regclass), 0),
                                      flags_until));
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION pgtaskd.take_idle_turn() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.set_idle_until() FROM PUBLIC;

CREATE TRIGGER idle_daemons_take_turn
    BEFORE INSERT OR UPDATE OR DELETE ON pgtaskd.idle_daemons
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.take_idle_turn();

CREATE TRIGGER idle_daemons_set_idle_until
    AFTER INSERT OR UPDATE OR DELETE ON pgtaskd.idle_daemons
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.set_idle_until();

-- The flags already written count from now.
SELECT pg_catalog.setval('pgtaskd.idle_until'::pg_catalog.regclass, pgtaskd.idle_flags_until());

SELECT pg_catalog.set_config('lock_timeout',
                             pg_catalog.current_setting('pgtaskd.lock_timeout_before_14'), true);
SELECT pg_catalog.set_config('search_path',
                             pg_catalog.current_setting('pgtaskd.search_path_before_14'), true);
