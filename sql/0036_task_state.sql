-- pgtaskd schema, version 36 (release 0.2.0): the state of a task in a row of its own
-- (docs/storage.md, "The state in a row of its own"; docs/upgrading.md, "Schema 36").
--
-- `pgtaskd.tasks` keeps what the producer wrote and is never updated by pgtaskd again: the
-- payload is written once. Everything the claim, the heartbeat, the finish, the rescue, the
-- release, a cancel and a retry change lives in `pgtaskd.task_state`, one narrow row per task
-- (about 110 bytes against a task row of a payload and more), filled by a statement-level
-- trigger of the producer's own INSERT or COPY, and deleted with its task. So a claim and a
-- finish write a new version of that narrow row, never of the payload's; dead row versions
-- left behind a held snapshot are the narrow ones; a producer's lock on a task row no longer
-- delays any daemon.
--
-- Breaking, decided for 0.2.0: the state columns leave `pgtaskd.tasks` (`status`, `attempt`,
-- `cancel_requested`, `words`, `bytes`, `runes`, `error`, `lease_owner`, `lease_expires_at`,
-- `started_at`, `finished_at`, `claim_token`, `output`, `runs`, `errors`, `snoozes`): state is
-- read from `pgtaskd.task_view`, whose columns do not change, and a reader of the old columns
-- fails with "column does not exist", never with a stale value. The producers' statements do
-- not change.
--
-- Every row keeps its state as it is: QUEUED and waiting retries keep their `run_at`, RUNNING
-- rows keep their claims, tokens and leases (a daemon of this release rescues them as it
-- would have), parked results stay.
--
-- Daemons of schema 35 must be stopped first: a running one would go on claiming through the
-- functions below and fail at every finish, reading columns that are gone, so its tasks would
-- run and then be run again once their leases lapsed. The migration refuses to start while a
-- daemon's session is connected to the database (`application_name` `pgtaskd/<instance>`,
-- the migrating daemon's own aside). It then holds `ACCESS EXCLUSIVE` on `pgtaskd.tasks` while
-- it copies every row's state (producers' inserts wait for it, then go on: docs/upgrading.md
-- gives the time it takes per million rows); it waits for that lock at most 10 s (less when
-- the session's `lock_timeout` is shorter), so that a transaction left open on the table does
-- not hold every insert behind the migration's request, and then fails: run it again.

DO $$
DECLARE
    daemons text;
BEGIN
    SELECT pg_catalog.string_agg(a.application_name OPERATOR(pg_catalog.||) ' (pid '
                                 OPERATOR(pg_catalog.||) a.pid::text OPERATOR(pg_catalog.||) ')',
                                 ', ' ORDER BY a.pid)
      INTO daemons
      FROM pg_catalog.pg_stat_activity AS a
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
       AND a.application_name OPERATOR(pg_catalog.~~) 'pgtaskd/%'
       AND a.application_name OPERATOR(pg_catalog.<>) 'pgtaskd/cli'
       AND a.application_name OPERATOR(pg_catalog.<>) pg_catalog.current_setting('application_name');
    IF daemons IS NOT NULL THEN
        RAISE EXCEPTION 'pgtaskd daemons are connected to this database: %', daemons
            USING ERRCODE = '55006',
                  HINT = 'Stop every daemon before schema 36 (release 0.2.0), then migrate again: docs/upgrading.md, "Schema 36".';
    END IF;
    PERFORM pg_catalog.set_config('pgtaskd.lock_timeout_before_36',
                                  pg_catalog.current_setting('lock_timeout'), true);
    IF pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
       OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds' THEN
        PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    END IF;
END
$$;

LOCK TABLE pgtaskd.tasks IN ACCESS EXCLUSIVE MODE;

SELECT pg_catalog.set_config('lock_timeout',
                             pg_catalog.current_setting('pgtaskd.lock_timeout_before_36'), true);

-- The state of each task: today's state columns of `pgtaskd.tasks`, and copies of the task's
-- queue, priority, attempts and key (never changed after the insert) for the indexes and the
-- limits; `run_at` is when the task may next be claimed (a retry's backoff, a snooze). The
-- claims and finishes write a new version of the row each (their indexes name `status`, so no
-- update is HOT): room on each page keeps each logged as the bytes it changed.
CREATE TABLE pgtaskd.task_state (
    id               bigint      PRIMARY KEY,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL,
    run_at           timestamptz NOT NULL,
    status           text        NOT NULL DEFAULT 'QUEUED',
    attempt          int         NOT NULL DEFAULT 0,
    max_attempts     int,
    cancel_requested boolean     NOT NULL DEFAULT false,
    words            bigint      NOT NULL DEFAULT 0,
    bytes            bigint      NOT NULL DEFAULT 0,
    runes            bigint      NOT NULL DEFAULT 0,
    error            text,
    lease_owner      text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    claim_token      bigint,
    output           text,
    runs             int         NOT NULL DEFAULT 0,
    errors           jsonb,
    snoozes          int         NOT NULL DEFAULT 0,
    concurrency_key  text,

    CONSTRAINT tasks_status_check
        CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELED')),
    CONSTRAINT tasks_attempt_check CHECK (attempt >= 0),
    CONSTRAINT tasks_results_only_when_succeeded
        CHECK (status = 'SUCCEEDED' OR (words = 0 AND bytes = 0 AND runes = 0)),
    CONSTRAINT tasks_lease_only_when_running
        CHECK ((status = 'RUNNING') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT tasks_canceled_only_when_requested
        CHECK (status <> 'CANCELED' OR cancel_requested)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false,
    fillfactor = 50
);

INSERT INTO pgtaskd.task_state
       (id, queue, priority, run_at, status, attempt, max_attempts, cancel_requested, words,
        bytes, runes, error, lease_owner, lease_expires_at, started_at, finished_at,
        claim_token, output, runs, errors, snoozes, concurrency_key)
SELECT t.id, t.queue, t.priority, t.run_at, t.status, t.attempt, t.max_attempts,
       t.cancel_requested, t.words, t.bytes, t.runes, t.error, t.lease_owner,
       t.lease_expires_at, t.started_at, t.finished_at, t.claim_token, t.output, t.runs,
       t.errors, t.snoozes, t.concurrency_key
  FROM pgtaskd.tasks AS t;

-- As on the table since schema 19: rows written before it may not hold them.
ALTER TABLE pgtaskd.task_state
    ADD CONSTRAINT tasks_error_when_failed
        CHECK ((status OPERATOR(pg_catalog.<>) 'FAILED' OR error IS NOT NULL)
               AND (error IS NULL OR status OPERATOR(pg_catalog.=) ANY (ARRAY['FAILED', 'QUEUED', 'RUNNING'])))
        NOT VALID,
    ADD CONSTRAINT tasks_output_only_when_succeeded
        CHECK (status OPERATOR(pg_catalog.=) 'SUCCEEDED' OR output IS NULL) NOT VALID;

COMMENT ON TABLE pgtaskd.task_state IS
    'pgtaskd: the state of each task, written by the daemon''s functions only; read it through pgtaskd.task_view';
COMMENT ON COLUMN pgtaskd.task_state.claim_token IS
    'The token of the claim that holds or last held the task: unique per claim; every write after a claim is fenced on it.';
COMMENT ON COLUMN pgtaskd.task_state.runs IS
    'How many times the task''s work was started (every claim; never lowered, not even by a retry).';
COMMENT ON COLUMN pgtaskd.task_state.errors IS
    'The last ten failed attempts: [{"attempt", "run", "at", "error"}], oldest first; each error at most 2,000 characters.';
COMMENT ON COLUMN pgtaskd.task_state.snoozes IS
    'How many times the handler asked to run the task later without using an attempt (at most 100; a retry resets it).';
COMMENT ON COLUMN pgtaskd.task_state.run_at IS
    'When the task may next be claimed: the producer''s run_at, then a retry''s or a snooze''s.';

-- The view reads the state from its table, with every column, name and type it had: a task is
-- its state row and its task row, joined by primary key, so that a row-level security policy
-- on either table holds through the view. The task row is read by its primary key for each
-- state row (`OFFSET 0` keeps the planner from making a join of it, which, planned on
-- statistics that say "empty", would read the whole primary key for each row).
CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT s.id, s.queue, t.payload, s.status, s.priority, s.run_at, s.attempt,
       coalesce(s.max_attempts, pgtaskd.queue_max_attempts(s.queue)) AS max_attempts,
       s.cancel_requested, s.words, s.bytes, s.runes, s.error, s.lease_owner,
       s.lease_expires_at, t.created_at, s.started_at, s.finished_at, t.idempotency_key,
       s.claim_token, s.output, t.traceparent,
       coalesce((SELECT x.id FROM pgtaskd.site AS x), 'nosite') || '-' || s.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       s.runs, s.errors, s.snoozes, s.concurrency_key
  FROM pgtaskd.task_state AS s
 CROSS JOIN LATERAL (SELECT x.payload, x.created_at, x.idempotency_key, x.traceparent
                       FROM pgtaskd.tasks AS x
                      WHERE x.id = s.id
                     OFFSET 0) AS t;

-- The indexes of the state, with their names of the table.
DROP STATISTICS pgtaskd.tasks_queue_status;
DROP INDEX pgtaskd.tasks_claim_idx, pgtaskd.tasks_lease_idx, pgtaskd.tasks_finished_idx,
    pgtaskd.tasks_list_queue_idx, pgtaskd.tasks_list_status_idx;

CREATE INDEX tasks_claim_idx ON pgtaskd.task_state (queue, priority DESC, id)
    WHERE status = 'QUEUED';
CREATE INDEX tasks_lease_idx ON pgtaskd.task_state (lease_expires_at)
    WHERE status = 'RUNNING';
CREATE INDEX tasks_finished_idx ON pgtaskd.task_state (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX tasks_list_queue_idx ON pgtaskd.task_state (queue, status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');
CREATE INDEX tasks_list_status_idx ON pgtaskd.task_state (status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');
CREATE STATISTICS pgtaskd.tasks_queue_status (mcv) ON queue, status FROM pgtaskd.task_state;

-- The state columns leave the task's row. `DROP COLUMN` rewrites nothing: a row keeps those
-- bytes until retention deletes it.
ALTER TABLE pgtaskd.tasks
    DROP CONSTRAINT tasks_status_check,
    DROP CONSTRAINT tasks_attempt_check,
    DROP CONSTRAINT tasks_results_only_when_succeeded,
    DROP CONSTRAINT tasks_lease_only_when_running,
    DROP CONSTRAINT tasks_canceled_only_when_requested,
    DROP CONSTRAINT tasks_error_when_failed,
    DROP CONSTRAINT tasks_output_only_when_succeeded,
    DROP COLUMN status,
    DROP COLUMN attempt,
    DROP COLUMN cancel_requested,
    DROP COLUMN words,
    DROP COLUMN bytes,
    DROP COLUMN runes,
    DROP COLUMN error,
    DROP COLUMN lease_owner,
    DROP COLUMN lease_expires_at,
    DROP COLUMN started_at,
    DROP COLUMN finished_at,
    DROP COLUMN claim_token,
    DROP COLUMN output,
    DROP COLUMN runs,
    DROP COLUMN errors,
    DROP COLUMN snoozes;

-- Never updated by pgtaskd: its pages need no room for new versions. The pages already
-- written keep theirs until retention empties them.
ALTER TABLE pgtaskd.tasks SET (fillfactor = 100);

COMMENT ON TABLE pgtaskd.tasks IS
    'pgtaskd task queue: INSERT (payload) to enqueue; state and results in pgtaskd.task_view; pgtaskd.cancel(id) to cancel';

-- The producer's statement fills the state table itself, whatever its size (an INSERT, an
-- INSERT ... SELECT, a COPY): one INSERT ... SELECT per statement over its new rows. With the
-- owner's rights: producers have no right on the state table. Like every trigger, these do
-- not fire where `session_replication_role` is `replica` (a logical replication apply, a
-- restore with triggers disabled): those copy both tables.
CREATE FUNCTION pgtaskd.tasks_state() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pgtaskd.task_state (id, queue, priority, run_at, max_attempts, concurrency_key)
    SELECT n.id, n.queue, n.priority, n.run_at, n.max_attempts, n.concurrency_key
      FROM new_tasks AS n
    -- A state row loaded before its task row (a data-only restore of both tables) is kept.
        ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_state() FROM PUBLIC;
CREATE TRIGGER tasks_state AFTER INSERT ON pgtaskd.tasks
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.tasks_state();

-- A task deleted (retention deletes both rows itself; an operator's DELETE too) takes its
-- state with it.
CREATE FUNCTION pgtaskd.tasks_state_gone() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgtaskd.task_state AS s
     WHERE s.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o));
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_state_gone() FROM PUBLIC;
CREATE TRIGGER tasks_state_gone AFTER DELETE ON pgtaskd.tasks
    REFERENCING OLD TABLE AS gone_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.tasks_state_gone();

CREATE FUNCTION pgtaskd.tasks_state_truncate() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    TRUNCATE pgtaskd.task_state;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_state_truncate() FROM PUBLIC;
CREATE TRIGGER tasks_state_truncate AFTER TRUNCATE ON pgtaskd.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.tasks_state_truncate();

-- The schema's owner may still change a task's queue, priority, attempts or key, or move a
-- QUEUED task's `run_at` (pgtaskd never does): the state's copies follow. Its id never
-- changes: that would part the task from its state.
CREATE FUNCTION pgtaskd.tasks_state_copy() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.id OPERATOR(pg_catalog.<>) OLD.id THEN
        RAISE EXCEPTION 'the id of a task does not change (task %)', OLD.id
            USING ERRCODE = '42501';
    END IF;
    UPDATE pgtaskd.task_state AS s
       SET queue = NEW.queue,
           priority = NEW.priority,
           max_attempts = NEW.max_attempts,
           concurrency_key = NEW.concurrency_key,
           run_at = CASE WHEN s.status OPERATOR(pg_catalog.=) 'QUEUED'
                              AND NEW.run_at IS DISTINCT FROM OLD.run_at
                         THEN NEW.run_at ELSE s.run_at END
     WHERE s.id OPERATOR(pg_catalog.=) NEW.id;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_state_copy() FROM PUBLIC;
CREATE TRIGGER tasks_state_copy
    AFTER UPDATE OF id, queue, priority, run_at, max_attempts, concurrency_key ON pgtaskd.tasks
    FOR EACH ROW
    WHEN ((OLD.id, OLD.queue, OLD.priority, OLD.run_at, OLD.max_attempts, OLD.concurrency_key)
          IS DISTINCT FROM
          (NEW.id, NEW.queue, NEW.priority, NEW.run_at, NEW.max_attempts, NEW.concurrency_key))
    EXECUTE FUNCTION pgtaskd.tasks_state_copy();

-- Every role that reads, updates or deletes task rows gets the same right on their state,
-- PUBLIC included: the roles of the grant functions keep working without being granted again.
-- And nobody but the owner updates a task row any more: the right to, which daemon roles had
-- for the state, would now let them rewrite payloads or part a task from its state.
DO $$
DECLARE
    g record;
    grantee text;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.privilege_type
          FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.oid OPERATOR(pg_catalog.=) 'pgtaskd.tasks'::pg_catalog.regclass
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['SELECT', 'UPDATE', 'DELETE'])
    LOOP
        grantee := CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                        ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END;
        EXECUTE pg_catalog.format('GRANT %s ON pgtaskd.task_state TO %s', g.privilege_type, grantee);
        IF g.privilege_type OPERATOR(pg_catalog.=) 'UPDATE' THEN
            EXECUTE pg_catalog.format('REVOKE UPDATE ON pgtaskd.tasks FROM %s', grantee);
        END IF;
    END LOOP;
END
$$;

-- Cancel a task: QUEUED to CANCELED at once, or a request recorded on a RUNNING task and
-- `NOTIFY pgtaskd_cancel`; returns the status before and after ("Cancel is a request").
-- With its owner's rights, so that producers need no UPDATE right.
CREATE OR REPLACE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- `coalesce(status, '')`: found by primary key, never by a scan of a partial index.
    UPDATE pgtaskd.task_state
       SET status = 'CANCELED', cancel_requested = true, finished_at = now(), error = NULL
     WHERE id = task_id AND coalesce(status, '') = 'QUEUED'
    RETURNING 'QUEUED', status INTO previous, current;
    IF FOUND THEN
        PERFORM pgtaskd.notify_done(ARRAY[task_id]);
        RETURN;
    END IF;

    UPDATE pgtaskd.task_state SET cancel_requested = true
     WHERE id = task_id AND coalesce(status, '') = 'RUNNING'
    RETURNING 'RUNNING', status INTO previous, current;
    IF FOUND THEN
        PERFORM pgtaskd.notify('pgtaskd_cancel', task_id::text);
        RETURN;
    END IF;

    SELECT status, status INTO previous, current FROM pgtaskd.task_state WHERE id = task_id;
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
       AND EXISTS (SELECT 1 FROM pgtaskd.task_state AS t
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

-- Claim: QUEUED to RUNNING for up to `max_tasks` tasks of the served queues, one winner per
-- task ("One winner"), within a byte budget ("Bounded memory"), skipping paused queues,
-- optionally after a position ("Claims after a position"), each with a claim token of its
-- own ("One claim, one token"). The planner settings keep its plan right under statistics
-- taken while the table was empty ("SQL interface", "Functions").
CREATE OR REPLACE FUNCTION pgtaskd.claim(
    queues         text[],
    max_tasks      bigint,
    owner          text,
    lease_ms       float8,
    max_bytes      bigint,
    take_one       boolean,
    max_payload    bigint,
    after_priority int,
    after_id       bigint
) RETURNS TABLE (task_id bigint, task_attempt int, task_payload text, task_bytes bigint,
                 waited_s float8, task_priority int, task_claim bigint, task_run int,
                 task_key text, task_idempotency_key text, task_traceparent text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    open_queues text[] := claim.queues;
    rated       text[] := '{}';
    limited_ids bigint[] := '{}';
    again_in    float8;
    settings    record;
    decided_at  timestamptz;
    running_now bigint;
    started     bigint;
    oldest      timestamptz;
    room        bigint;
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    END IF;
    -- Limited queues, in name order (so that two claims never wait for each other's locks in
    -- turn; they do not wait at all).
    FOR settings IN
        SELECT s.queue, s.max_running, s.max_running_per_key, s.rate_limit, s.rate_period
          FROM pgtaskd.queue_settings AS s
         WHERE s.queue = ANY (claim.queues)
           AND (s.max_running IS NOT NULL OR s.max_running_per_key IS NOT NULL
                OR s.rate_limit IS NOT NULL)
         ORDER BY s.queue
    LOOP
        open_queues := pg_catalog.array_remove(open_queues, settings.queue);
        CONTINUE WHEN EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p
                               WHERE p.queue = settings.queue);
        IF NOT pg_catalog.pg_try_advisory_xact_lock(1885828196, pg_catalog.hashtext(settings.queue)) THEN
            -- Another claim decides for this queue now: call again shortly.
            again_in := least(coalesce(again_in, 0.02), 0.02);
            CONTINUE;
        END IF;
        -- Each statement from here sees what the previous holder of the lock committed.
        decided_at := pg_catalog.clock_timestamp();
        room := claim.max_tasks;
        IF settings.max_running IS NOT NULL THEN
            SELECT count(*) INTO running_now
              FROM pgtaskd.task_state AS k
             WHERE k.status = 'RUNNING' AND k.queue = settings.queue;
            room := least(room, settings.max_running - running_now);
        END IF;
        IF settings.rate_limit IS NOT NULL THEN
            rated := rated || settings.queue;
            -- A start counts for its window and 50 ms more: a handler starts a little after its
            -- claim, by a delay that varies.
            DELETE FROM pgtaskd.queue_starts AS r
             WHERE r.queue = settings.queue
               AND r.started_at <= decided_at - settings.rate_period - interval '50 milliseconds';
            SELECT count(*), min(r.started_at) INTO started, oldest
              FROM pgtaskd.queue_starts AS r
             WHERE r.queue = settings.queue;
            room := least(room, settings.rate_limit - started);
            IF started >= settings.rate_limit THEN
                again_in := least(coalesce(again_in, 'infinity'),
                                  greatest(extract(epoch FROM oldest + settings.rate_period
                                                   + interval '50 milliseconds' - decided_at)::float8,
                                           0.001));
            END IF;
        END IF;
        CONTINUE WHEN room <= 0;
        IF settings.max_running_per_key IS NULL THEN
            limited_ids := limited_ids || ARRAY(
                SELECT k.id FROM pgtaskd.task_state AS k
                 WHERE k.status = 'QUEUED' AND k.queue = settings.queue AND k.run_at <= now()
                   AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS p WHERE p.id = k.id)
                 ORDER BY k.priority DESC, k.id
                 LIMIT room
                   FOR UPDATE SKIP LOCKED);
        ELSE
            -- The first tasks in claim order (a bounded read) whose key has a slot left,
            -- counting the ones taken before it; tasks without a key are not counted by key.
            -- Then locked, skipping what another transaction holds.
            limited_ids := limited_ids || ARRAY(
                SELECT k.id FROM pgtaskd.task_state AS k
                 WHERE k.id = ANY (ARRAY(
                        SELECT r.id
                          FROM (SELECT w.id, w.priority, w.concurrency_key,
                                       row_number() OVER (PARTITION BY w.concurrency_key
                                                          ORDER BY w.priority DESC, w.id) AS nth
                                  FROM (SELECT q.id, q.priority, q.concurrency_key
                                          FROM pgtaskd.task_state AS q
                                         WHERE q.status = 'QUEUED' AND q.queue = settings.queue
                                           AND q.run_at <= now()
                                           AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS p
                                                        WHERE p.id = q.id)
                                         ORDER BY q.priority DESC, q.id
                                         LIMIT 1000 + claim.max_tasks) AS w) AS r
                          LEFT JOIN (SELECT b.concurrency_key, count(*) AS n
                                       FROM pgtaskd.task_state AS b
                                      WHERE b.status = 'RUNNING' AND b.queue = settings.queue
                                        AND b.concurrency_key IS NOT NULL
                                      GROUP BY b.concurrency_key) AS busy
                            ON busy.concurrency_key = r.concurrency_key
                         WHERE r.concurrency_key IS NULL
                            OR coalesce(busy.n, 0) + r.nth <= settings.max_running_per_key
                         ORDER BY r.priority DESC, r.id
                         LIMIT room))
                   AND coalesce(k.status, '') = 'QUEUED'
                   FOR UPDATE SKIP LOCKED);
        END IF;
    END LOOP;
    RETURN QUERY
    WITH candidates AS MATERIALIZED (
        SELECT c.id, c.priority, c.size
          FROM unnest(open_queues) AS q(name)
         CROSS JOIN LATERAL (
                -- After the position: the rest of its priority...
                -- The payload's size from the task row; a state row without its task row
                -- (written by hand) is never claimed.
                SELECT k.id, k.priority, octet_length(p.payload)::bigint AS size
                  FROM pgtaskd.task_state AS k
                  JOIN pgtaskd.tasks AS p ON p.id = k.id
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority = claim.after_priority
                   AND k.id > claim.after_id
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE OF k SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
        UNION ALL
        SELECT c.id, c.priority, c.size
          FROM unnest(open_queues) AS q(name)
         CROSS JOIN LATERAL (
                -- ...then the lower priorities.
                -- The payload's size from the task row; a state row without its task row
                -- (written by hand) is never claimed.
                SELECT k.id, k.priority, octet_length(p.payload)::bigint AS size
                  FROM pgtaskd.task_state AS k
                  JOIN pgtaskd.tasks AS p ON p.id = k.id
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority < CASE WHEN claim.after_id IS NULL THEN 32768
                                         ELSE coalesce(claim.after_priority, 32768) END
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE OF k SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
        UNION ALL
        -- The limited queues' tasks, picked and locked above.
        SELECT k.id, k.priority, octet_length(p.payload)::bigint AS size
          FROM pgtaskd.task_state AS k
          JOIN pgtaskd.tasks AS p ON p.id = k.id
         WHERE k.id = ANY (limited_ids)
         ORDER BY 2 DESC, 1
         LIMIT claim.max_tasks
    ), sized AS MATERIALIZED (
        SELECT s.id, s.size,
               row_number() OVER w AS n,
               sum(CASE WHEN s.size > claim.max_payload THEN 0 ELSE s.size END) OVER w AS running
          FROM candidates AS s
        WINDOW w AS (ORDER BY s.priority DESC, s.id)
    ), picked AS MATERIALIZED (
        SELECT z.id FROM sized AS z
         WHERE z.running <= claim.max_bytes OR (claim.take_one AND z.n = 1)
    ), claimed AS (
        UPDATE pgtaskd.task_state AS t
           SET status = 'RUNNING',
               attempt = t.attempt + 1,
               runs = greatest(t.runs, t.attempt) + 1,
               claim_token = (SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN 0::bigint
                                          ELSE ((('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(
                                                    pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                                                 - 1) % 65536) << 47 END)
                             | (pg_catalog.nextval('pgtaskd.claim_tokens') & 140737488355327),
               lease_owner = claim.owner,
               lease_expires_at = now() + claim.lease_ms * interval '1 millisecond',
               started_at = now()
          -- The task as its producer wrote it: the payload and what the handler is told.
          FROM pgtaskd.tasks AS p
         WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
           AND coalesce(t.status, '') = 'QUEUED'
           AND p.id = t.id
        RETURNING t.id, t.attempt, t.priority, t.claim_token, t.queue,
                  CASE WHEN octet_length(p.payload) > claim.max_payload THEN NULL
                       ELSE p.payload END AS payload,
                  octet_length(p.payload)::bigint AS size,
                  extract(epoch FROM now() - greatest(p.created_at, t.run_at))::float8 AS waited,
                  t.runs,
                  coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || t.id || '-'
                      || (extract(epoch FROM p.created_at) * 1000000)::bigint AS task_key,
                  p.idempotency_key, p.traceparent
    ), starts AS (
        -- Each start of a rate-limited queue, for the next claims to count.
        INSERT INTO pgtaskd.queue_starts (queue, started_at)
        SELECT claimed.queue, coalesce(decided_at, now()) FROM claimed
         WHERE claimed.queue = ANY (rated)
    )
    (SELECT claimed.id, claimed.attempt, claimed.payload, claimed.size, claimed.waited,
            claimed.priority::int, claimed.claim_token, claimed.runs, claimed.task_key,
            claimed.idempotency_key, claimed.traceparent
       FROM claimed
      ORDER BY claimed.priority DESC, claimed.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8, NULL::int, NULL::bigint,
            NULL::int, NULL::text, NULL::text, NULL::text
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1)
    UNION ALL
    SELECT NULL::bigint, NULL::int, NULL::text, NULL::bigint, again_in, NULL::int, NULL::bigint,
           NULL::int, NULL::text, NULL::text, NULL::text
     WHERE again_in IS NOT NULL;
END
$$;

-- Finish: commit many claims' outcomes in one statement, each fenced on its claim token
-- ("Fenced finish", "Results with status"); rows someone else holds locked are skipped and
-- reported ("No one else's lock delays a batch"); one `pgtaskd_done` notification for the
-- rows it ended ("Completion notifications").
CREATE OR REPLACE FUNCTION pgtaskd.finish(
    tokens   bigint[],
    ids      bigint[],
    statuses text[],
    words    bigint[],
    bytes    bigint[],
    runes    bigint[],
    errors   text[],
    outputs  text[],
    retry_in float8[],
    wait     boolean
) RETURNS TABLE (task_id bigint, written text, current text, skipped boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT *
          FROM unnest(finish.tokens, finish.ids, finish.statuses, finish.words,
                      finish.bytes, finish.runes, finish.errors, finish.outputs,
                      finish.retry_in)
               AS f(token, id, status, words, bytes, runes, error, output, retry_in)
         ORDER BY f.id
    ), held AS MATERIALIZED (
        -- The rows to write, locked in id order: by default those no one else holds...
        SELECT h.id FROM (
            SELECT k.id FROM pgtaskd.task_state AS k
             WHERE NOT finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE SKIP LOCKED) AS h
        UNION ALL
        -- ...or, asked to wait, every one of them.
        SELECT w.id FROM (
            SELECT k.id FROM pgtaskd.task_state AS k
             WHERE finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE) AS w
    ), done AS (
        UPDATE pgtaskd.task_state AS t
           -- Tried again: a failed attempt with a delay, attempts left, no cancel; or a
           -- snooze, which uses no attempt, the 100th snooze aside (version 32).
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED'
                             WHEN f.status = 'FAILED' AND f.retry_in IS NOT NULL
                                  AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue)) THEN 'QUEUED'
                             WHEN f.status = 'SNOOZED' AND t.snoozes < 100 THEN 'QUEUED'
                             WHEN f.status = 'SNOOZED' THEN 'FAILED'
                             ELSE f.status END,
               attempt = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND t.snoozes < 100 THEN t.attempt - 1
                              ELSE t.attempt END,
               snoozes = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND t.snoozes < 100 THEN t.snoozes + 1
                              ELSE t.snoozes END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.runes END,
               output = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.output END,
               error = CASE WHEN t.cancel_requested THEN NULL
                            WHEN f.status = 'SNOOZED' AND t.snoozes < 100 THEN t.error
                            WHEN f.status NOT IN ('FAILED', 'SNOOZED') THEN NULL
                            ELSE f.error END,
               -- Every failed attempt's error, the last ten (version 30); a snooze is none.
               errors = CASE WHEN t.cancel_requested OR f.status NOT IN ('FAILED', 'SNOOZED')
                                  OR (f.status = 'SNOOZED' AND t.snoozes < 100) THEN t.errors
                             ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs, f.error) END,
               run_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                  AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                             THEN now() + f.retry_in * interval '1 second'
                             WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                  AND t.snoozes < 100
                             THEN now() + coalesce(f.retry_in, 0) * interval '1 second'
                             ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                                  THEN NULL
                                  WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                       AND t.snoozes < 100
                                  THEN NULL ELSE now() END
          FROM input AS f
         -- Looked up by primary key, the rows held as the index condition (version 11).
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           AND t.id = f.id
           -- Written so that it cannot steer the lookup to the partial index of RUNNING rows.
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = f.token
           -- Only a recorded cancel request ends a task CANCELED.
           AND (f.status <> 'CANCELED' OR t.cancel_requested)
        RETURNING t.id, t.status, t.queue
    ), freed AS (
        -- The tasks that stopped running free their slots of a running limit (version 33).
        SELECT pgtaskd.notify_freed(array_agg(done.queue)) AS sent FROM done
    ), notified AS (
        -- One row whatever `done` holds (an aggregate); volatile, so evaluated once, after
        -- every row of `done` was written. A task QUEUED again has not ended.
        SELECT pgtaskd.notify_done(array_agg(done.id)) AS sent FROM done
         WHERE done.status <> 'QUEUED'
    )
    SELECT f.id, d.status,
           -- What a finish that wrote nothing found, as the row stands (not locked).
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.task_state AS c WHERE c.id = f.id) END,
           -- Skipped: not written, not held, and still this claim's.
           d.id IS NULL
             AND NOT (f.id = ANY (ARRAY(SELECT held.id FROM held)))
             AND EXISTS (SELECT 1 FROM pgtaskd.task_state AS c
                          WHERE c.id = f.id AND c.claim_token = f.token
                            AND coalesce(c.status, '') = 'RUNNING')
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id
     CROSS JOIN notified
     CROSS JOIN freed;
END
$$;

-- Extend by `lease_ms` the leases of the claims `tokens` of tasks `ids` (one token per id)
-- that are still held, without waiting for any row lock: a row another transaction holds is
-- answered with `task_extended` false (docs/design.md, "No one else's lock delays a batch").
-- A claim missing from the answer is no longer held.
CREATE OR REPLACE FUNCTION pgtaskd.heartbeat(ids bigint[], tokens bigint[], lease_ms float8)
RETURNS TABLE (task_id bigint, task_extended boolean, task_cancel_requested boolean)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH held AS MATERIALIZED (
        SELECT k.id
          FROM pgtaskd.task_state AS k
         WHERE k.id = ANY (heartbeat.ids) AND k.claim_token = ANY (heartbeat.tokens)
           AND coalesce(k.status, '') = 'RUNNING'
         ORDER BY k.id
           FOR UPDATE SKIP LOCKED
    ), extended AS (
        UPDATE pgtaskd.task_state AS t
           SET lease_expires_at = now() + heartbeat.lease_ms * interval '1 millisecond'
          FROM held
         WHERE t.id = held.id
        RETURNING t.id, t.cancel_requested
    )
    SELECT e.id, true, e.cancel_requested FROM extended AS e
    UNION ALL
    SELECT k.id, false, k.cancel_requested
      FROM pgtaskd.task_state AS k
     WHERE k.id = ANY (heartbeat.ids) AND k.claim_token = ANY (heartbeat.tokens)
       AND coalesce(k.status, '') = 'RUNNING'
       AND k.id NOT IN (SELECT held.id FROM held);
END
$$;

-- Extend the lease of claim `token` of task `id`, waiting for its row if another transaction
-- holds it (up to the session's `lock_timeout`): one row with `cancel_requested`, none when
-- the claim is no longer held.
CREATE OR REPLACE FUNCTION pgtaskd.extend_lease(id bigint, token bigint, lease_ms float8)
RETURNS TABLE (task_cancel_requested boolean)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    UPDATE pgtaskd.task_state AS t
       SET lease_expires_at = now() + extend_lease.lease_ms * interval '1 millisecond'
     WHERE t.id = extend_lease.id AND t.claim_token = extend_lease.token
       AND coalesce(t.status, '') = 'RUNNING'
    RETURNING t.cancel_requested;
END
$$;

-- Take back up to `max_tasks` expired leases, other than those of instance `owner`: QUEUED
-- with a backoff while attempts remain, else FAILED; CANCELED where a cancel was requested.
-- Rows are picked with SKIP LOCKED and re-checked (still RUNNING, same token, lease still
-- expired), so rescuers of many daemons never fight and a lease extended meanwhile stays.
-- The tasks it ends are announced on `pgtaskd_done` in the same transaction. A claim whose
-- result a stopped daemon parked is left to `write_parked` ("Parked results", version 28).
CREATE OR REPLACE FUNCTION pgtaskd.rescue(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_attempt int, task_previous_owner text, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT k.id, k.attempt, k.claim_token, k.lease_owner
          FROM pgtaskd.task_state AS k
         WHERE k.status = 'RUNNING' AND k.lease_expires_at < now()
           AND k.lease_owner IS DISTINCT FROM rescue.owner
           -- A result is parked for this claim (version 28).
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.parked_results AS p
                            WHERE p.task_id = k.id AND p.claim_token = k.claim_token)
         ORDER BY k.lease_expires_at
         LIMIT rescue.max_tasks
           FOR UPDATE SKIP LOCKED
    ), rescued AS (
        UPDATE pgtaskd.task_state AS t
           SET status = CASE
                   WHEN t.cancel_requested THEN 'CANCELED'
                   WHEN t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue)) THEN 'QUEUED'
                   ELSE 'FAILED'
               END,
               error = CASE
                   WHEN NOT t.cancel_requested AND t.attempt >= coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                   THEN format('lease lost after %s attempts (last held by %s)',
                               t.attempt, t.lease_owner)
               END,
               -- A lost lease is a failed attempt (version 30).
               errors = CASE
                   WHEN t.cancel_requested THEN t.errors
                   ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs,
                            format('lease lost (last held by %s)', t.lease_owner))
               END,
               -- The n-th lost lease waits (n-1)^2 seconds, at most ten minutes.
               run_at = CASE
                   WHEN NOT t.cancel_requested AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                   THEN now() + least(power(t.attempt - 1, 2), 600) * interval '1 second'
                   ELSE t.run_at
               END,
               finished_at = CASE
                   WHEN t.cancel_requested OR t.attempt >= coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue)) THEN now()
               END,
               lease_owner = NULL,
               lease_expires_at = NULL
          FROM expired
         WHERE t.id = expired.id
           AND t.status = 'RUNNING'
           AND t.claim_token IS NOT DISTINCT FROM expired.claim_token
           AND t.lease_expires_at < now()
        RETURNING t.id, expired.attempt, expired.lease_owner, t.status, t.queue
    ), freed AS (
        SELECT pgtaskd.notify_freed(array_agg(r.queue)) AS sent FROM rescued AS r
    ), notified AS (
        SELECT pgtaskd.notify_done(array_agg(r.id)) AS sent
          FROM rescued AS r WHERE r.status <> 'QUEUED'
    )
    SELECT r.id, r.attempt, r.lease_owner, r.status
      FROM rescued AS r CROSS JOIN notified CROSS JOIN freed;
