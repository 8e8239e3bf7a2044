-- pgtaskd schema, version 31: schedules, kept in the database so that every daemon agrees, and
-- fired by any daemon, with no leader (docs/schedules.md).
--
-- A schedule makes a task of its queue at each of its instants: a cron expression in a time
-- zone, or a fixed period (`every`, instants at whole multiples of it since 1970 UTC). The
-- daemons compute the instants (the cron expressions and the time zones are theirs to
-- read); the database decides who makes each fire: `pgtaskd.fire_schedule` moves
-- `last_fire` from the value the daemon read to the instant it fires, and makes the fire's
-- tasks in the same transaction, so that of any number of daemons firing one instant at
-- once, exactly one makes its task. Each task also carries the fire's instant as its
-- idempotency key (`schedule:NAME:INSTANT`, unique per queue), which no second insert of the
-- same fire can pass.
--
-- Nothing else changes; daemons of schema 30 may run while it is applied, and stop at the
-- schema check when restarted.

CREATE TABLE pgtaskd.schedules (
    -- Letters, digits and `_ . : -`, 1 to 128 bytes: it is part of each fire's idempotency
    -- key (visible ASCII) and of `/schedules/{name}`.
    name        text        PRIMARY KEY,
    -- Exactly one of the two: a cron expression (five fields, an optional leading seconds
    -- field, or `@hourly`...) read in `tz`, or a period of whole seconds.
    cron        text,
    every       interval,
    tz          text        NOT NULL DEFAULT 'UTC',
    queue       text        NOT NULL DEFAULT 'default',
    payload     text        NOT NULL,
    priority    smallint    NOT NULL DEFAULT 0,
    -- What a fire that no daemon made at its instant becomes: one task for all of them
    -- (`coalesce`), none (`skip`), or one per missed instant, the last 1,000 (`catch-up`).
    missed      text        NOT NULL DEFAULT 'coalesce',
    -- A fire while the previous fire's task is QUEUED or RUNNING makes no task.
    no_overlap  boolean     NOT NULL DEFAULT false,
    paused      boolean     NOT NULL DEFAULT false,
    -- The instant the definition took effect: no fire is before it.
    since       timestamptz NOT NULL DEFAULT now(),
    -- The last instant fired (or passed over), and the task it made.
    last_fire   timestamptz,
    last_task   bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT schedules_name
        CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    CONSTRAINT schedules_one_rule CHECK ((cron IS NULL) <> (every IS NULL)),
    CONSTRAINT schedules_every_whole_seconds
        CHECK (every IS NULL OR (every >= interval '1 second'
                                 AND extract(epoch FROM every) = trunc(extract(epoch FROM every))
                                 AND every <= interval '366 days')),
    CONSTRAINT schedules_queue_name
        CHECK (octet_length(queue) >= 1 AND octet_length(queue) <= 128),
    CONSTRAINT schedules_missed CHECK (missed IN ('coalesce', 'skip', 'catch-up')),
    CONSTRAINT schedules_tz CHECK (octet_length(tz) >= 1 AND octet_length(tz) <= 64),
    CONSTRAINT schedules_cron CHECK (octet_length(cron) <= 256),
    -- Every daemon reads the schedules once a second: a payload is at most 64 KiB.
    CONSTRAINT schedules_payload CHECK (octet_length(payload) <= 65536)
);

COMMENT ON TABLE pgtaskd.schedules IS
    'pgtaskd: tasks made at instants (cron in a time zone, or every N seconds), fired by any daemon: pgtaskd schedule add, GET /schedules';

