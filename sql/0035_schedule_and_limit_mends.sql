-- pgtaskd schema, version 35: what a review of schedules and limits found.
--
-- - `--no-overlap` with `--missed catch-up`: a fire of many missed instants made one task
--   each, all QUEUED at once, though each after the first would overlap the one before. A
--   fire of a no-overlap schedule now makes at most one task, its earliest instant's.
-- - A schedule added again with the same definition (a deploy that re-adds its schedules
--   before the daemons are back) moved `since`, and dropped the missed fires its `--missed`
--   rule would have made. `put_schedule` moves `since` only when the definition changes or
--   the schedule is resumed.
-- - A queue's `retain` had no upper bound in the table (the CLI and the HTTP API stop at 100
--   years): one written through SQL as "10000 years" made `pgtaskd.prune` fail for every
--   queue (timestamp out of range) and `stats` fail. At most 100 years now; a row above it
--   is brought down to it.
--
-- Daemons of schema 34 need not be stopped: no signature changes.

CREATE OR REPLACE FUNCTION pgtaskd.put_schedule(
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
           -- The same definition again keeps its fires (version 35); a changed one, or a
           -- resume, counts from now.
           since = CASE WHEN (s.cron, s.every, s.payload, s.queue, s.tz, s.missed,
                              s.no_overlap, s.priority)
                             IS NOT DISTINCT FROM
                             (excluded.cron, excluded.every, excluded.payload, excluded.queue,
                              excluded.tz, excluded.missed, excluded.no_overlap,
                              excluded.priority)
                             AND NOT (s.paused AND NOT coalesce(put_schedule.paused, s.paused))
                        THEN s.since ELSE clock_timestamp() END
    RETURNING (xmax = 0) INTO created;
    RETURN created;
END
$$;

CREATE OR REPLACE FUNCTION pgtaskd.fire_schedule(
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
         -- No overlap: the earliest instant's task alone; each later one would overlap it
         -- (version 35).
         WHERE NOT s.no_overlap OR f.n = 1
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

UPDATE pgtaskd.queue_settings SET retain = interval '100 years'
 WHERE retain > interval '100 years';
ALTER TABLE pgtaskd.queue_settings
    DROP CONSTRAINT queue_settings_retain,
    ADD CONSTRAINT queue_settings_retain
        CHECK (retain >= interval '1 second' AND retain <= interval '100 years');