END
$$;

-- Park the results of claims `tokens` of tasks `ids` (the arrays of `pgtaskd.finish`), for
-- the rows still RUNNING under those claims. Reads the rows without locking them, so that a
-- row someone else holds does not hold it up. Returns the ids parked, now or before.
CREATE OR REPLACE FUNCTION pgtaskd.park(
    tokens   bigint[],
    ids      bigint[],
    statuses text[],
    words    bigint[],
    bytes    bigint[],
    runes    bigint[],
    errors   text[],
    outputs  text[],
    retry_in float8[]
) RETURNS TABLE (task_id bigint)
LANGUAGE plpgsql
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO pgtaskd.parked_results
           (task_id, claim_token, status, words, bytes, runes, error, output, retry_in)
    SELECT f.id, f.token, f.status, f.words, f.bytes, f.runes, f.error, f.output, f.retry_in
      FROM unnest(park.tokens, park.ids, park.statuses, park.words, park.bytes, park.runes,
                  park.errors, park.outputs, park.retry_in)
           AS f(token, id, status, words, bytes, runes, error, output, retry_in)
     WHERE EXISTS (SELECT 1 FROM pgtaskd.task_state AS k
                    WHERE k.id = f.id AND k.claim_token = f.token
                      AND coalesce(k.status, '') = 'RUNNING')
    ON CONFLICT (task_id, claim_token) DO NOTHING;
    RETURN QUERY
    SELECT p.task_id
      FROM pgtaskd.parked_results AS p,
           unnest(park.ids, park.tokens) AS f(id, token)
     WHERE p.task_id = f.id AND p.claim_token = f.token;