-- Add `name`, or replace its definition (its fires count from now on: `since`), keeping its
-- last fire, and its paused state unless `paused` is given. The daemons check the cron
-- expression and the zone; this checks the rest (the table's constraints). Returns whether
-- it was new.
CREATE FUNCTION pgtaskd.put_schedule(
    name       text,
    cron       text,
    every      interval,
    payload    text,
    queue      text DEFAULT 'default',
    tz         text DEFAULT 'UTC',
    missed     text DEFAULT 'coalesce',
    no_overlap boolean DEFAULT false,
    priority   smallint DEFAULT 0,
    paused     boolean DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    created boolean;
BEGIN
    INSERT INTO pgtaskd.schedules AS s
           (name, cron, every, payload, queue, tz, missed, no_overlap, priority, paused)
    VALUES (put_schedule.name, put_schedule.cron, put_schedule.every, put_schedule.payload,
            coalesce(put_schedule.queue, 'default'), coalesce(put_schedule.tz, 'UTC'),
            coalesce(put_schedule.missed, 'coalesce'), coalesce(put_schedule.no_overlap, false),
            coalesce(put_schedule.priority, 0), coalesce(put_schedule.paused, false))
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
       SET cron = excluded.cron, every = excluded.every, payload = excluded.payload,
           queue = excluded.queue, tz = excluded.tz, missed = excluded.missed,
           no_overlap = excluded.no_overlap, priority = excluded.priority,
           paused = coalesce(put_schedule.paused, s.paused),
           since = clock_timestamp()
    RETURNING (xmax = 0) INTO created;
    RETURN created;
END
$$;

-- Remove, pause or resume `name`; false when there is no such schedule. A schedule resumed
-- fires from now on: what fell while it was paused is not missed, it was not wanted.
CREATE FUNCTION pgtaskd.remove_schedule(name text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgtaskd.schedules AS s WHERE s.name = remove_schedule.name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION pgtaskd.pause_schedule(name text, paused boolean) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pgtaskd.schedules AS s
       SET paused = pause_schedule.paused,
           since = CASE WHEN s.paused AND NOT pause_schedule.paused THEN now() ELSE s.since END
     WHERE s.name = pause_schedule.name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN true;
END
$$;

-- Fire schedule `name` at `fires` (instants in ascending order, possibly none), if its last
-- fire is still `previous` and its definition still the one of `since` (what the caller
-- read), and it is not paused: `last_fire` moves to
-- `up_to`, and each instant of `fires` makes one task of the schedule's queue, due at that
-- instant, with the idempotency key `schedule:NAME:INSTANT` (an insert of the same fire
-- again changes nothing). With `no_overlap`, a fire while the previous fire's task is QUEUED
-- or RUNNING makes no task. Answers what happened: `fired` (with the tasks' ids), `overlap`,
-- or `moved` (another daemon fired first or is firing now, the schedule was paused, changed
-- or removed: read it again). A row someone else holds locked is passed over, not waited
-- for: one schedule held in an operator's open transaction stops no other.
CREATE FUNCTION pgtaskd.fire_schedule(
    name     text,
    previous timestamptz,
    since    timestamptz,
    fires    timestamptz[],
    up_to    timestamptz,
    OUT outcome text,
    OUT task_ids bigint[]
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s pgtaskd.schedules%ROWTYPE;
BEGIN
    SELECT * INTO s FROM pgtaskd.schedules AS k
     WHERE k.name = fire_schedule.name
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR s.paused OR s.last_fire IS DISTINCT FROM fire_schedule.previous
       OR s.since IS DISTINCT FROM fire_schedule.since OR fire_schedule.up_to < s.since THEN
        outcome := 'moved';
        RETURN;
    END IF;
    IF s.no_overlap AND s.last_task IS NOT NULL AND cardinality(fire_schedule.fires) > 0
       AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS t
                    WHERE t.id = s.last_task AND t.status IN ('QUEUED', 'RUNNING')) THEN
        UPDATE pgtaskd.schedules AS k SET last_fire = fire_schedule.up_to
         WHERE k.name = fire_schedule.name;
        outcome := 'overlap';
        RETURN;
    END IF;
    WITH made AS (
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, idempotency_key)
        SELECT s.payload, s.queue, s.priority, f.at,
               'schedule:' || s.name || ':'
                   || to_char(f.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
          FROM unnest(fire_schedule.fires) WITH ORDINALITY AS f(at, n)
         ORDER BY f.n
        ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id
    )
    SELECT coalesce(array_agg(made.id ORDER BY made.id), '{}') INTO task_ids FROM made;
    UPDATE pgtaskd.schedules AS k
       SET last_fire = fire_schedule.up_to,
           last_task = coalesce(task_ids[cardinality(task_ids)], k.last_task)
     WHERE k.name = fire_schedule.name;
    outcome := 'fired';
END
$$;

-- A task keyed `schedule:...` is a schedule's fire, inserted by `pgtaskd.fire_schedule` (as
-- the schema's owner) alone: a producer's insert of such a key, which would make that fire
-- nothing or run its own payload as the fire, is refused (version 31). Only rows with such a
-- key run the function: other inserts pay the WHEN clause alone.
CREATE FUNCTION pgtaskd.refuse_schedule_keys() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_user IS DISTINCT FROM (SELECT pg_get_userbyid(n.nspowner) FROM pg_namespace AS n
                                       WHERE n.nspname = 'pgtaskd') THEN
        RAISE EXCEPTION 'idempotency keys starting with "schedule:" are kept for the fires of schedules (%)',
            NEW.idempotency_key
            USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.refuse_schedule_keys() FROM PUBLIC;
CREATE TRIGGER tasks_schedule_keys BEFORE INSERT ON pgtaskd.tasks
    FOR EACH ROW WHEN (NEW.idempotency_key LIKE 'schedule:%')
    EXECUTE FUNCTION pgtaskd.refuse_schedule_keys();

REVOKE ALL ON FUNCTION pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.remove_schedule(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.pause_schedule(text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz) FROM PUBLIC;

-- The daemon roles read the schedules and fire them, and steer them as they steer queues;
-- operators steer them; producers read them.
DO $$
DECLARE
    grantee oid;
    kind text;
BEGIN
    FOR grantee, kind IN
        SELECT a.grantee,
               CASE WHEN has_function_privilege(a.grantee, 'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint)', 'EXECUTE')
                    THEN 'daemon'
                    WHEN has_function_privilege(a.grantee, 'pgtaskd.pause_queue(text)', 'EXECUTE')
                    THEN 'operator'
                    ELSE 'reader' END
          FROM pg_class AS c, aclexplode(c.relacl) AS a
         WHERE c.oid = 'pgtaskd.task_view'::regclass::oid
           AND a.privilege_type = 'SELECT'
           AND a.grantee <> c.relowner
           AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %s', grantee::regrole);
        IF kind IN ('daemon', 'operator') THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION '
                           'pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean), '
                           'pgtaskd.remove_schedule(text), pgtaskd.pause_schedule(text, boolean) TO %s',
                           grantee::regrole);
        END IF;
        IF kind = 'daemon' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION '
                           'pgtaskd.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz) TO %s',
                           grantee::regrole);
        END IF;
    END LOOP;
END
$$;

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
    -- The schedules (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
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
    -- A stopping daemon parks the results it cannot write; rescuers write them (version 28).
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON pgtaskd.parked_results TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.park(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[]), '
                   'pgtaskd.write_parked(bigint, text) '
                   'TO %I', role_name);
    -- Schedules: read, fired, and steered like queues (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean), '
                   'pgtaskd.remove_schedule(text), pgtaskd.pause_schedule(text, boolean), '
                   'pgtaskd.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz) '
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
    -- Schedules: read and steered (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean), '
                   'pgtaskd.remove_schedule(text), pgtaskd.pause_schedule(text, boolean) '
                   'TO %I', role_name);
END
$$;