END
$$;

-- Write up to `max_tasks` parked results whose claims' leases expired (other than those of
-- instance `owner`), through `pgtaskd.finish`: fenced on the parked token, the rows locked
-- as they are picked and those someone else holds passed over (version 34). Then drop every
-- parked result whose claim is over, and those `finish` declined (their claims are left to
-- the rescue). One row per result written: the task and the status written.
CREATE OR REPLACE FUNCTION pgtaskd.write_parked(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    due_tokens   bigint[];
    due_ids      bigint[];
    due_statuses text[];
    due_words    bigint[];
    due_bytes    bigint[];
    due_runes    bigint[];
    due_errors   text[];
    due_outputs  text[];
    due_retry_in float8[];
BEGIN
    SELECT array_agg(d.claim_token ORDER BY d.task_id), array_agg(d.task_id ORDER BY d.task_id),
           array_agg(d.status ORDER BY d.task_id), array_agg(d.words ORDER BY d.task_id),
           array_agg(d.bytes ORDER BY d.task_id), array_agg(d.runes ORDER BY d.task_id),
           array_agg(d.error ORDER BY d.task_id), array_agg(d.output ORDER BY d.task_id),
           array_agg(d.retry_in ORDER BY d.task_id)
      INTO due_tokens, due_ids, due_statuses, due_words, due_bytes, due_runes, due_errors,
           due_outputs, due_retry_in
      FROM (SELECT p.*
              FROM pgtaskd.parked_results AS p
              JOIN pgtaskd.task_state AS k ON k.id = p.task_id AND k.claim_token = p.claim_token
             WHERE coalesce(k.status, '') = 'RUNNING' AND k.lease_expires_at < now()
               AND k.lease_owner IS DISTINCT FROM write_parked.owner
             ORDER BY p.parked_at
             LIMIT write_parked.max_tasks
               FOR UPDATE OF k SKIP LOCKED) AS d;
    IF due_ids IS NOT NULL THEN
        -- The rows are this transaction's: `finish` skips none of them.
        RETURN QUERY
        SELECT f.task_id, f.written
          FROM pgtaskd.finish(due_tokens, due_ids, due_statuses, due_words, due_bytes,
                              due_runes, due_errors, due_outputs, due_retry_in, false) AS f
         WHERE f.written IS NOT NULL;
    END IF;
    -- Every parked result whose claim is over, the declined ones among them once their claim
    -- is left to the rescue: a declined result's row is still RUNNING under its token.
    DELETE FROM pgtaskd.parked_results AS p
     WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS k
                        WHERE k.id = p.task_id AND k.claim_token = p.claim_token
                          AND coalesce(k.status, '') = 'RUNNING')
        OR (p.task_id, p.claim_token) IN (SELECT u.id, u.token
                                            FROM unnest(due_ids, due_tokens) AS u(id, token));
END
$$;

-- Give the claim `token` of task `id` back without a result, as a shutdown does: QUEUED with
-- the attempt not counted, or CANCELED where a cancel was requested. Without `wait`, a row
-- someone else holds fails with lock_not_available (55P03). One row: the status written
-- (null when the claim was not held) and the task's status now (null: no such task).
CREATE OR REPLACE FUNCTION pgtaskd.release(id bigint, token bigint, wait boolean)
RETURNS TABLE (written text, current text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH unlocked AS MATERIALIZED (
        SELECT k.id FROM pgtaskd.task_state AS k
         WHERE NOT release.wait AND k.id = release.id
           FOR UPDATE NOWAIT
    ), done AS (
        UPDATE pgtaskd.task_state AS t
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED' ELSE 'QUEUED' END,
               attempt = CASE WHEN t.cancel_requested THEN t.attempt ELSE t.attempt - 1 END,
               started_at = CASE WHEN t.cancel_requested THEN t.started_at END,
               finished_at = CASE WHEN t.cancel_requested THEN now() END,
               lease_owner = NULL,
               lease_expires_at = NULL
         WHERE t.id = release.id AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = release.token
           AND (release.wait OR t.id IN (SELECT u.id FROM unlocked AS u))
        RETURNING t.id, t.status, t.queue
    ), freed AS (
        SELECT pgtaskd.notify_freed(array_agg(d.queue)) AS sent FROM done AS d
    ), notified AS (
        -- A release that ends the task (CANCELED) tells the waiters, in the same transaction.
        SELECT pgtaskd.notify_done(array_agg(d.id)) AS sent
          FROM done AS d WHERE d.status = 'CANCELED'
    )
    SELECT (SELECT d.status FROM done AS d),
           (SELECT k.status FROM pgtaskd.task_state AS k WHERE k.id = release.id)
      FROM notified CROSS JOIN freed;
END
$$;

-- Where the claim of task `id` stands, read after any transaction that still holds the row
-- (`FOR SHARE`), such as one whose commit outcome is unknown: waiting for it with `wait`,
-- else failing with lock_not_available (55P03). No row: no such task.
CREATE OR REPLACE FUNCTION pgtaskd.claim_state(id bigint, wait boolean)
RETURNS TABLE (task_status text, task_attempt int, task_claim bigint)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF claim_state.wait THEN
        RETURN QUERY
        SELECT k.status, k.attempt, k.claim_token FROM pgtaskd.task_state AS k
         WHERE k.id = claim_state.id
           FOR SHARE;
    ELSE
        RETURN QUERY
        SELECT k.status, k.attempt, k.claim_token FROM pgtaskd.task_state AS k
         WHERE k.id = claim_state.id
           FOR SHARE NOWAIT;
    END IF;
END
$$;

-- Retention's batch: delete up to `max_rows` finished tasks older than the window, oldest
-- first, from where the previous batch ended ("Vacuum"): their state rows and their task
-- rows (version 36). A task whose row another transaction holds is passed over, as is one
-- whose state row is held. With the owner's rights: the daemon's role may not lock or
-- update task rows (version 36).
CREATE OR REPLACE FUNCTION pgtaskd.prune(
    older_than_ms float8,
    max_rows      bigint,
    from_finished timestamptz
) RETURNS TABLE (deleted bigint, last_finished timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT k.id
          FROM pgtaskd.task_state AS k
         WHERE k.finished_at < now() - least(
                   prune.older_than_ms * interval '1 millisecond',
                   (SELECT min(s.retain) FROM pgtaskd.queue_settings AS s))
           AND k.finished_at >= coalesce(prune.from_finished, '-infinity')
           AND k.status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
           -- A queue's own `retain` (version 33) over the daemon's setting.
           AND k.finished_at < now() - coalesce(
                   (SELECT s.retain FROM pgtaskd.queue_settings AS s
                     WHERE s.queue = k.queue),
                   prune.older_than_ms * interval '1 millisecond')
         ORDER BY k.finished_at
         LIMIT prune.max_rows
           FOR UPDATE SKIP LOCKED
    ), held AS MATERIALIZED (
        SELECT p.id
          FROM pgtaskd.tasks AS p
         WHERE p.id = ANY (ARRAY(SELECT picked.id FROM picked))
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgtaskd.task_state AS t
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           -- Found by primary key (see version 4), re-checked: still finished.
           AND coalesce(t.status, '') IN ('SUCCEEDED', 'FAILED', 'CANCELED')
        RETURNING t.id, t.finished_at
    ), tasks_gone AS (
        DELETE FROM pgtaskd.tasks AS r
         WHERE r.id = ANY (ARRAY(SELECT gone.id FROM gone))
    )
    SELECT count(*), max(gone.finished_at) FROM gone;
END
$$;

-- A FAILED or CANCELED task back to QUEUED, as if new ("States").
CREATE OR REPLACE FUNCTION pgtaskd.retry(task_id bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    previous text;
BEGIN
    SELECT t.status INTO previous FROM pgtaskd.task_state AS t WHERE t.id = retry.task_id FOR UPDATE;
    IF previous IS NULL OR previous NOT IN ('FAILED', 'CANCELED') THEN
        RETURN previous;
    END IF;
    UPDATE pgtaskd.task_state AS t
       SET status = 'QUEUED',
           attempt = 0,
           snoozes = 0,
           cancel_requested = false,
           words = 0,
           bytes = 0,
           runes = 0,
           output = NULL,
           error = NULL,
           lease_owner = NULL,
           lease_expires_at = NULL,
           started_at = NULL,
           finished_at = NULL,
           run_at = now()
     WHERE t.id = retry.task_id
       AND t.status IN ('FAILED', 'CANCELED');
    PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    RETURN previous;
END
$$;

-- At most `max_rows` FAILED tasks of a queue above `after_id` back to QUEUED, as
-- `pgtaskd.retry` does; one batch per call, called until `retried` is 0 ("States").
CREATE OR REPLACE FUNCTION pgtaskd.retry_failed(
    queue    text,
    max_rows integer DEFAULT 10000,
    after_id bigint DEFAULT 0,
    OUT retried bigint,
    OUT last_id bigint
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'pgtaskd.retry_failed: max_rows must be at least 1, not %', max_rows
            USING ERRCODE = '22023';
    END IF;
    WITH batch AS (
        SELECT t.id
          FROM pgtaskd.task_state AS t
         WHERE t.queue = retry_failed.queue
           AND t.status = 'FAILED'
           AND t.id > coalesce(retry_failed.after_id, 0)
         ORDER BY t.id
         LIMIT retry_failed.max_rows
           FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE pgtaskd.task_state AS t
           SET status = 'QUEUED',
               attempt = 0,
               snoozes = 0,
               cancel_requested = false,
               words = 0,
               bytes = 0,
               runes = 0,
               output = NULL,
               error = NULL,
               lease_owner = NULL,
               lease_expires_at = NULL,
               started_at = NULL,
               finished_at = NULL,
               run_at = now()
          FROM batch
         WHERE t.id = batch.id
           AND t.status = 'FAILED'
        RETURNING t.id
    )
    SELECT count(*), coalesce(max(done.id), coalesce(retry_failed.after_id, 0))
      INTO retried, last_id
      FROM done;
    IF retried > 0 THEN
        PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    END IF;
END
$$;

-- One row: the bloat of `pgtaskd.task_state`, the table claims and finishes write (version
-- 36), and the oldest xmin horizon holding back its vacuum, with its owner's rights and never
-- a query's text ("Vacuum health").
CREATE OR REPLACE FUNCTION pgtaskd.vacuum_health(
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
    SELECT c.oid, c.reltoastrelid FROM pg_class AS c WHERE c.oid = 'pgtaskd.task_state'::regclass
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

-- Run as the schema's owner (the role that migrated). A producer inserts the columns a
-- producer chooses, reads, enqueues and cancels; never a status, a lease or a result.
CREATE OR REPLACE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_state, pgtaskd.task_view TO %I',
                   role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent, concurrency_key) '
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
    -- The queues' limits and defaults (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
END
$$;

-- What `pgtaskd run` and the one-shot commands need; no DDL, no vacuum.
CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update state rows, never a task row
    -- (version 36); retention deletes finished tasks with the owner's rights; the CLI and
    -- the HTTP API insert like a producer, and steer queues like an operator; `/metrics` and
    -- `/readyz` read the vacuum health.
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT, UPDATE ON pgtaskd.task_state TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent, concurrency_key) '
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
    -- Limits: read and set like queues, counted and written by the claim (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON pgtaskd.queue_starts TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.set_queue(text, jsonb), '
                   'pgtaskd.notify_freed(text[]) TO %I', role_name);
END
$$;

-- An operator reads, pauses, resumes, retries and cancels; inserts and claims nothing.
CREATE OR REPLACE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_state, pgtaskd.task_view, '
                   'pgtaskd.paused_queues, '
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
    -- Limits and defaults: read and set (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.set_queue(text, jsonb) TO %I', role_name);
END
$$;

COMMENT ON FUNCTION pgtaskd.vacuum_health() IS
    'pgtaskd: bloat of pgtaskd.task_state and the oldest xmin horizon holding back its vacuum; no query text';
