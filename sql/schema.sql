-- pgtaskd's schema as the last migration (sql/0038_tags.sql) leaves it: every table,
-- index, sequence, function, trigger and privilege of the schema `pgtaskd`, in one file, for
-- a reader. Sections named in the comments ("One winner", ...) are those of docs/design.md.
--
-- DOCUMENTATION ONLY: pgtaskd never applies this file. `pgtaskd migrate` (and `run
-- --migrate`) applies the numbered migrations of this directory (src/db/migrate.rs), which
-- is how a database gets this schema and how it goes from one version to the next. Loaded
-- into a database of its own (psql -f, or one batch), this file gives it the same schema but
-- records no version in `pgtaskd.schema_migrations`, so `pgtaskd run` refuses that database.
--
-- It is kept true by a test, `schema_file::the_schema_file_is_the_schema_the_migrations_leave`
-- (tests/integration/schema_file.rs): one fresh database is migrated, another loads this file,
-- roles are granted by the three grant functions in both, and `pg_dump --schema-only` of the
-- two must be the same. A migration that changes the schema changes this file in the same
-- commit.
--
-- What "the same" takes, and why some things below look as they do:
-- - the task rows' columns are in the order the migrations added them (`idempotency_key`,
--   schema 5, `traceparent`, schema 19, and `concurrency_key`, schema 33, come last; schema
--   36 moved the state columns to `pgtaskd.task_state`);
-- - `tasks_queue_name` is NOT VALID, as schema 18 added it, and so are the constraints
--   schema 19 added (see "Migrations and the schema version"), on both tables;
-- - function bodies are the migrations' text, comments included: those comments still name
--   the schema version that made a choice ("see version 4"), which its migration explains;
-- - every object is named with its schema and the statements run with `search_path =
--   pg_catalog, pg_temp`, so that nothing of the loading role's own is resolved into them.

BEGIN;

SET LOCAL search_path = pg_catalog, pg_temp;

CREATE SCHEMA pgtaskd;

-- ---------------------------------------------------------------------------------------
-- Tables
-- ---------------------------------------------------------------------------------------

-- The versions applied, one row each. Not a migration's table: src/db/migrate.rs creates it
-- before the first migration and inserts a row after each ("Migrations and the schema
-- version"). This file creates it empty.
CREATE TABLE pgtaskd.schema_migrations (
    version    int         PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- The task as its producer wrote it ("Data flow"; columns: "Table `pgtaskd.tasks`"): never
-- updated by pgtaskd (schema 36). Its state is a row of `pgtaskd.task_state`, filled by the
-- producer's own statement (`tasks_state`, below), and read through `pgtaskd.task_view`
-- ("States"). The storage parameters make autovacuum keep up with retention's deletes
-- ("Vacuum"); an operator may change them, and no migration sets them again.
CREATE TABLE pgtaskd.tasks (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    payload          text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    -- Unset: the queue's `max_attempts` (pgtaskd.queue_settings), else 3 (schema 33).
    max_attempts     int,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- Unique per queue where set ("Idempotent enqueue").
    idempotency_key  text,
    -- The producer's W3C trace context, handed to the handler (schema 19).
    traceparent      text,
    -- The key `max_running_per_key` counts by (schema 33).
    concurrency_key  text,
    -- The tasks this one waits for, and what a parent's failure does to it (schema 37,
    -- docs/dependencies.md).
    depends_on       bigint[],
    on_dep_failure   text,
    -- Labels and data to find the task by (schema 38).
    tags             text[],
    metadata         jsonb,
    -- The batch this task is a member of (schema 39, docs/dependencies.md, "Batches").
    batch_id         bigint,

    CONSTRAINT tasks_max_attempts_check CHECK (max_attempts >= 1)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false,
    -- Never updated: no room for new versions (schema 36).
    fillfactor = 100
);

-- A queue name is 1 to 128 bytes: a pause NOTIFYs it, and the idempotency index holds it
-- ("Table `pgtaskd.tasks`"). NOT VALID as schema 18 added it (every row written since is
-- checked; `ALTER TABLE pgtaskd.tasks VALIDATE CONSTRAINT tasks_queue_name` marks it valid
-- without stopping writers).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_queue_name
        CHECK (pg_catalog.octet_length(queue) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(queue) OPERATOR(pg_catalog.<=) 128) NOT VALID;

-- A trace context of at most 512 bytes. NOT VALID as schema 19 added it (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_traceparent_length
        CHECK (pg_catalog.octet_length(traceparent) OPERATOR(pg_catalog.<=) 512) NOT VALID;

-- A concurrency key of at most 256 bytes. NOT VALID as schema 33 added it (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_concurrency_key_length
        CHECK (pg_catalog.octet_length(concurrency_key) OPERATOR(pg_catalog.<=) 256) NOT VALID;

-- A task waits only for tasks inserted before it (a smaller id), so no cycle can be written;
-- at most 10,000 parents, none null; the three failure policies. NOT VALID as schema 37
-- added them (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_depends_on_earlier
        CHECK (id OPERATOR(pg_catalog.>) ALL (depends_on)
               AND pg_catalog.cardinality(depends_on) OPERATOR(pg_catalog.<=) 10000
               AND pg_catalog.array_position(depends_on, NULL) IS NULL) NOT VALID,
    ADD CONSTRAINT tasks_on_dep_failure
        CHECK (on_dep_failure OPERATOR(pg_catalog.=) ANY (ARRAY['cancel', 'run', 'wait'])) NOT VALID;

-- At most 16 tags, each a letter or digit then up to 62 of letters, digits and `_.:-` (so that
-- none holds the comma that joins them here); metadata a JSON object of at most 8 KiB. NOT
-- VALID as schema 38 added them (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_tags_check
        CHECK (pg_catalog.cardinality(tags) OPERATOR(pg_catalog.<=) 16
               AND pg_catalog.array_position(tags, NULL) IS NULL
               AND (pg_catalog.cardinality(tags) OPERATOR(pg_catalog.=) 0
                    OR pg_catalog.array_to_string(tags, ',') OPERATOR(pg_catalog.~)
                       '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}(,[A-Za-z0-9][A-Za-z0-9_.:-]{0,62})*$')) NOT VALID,
    ADD CONSTRAINT tasks_metadata_check
        CHECK (pg_catalog.jsonb_typeof(metadata) OPERATOR(pg_catalog.=) 'object'
               AND pg_catalog.octet_length(metadata::text) OPERATOR(pg_catalog.<=) 8192) NOT VALID;

-- A creation time every reader can use: finite, and before the year 262142, where the
-- daemon's dates end (the task key holds it in microseconds). NOT VALID as schema 47 added it
-- (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_created_at_range
        CHECK (created_at OPERATOR(pg_catalog.>) '-infinity'::pg_catalog.timestamptz
               AND created_at OPERATOR(pg_catalog.<) '262142-01-01 00:00:00+00'::pg_catalog.timestamptz) NOT VALID;

COMMENT ON TABLE pgtaskd.tasks IS
    'pgtaskd task queue: INSERT (payload) to enqueue; state and results in pgtaskd.task_view; pgtaskd.cancel(id) to cancel';
COMMENT ON COLUMN pgtaskd.tasks.concurrency_key IS
    'The key max_running_per_key of the queue counts by (a tenant, a customer); at most 256 bytes.';
COMMENT ON COLUMN pgtaskd.tasks.depends_on IS
    'The ids of the tasks this one waits for (each smaller than its own): it is WAITING until they end; never changed after the insert.';
COMMENT ON COLUMN pgtaskd.tasks.on_dep_failure IS
    'What a parent that ends FAILED or CANCELED does to this task: cancel (unset), run, or wait for a retry that succeeds.';
COMMENT ON COLUMN pgtaskd.tasks.tags IS
    'Labels to find the task by: at most 16, each [A-Za-z0-9][A-Za-z0-9_.:-]{0,62}.';
COMMENT ON COLUMN pgtaskd.tasks.metadata IS
    'Data to find the task by: a JSON object of at most 8 KiB.';
COMMENT ON COLUMN pgtaskd.tasks.max_attempts IS
    'Attempts before the task fails; unset: the queue''s max_attempts (pgtaskd.queue_settings), else 3.';

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
    -- NULL until the task succeeds, as are `runs` until its first claim and `snoozes` until
    -- its first snooze (schema 40): the versions a task leaves behind stay narrow; the view
    -- answers 0.
    words            bigint,
    bytes            bigint,
    runes            bigint,
    error            text,
    lease_owner      text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    claim_token      bigint,
    output           text,
    runs             int,
    errors           jsonb,
    snoozes          int,
    concurrency_key  text,
    -- The parent whose failure canceled this task (schema 37), for `retry --with-dependents`.
    canceled_by      bigint,
    -- The batch this task is a member of, and the batch whose callback it is (schema 39).
    batch_id         bigint,
    callback_of      bigint,
    -- The handler's latest progress, kept for the next attempt (schema 39).
    progress         jsonb,
    progress_at      timestamptz,

    -- The CHECK constraints make a row whose status, counts, error and lease disagree
    -- impossible, whoever writes it ("Results with status", "Cancel is a request").
    CONSTRAINT tasks_status_check
        CHECK (status IN ('WAITING', 'QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELED')),
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

-- An error on every FAILED row, none on SUCCEEDED or CANCELED rows (but those a parent's
-- failure canceled, which name it: schema 37, and batch callbacks canceled by their batch's
-- failures: schema 39), the last failed attempt's (or none) on QUEUED and RUNNING rows; an
-- output on SUCCEEDED rows only. NOT VALID as schema 19 added them to the task rows, whose
-- state schema 36 moved here, and schemas 37 and 39 changed the first.
ALTER TABLE pgtaskd.task_state
    ADD CONSTRAINT tasks_error_when_failed
        CHECK ((status OPERATOR(pg_catalog.<>) 'FAILED' OR error IS NOT NULL)
               AND (error IS NULL OR status OPERATOR(pg_catalog.=) ANY (ARRAY['FAILED', 'QUEUED', 'RUNNING'])
                    OR (status OPERATOR(pg_catalog.=) 'CANCELED'
                        AND (canceled_by IS NOT NULL OR callback_of IS NOT NULL))))
        NOT VALID,
    ADD CONSTRAINT tasks_output_only_when_succeeded
        CHECK (status OPERATOR(pg_catalog.=) 'SUCCEEDED' OR output IS NULL) NOT VALID;
-- Progress is a JSON object of at most 4 KiB (schema 39). NOT VALID as schema 39 added it.
ALTER TABLE pgtaskd.task_state
    ADD CONSTRAINT tasks_progress_check
        CHECK (pg_catalog.jsonb_typeof(progress) OPERATOR(pg_catalog.=) 'object'
               AND pg_catalog.octet_length(progress::text) OPERATOR(pg_catalog.<=) 4096) NOT VALID;

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

-- The edges a WAITING task still waits on, one row per (child, parent) (schema 37,
-- docs/dependencies.md): written by the producer's own statement, deleted in the transaction
-- that commits the parent's end (`pgtaskd.settle_waiting`). A row stays for a parent that
-- failed only where the child waits for a retry of it (`on_dep_failure` 'wait').
CREATE TABLE pgtaskd.task_deps (
    child  bigint NOT NULL,
    parent bigint NOT NULL,
    PRIMARY KEY (child, parent)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
-- A parent's end finds its children.
CREATE INDEX task_deps_parent_idx ON pgtaskd.task_deps (parent);
COMMENT ON TABLE pgtaskd.task_deps IS
    'pgtaskd: what each WAITING task still waits for; written and deleted by pgtaskd''s triggers and functions only';

-- Batches (schema 39, docs/dependencies.md, "Batches"): a callback task that runs once, after
-- the batch is sealed and its last member has ended. Members are tasks with `batch_id`; no
-- row is written per member beyond the member itself. `ended_at` and the counts are written
-- once, in the transaction that ends the last member (or seals a batch whose members have all
-- ended).
CREATE TABLE pgtaskd.batches (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The callback task: WAITING until the batch ends.
    callback    bigint      NOT NULL,
    -- 'success': the callback runs only if every member SUCCEEDED, else it is CANCELED;
    -- 'finish': it runs whatever they did.
    callback_on text        NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    sealed_at   timestamptz,
    ended_at    timestamptz,
    -- The members by outcome, counted at the end.
    succeeded   bigint,
    failed      bigint,
    canceled    bigint,

    CONSTRAINT batches_callback_on CHECK (callback_on IN ('success', 'finish')),
    CONSTRAINT batches_ended_when_sealed CHECK (ended_at IS NULL OR sealed_at IS NOT NULL)
);
CREATE UNIQUE INDEX batches_callback_idx ON pgtaskd.batches (callback);
COMMENT ON TABLE pgtaskd.batches IS
    'pgtaskd: batches of tasks and their callbacks; written by pgtaskd.open_batch, pgtaskd.seal_batch and the ends of members only';

-- The database's own random id, the first part of every task key ("What a handler is
-- told", schema 30): one row, readable by everyone.
CREATE TABLE pgtaskd.site (
    id         text        PRIMARY KEY
                           DEFAULT pg_catalog.substr(pg_catalog.md5(pg_catalog.random()::text
                               OPERATOR(pg_catalog.||) pg_catalog.clock_timestamp()::text
                               OPERATOR(pg_catalog.||) pg_catalog.pg_backend_pid()::text), 1, 16),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE UNIQUE INDEX site_one_row ON pgtaskd.site ((true));
COMMENT ON TABLE pgtaskd.site IS
    'pgtaskd: this database''s own random id, the first part of every task key (one row)';
INSERT INTO pgtaskd.site DEFAULT VALUES;

-- The site id is never changed or deleted: every task's key is made of it.
CREATE FUNCTION pgtaskd.keep_site() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'pgtaskd.site is not changed or deleted: its id is the first part of every task key'
        USING ERRCODE = '42501';
END
$$;
CREATE TRIGGER site_kept BEFORE UPDATE OR DELETE ON pgtaskd.site
    FOR EACH ROW EXECUTE FUNCTION pgtaskd.keep_site();
CREATE TRIGGER site_kept_whole BEFORE TRUNCATE ON pgtaskd.site
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.keep_site();
REVOKE ALL ON FUNCTION pgtaskd.keep_site() FROM PUBLIC;

-- Schedules (version 31, docs/schedules.md): tasks made at instants, fired by any daemon.
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

-- The queues no daemon claims from, written only through pause_queue and resume_queue
-- ("Table `pgtaskd.paused_queues`").
CREATE TABLE pgtaskd.paused_queues (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT paused_queues_queue_name
        CHECK (pg_catalog.octet_length(queue) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(queue) OPERATOR(pg_catalog.<=) 128)
);

COMMENT ON TABLE pgtaskd.paused_queues IS
    'pgtaskd: queues no daemon claims from; pgtaskd.pause_queue(q) / pgtaskd.resume_queue(q)';

-- Limits and defaults per queue, read by every claim ("Limits", schema 33).
CREATE TABLE pgtaskd.queue_settings (
    queue               text        PRIMARY KEY,
    max_running         int,
    max_running_per_key int,
    rate_limit          int,
    rate_period         interval,
    max_attempts        int,
    retain              interval,
    updated_at          timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT queue_settings_queue_name
        CHECK (pg_catalog.octet_length(queue) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(queue) OPERATOR(pg_catalog.<=) 128),
    CONSTRAINT queue_settings_max_running CHECK (max_running >= 1),
    CONSTRAINT queue_settings_max_running_per_key CHECK (max_running_per_key >= 1),
    CONSTRAINT queue_settings_rate
        CHECK ((rate_limit IS NULL) = (rate_period IS NULL)
               AND rate_limit >= 1 AND rate_limit <= 1000000
               AND rate_period >= interval '1 millisecond' AND rate_period <= interval '1 day'),
    CONSTRAINT queue_settings_max_attempts CHECK (max_attempts >= 1),
    -- At most 100 years, as the CLI and the HTTP API check (version 35).
    CONSTRAINT queue_settings_retain
        CHECK (retain >= interval '1 second' AND retain <= interval '100 years')
);

COMMENT ON TABLE pgtaskd.queue_settings IS
    'pgtaskd: limits and defaults per queue; pgtaskd.set_queue(queue, settings jsonb)';

-- The starts of rate-limited queues inside their window, for the claim to count; each claim
-- of such a queue deletes the ones that left the window.
CREATE TABLE pgtaskd.queue_starts (
    queue      text        NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX queue_starts_queue_idx ON pgtaskd.queue_starts (queue, started_at);

COMMENT ON TABLE pgtaskd.queue_starts IS
    'pgtaskd: recent starts of rate-limited queues (written and pruned by the claim)';

-- The idle flags: one row per daemon waiting for work, live until `expires_at`; inserts
-- notify only while one is live. UNLOGGED: a hint about this moment ("Idle flags").
CREATE UNLOGGED TABLE pgtaskd.idle_daemons (
    instance   text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

COMMENT ON TABLE pgtaskd.idle_daemons IS
    'pgtaskd: daemons waiting for work; inserts send NOTIFY pgtaskd_tasks only while one is live';

-- The daemons running: one row per daemon, its version, the queues it serves and its
-- heartbeat, written by the daemon; stale after three heartbeat periods, deleted by any
-- daemon an hour after its last heartbeat ("Daemons connected").
CREATE TABLE pgtaskd.daemons (
    instance        text        PRIMARY KEY,
    version         text        NOT NULL,
    queues          text[]      NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_every interval    NOT NULL,
    -- How it runs each queue, parallel to `queues` (version 23; NULL from older daemons).
    handlers        text[],

    CONSTRAINT daemons_heartbeat_every_positive
        CHECK (heartbeat_every OPERATOR(pg_catalog.>) interval '0')
);

COMMENT ON TABLE pgtaskd.daemons IS
    'pgtaskd: the daemons running, their queues and heartbeats; stale after 3 heartbeat periods';
COMMENT ON COLUMN pgtaskd.daemons.handlers IS
    'pgtaskd: how the daemon runs each of its queues (parallel to queues): text-stats, exec:FINGERPRINT or http:FINGERPRINT';

-- Each daemon by its lease key, for `pgtaskd.lease_holder` (schema 41): one lookup per
-- RUNNING task the view reads, however many daemons are listed.
CREATE INDEX daemons_lease_key_idx ON pgtaskd.daemons ((pg_catalog.split_part(instance, ':', -1)));


-- Results a stopping daemon could not write, someone else holding the task's row; written
-- by a rescuer once the lease expired and the row is free ("Parked results", version 28).
CREATE TABLE pgtaskd.parked_results (
    task_id     bigint      NOT NULL,
    claim_token bigint      NOT NULL,
    -- The arguments `pgtaskd.finish` takes for one row.
    status      text        NOT NULL,
    words       bigint      NOT NULL,
    bytes       bigint      NOT NULL,
    runes       bigint      NOT NULL,
    error       text,
    output      text,
    retry_in    float8,
    parked_at   timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (task_id, claim_token)
);

COMMENT ON TABLE pgtaskd.parked_results IS
    'Results a stopping daemon could not write because another transaction held the task''s '
    'row; a rescuer writes each once its lease expired and the row is free (schema 28).';

-- ---------------------------------------------------------------------------------------
-- Views
-- ---------------------------------------------------------------------------------------

-- Where a task's state and results are read (version 24): the state row of each task with
-- what its producer wrote (version 36, docs/storage.md; "View `pgtaskd.task_view`"). With
-- the reader's rights. A task is its state row and its task row, joined by primary key, so
-- that a row-level security policy on either table holds through the view; the task row is
-- read by its primary key for each state row (`OFFSET 0` keeps the planner from making a
-- join of it, which, planned on statistics that say "empty", would read the whole primary
-- key for each row).

-- The attempts a task of `queue` has when it sets none.
CREATE FUNCTION pgtaskd.queue_max_attempts(queue text) RETURNS int
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT s.max_attempts FROM pgtaskd.queue_settings AS s
                      WHERE s.queue OPERATOR(pg_catalog.=) queue_max_attempts.queue), 3)
$$;


-- The daemon that holds a lease, as `pgtaskd daemons` names it (schema 41): a claim writes
-- only the last part of its daemon's instance id (`host:pid:key`) as `lease_owner`, a key of
-- ten characters, so that the version of a state row that a held snapshot keeps does not
-- grow with the host's name. An owner that is no listed daemon's key (a daemon forgotten an
-- hour after its last heartbeat, or a lease written before schema 41, which holds a whole
-- id) is answered as it is. Executable by every role, as `queue_max_attempts` is: the view,
-- which runs with its reader's rights, calls both; a caller learns a daemon's id only from
-- its key.
CREATE FUNCTION pgtaskd.lease_holder(owner text) RETURNS text
LANGUAGE sql STABLE STRICT
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT pg_catalog.min(d.instance) FROM pgtaskd.daemons AS d
                      WHERE pg_catalog.split_part(d.instance, ':', -1) OPERATOR(pg_catalog.=) owner),
                    owner)
$$;

CREATE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT s.id, s.queue, t.payload, s.status, s.priority, s.run_at, s.attempt,
       coalesce(s.max_attempts, pgtaskd.queue_max_attempts(s.queue)) AS max_attempts,
       s.cancel_requested, coalesce(s.words, 0) AS words, coalesce(s.bytes, 0) AS bytes,
       coalesce(s.runes, 0) AS runes, s.error, pgtaskd.lease_holder(s.lease_owner) AS lease_owner,
       s.lease_expires_at, t.created_at, s.started_at, s.finished_at, t.idempotency_key,
       s.claim_token, s.output, t.traceparent,
       coalesce((SELECT x.id FROM pgtaskd.site AS x), 'nosite') || '-' || s.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       coalesce(s.runs, 0) AS runs, s.errors, coalesce(s.snoozes, 0) AS snoozes,
       s.concurrency_key, t.depends_on, t.on_dep_failure,
       t.tags, t.metadata, s.progress, s.progress_at, t.batch_id
  FROM pgtaskd.task_state AS s
 CROSS JOIN LATERAL (SELECT x.payload, x.created_at, x.idempotency_key, x.traceparent,
                            x.depends_on, x.on_dep_failure, x.tags, x.metadata, x.batch_id
                       FROM pgtaskd.tasks AS x
                      WHERE x.id = s.id
                     OFFSET 0) AS t;

COMMENT ON VIEW pgtaskd.task_view IS
    'pgtaskd: every task with its state and results: SELECT status, words, bytes, runes, output, error FROM pgtaskd.task_view WHERE id = $1';

-- ---------------------------------------------------------------------------------------
-- Indexes (the primary keys aside)
-- ---------------------------------------------------------------------------------------

-- On the state rows (schema 36), with the names they had on the task rows.

-- Claims read only QUEUED rows, in (priority DESC, id) order per queue, so finished rows
-- cost them nothing ("One winner", "Claims after a position").
CREATE INDEX tasks_claim_idx ON pgtaskd.task_state (queue, priority DESC, id)
    WHERE status = 'QUEUED';

-- The rescuer looks for RUNNING rows whose lease expired ("Data flow").
CREATE INDEX tasks_lease_idx ON pgtaskd.task_state (lease_expires_at)
    WHERE status = 'RUNNING';

-- Retention prunes finished rows by age ("Vacuum"); stats and the dashboard read the recent
-- ones ("Table `pgtaskd.tasks`").
CREATE INDEX tasks_finished_idx ON pgtaskd.task_state (finished_at)
    WHERE finished_at IS NOT NULL;

-- The list of tasks (`GET /tasks`, `pgtaskd list`), newest first, filtered by a queue and a
-- status, or by a status few rows have, reads these instead of walking past every other row
-- of the primary key (schema 19). Finished rows only: no claim, finish or cancel can be
-- planned on them.
CREATE INDEX tasks_list_queue_idx ON pgtaskd.task_state (queue, status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

CREATE INDEX tasks_list_status_idx ON pgtaskd.task_state (status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

-- The tasks waiting on parents, for the list and the auditor (schema 37), and those a
-- parent's failure canceled, for `retry --with-dependents`.
CREATE INDEX tasks_waiting_idx ON pgtaskd.task_state (id) WHERE status = 'WAITING';
CREATE INDEX tasks_canceled_by_idx ON pgtaskd.task_state (canceled_by)
    WHERE canceled_by IS NOT NULL;
-- The members of each batch by status (schema 39): a member's end finds one still running,
-- and the batch's end counts them.
CREATE INDEX tasks_batch_idx ON pgtaskd.task_state (batch_id, status) WHERE batch_id IS NOT NULL;

-- Queue and status together, so that a status absent from one queue is not estimated as if
-- spread evenly (schema 19).
CREATE STATISTICS pgtaskd.tasks_queue_status (mcv) ON queue, status FROM pgtaskd.task_state;

-- Tasks found by their tags and metadata (schema 38): `tags @> ARRAY[...]`,
-- `metadata @> '{"key": "value"}'`. Untagged tasks are not in them.
CREATE INDEX tasks_tags_idx ON pgtaskd.tasks USING gin (tags) WHERE tags IS NOT NULL;
CREATE INDEX tasks_metadata_idx ON pgtaskd.tasks USING gin (metadata jsonb_path_ops)
    WHERE metadata IS NOT NULL;

-- An idempotency key is unique per queue; name this predicate in `ON CONFLICT`
-- ("Idempotent enqueue").
CREATE UNIQUE INDEX tasks_idempotency_key_idx ON pgtaskd.tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- ---------------------------------------------------------------------------------------
-- Sequences (the identity of tasks.id aside)
-- ---------------------------------------------------------------------------------------

-- Claim tokens: one value per claim, never reused ("One claim, one token").
CREATE SEQUENCE pgtaskd.claim_tokens AS bigint;

-- The idle hint: the latest expiry of a live flag, in milliseconds since 1970 (0: none),
-- read by the insert trigger's WHEN condition ("Idle flags", "The hint (schema 14)").
-- UNLOGGED on PostgreSQL 15 and later, where the migration creates it so; a logged sequence
-- before 15.
CREATE UNLOGGED SEQUENCE pgtaskd.idle_until AS bigint MINVALUE 0 START 0;

COMMENT ON SEQUENCE pgtaskd.idle_until IS
    'pgtaskd: latest expiry of a live idle flag, ms since 1970; the insert trigger runs only before it';

-- As schema 14 leaves it: set, to 0 (no flag).
SELECT pg_catalog.setval('pgtaskd.idle_until'::pg_catalog.regclass, 0);

-- ---------------------------------------------------------------------------------------
-- Completion notifications, and the functions of producers: enqueue and cancel
-- ---------------------------------------------------------------------------------------

-- `pg_notify`, unless the session or transaction set `pgtaskd.notify = off` (version 29): every
-- notification of pgtaskd's functions goes through it. The daemon sets it on sessions of a
-- server whose commits wait for a synchronous standby that is not connected ("No commit
-- waits for a standby that is not there"): a producer's transaction stuck there holds the
-- lock every NOTIFY of the cluster takes at commit, and a finish that notified would wait
-- behind it. EXECUTE stays with PUBLIC: it does what `pg_notify` does.
CREATE FUNCTION pgtaskd.notify(channel text, payload text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.lower(pg_catalog.current_setting('pgtaskd.notify', true))
       OPERATOR(pg_catalog.=) ANY (ARRAY['off', 'false', 'no', '0']) THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.pg_notify(notify.channel, notify.payload);
END
$$;

-- `NOTIFY pgtaskd_done` with the ids of tasks that just ended, split under the payload
-- limit; called by finish, request_cancel, the release and the rescuer ("Completion
-- notifications").
CREATE FUNCTION pgtaskd.notify_done(ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgtaskd.notify('pgtaskd_done', string_agg(s.id::text, ',' ORDER BY s.n))
       FROM (SELECT u.id, u.n,
                    sum(length(u.id::text) + 1) OVER (ORDER BY u.n) AS reach
               FROM unnest(notify_done.ids) WITH ORDINALITY AS u(id, n)
              WHERE u.id IS NOT NULL) AS s
      GROUP BY s.reach / 7900;
END
$$;

-- Enqueue: the producer's INSERT as a function, returning the id; with an idempotency key
-- already held in the queue, the holder's id and no insert ("Idempotent enqueue").
CREATE FUNCTION pgtaskd.enqueue(
    payload         text,
    queue           text        DEFAULT 'default',
    priority        int         DEFAULT 0,
    run_at          timestamptz DEFAULT now(),
    max_attempts    int         DEFAULT NULL,
    idempotency_key text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    found_id bigint;
BEGIN
    IF enqueue.idempotency_key IS NULL THEN
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts)
        VALUES (enqueue.payload, enqueue.queue, enqueue.priority::smallint, enqueue.run_at,
                enqueue.max_attempts)
        RETURNING id INTO found_id;
        RETURN found_id;
    END IF;
    -- The keyed row may be deleted (retention) between the conflict and the read: try again.
    FOR attempt IN 1..3 LOOP
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts, idempotency_key)
        VALUES (enqueue.payload, enqueue.queue, enqueue.priority::smallint, enqueue.run_at,
                enqueue.max_attempts, enqueue.idempotency_key)
        ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id INTO found_id;
        IF found_id IS NOT NULL THEN
            RETURN found_id;
        END IF;
        SELECT t.id INTO found_id
          FROM pgtaskd.tasks AS t
         WHERE t.queue = enqueue.queue AND t.idempotency_key = enqueue.idempotency_key;
        IF found_id IS NOT NULL THEN
            RETURN found_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idempotency key % of queue % is taken by a task this transaction cannot see',
        enqueue.idempotency_key, enqueue.queue
        USING ERRCODE = 'serialization_failure';
END
$$;

-- Cancel a task: QUEUED to CANCELED at once, or a request recorded on a RUNNING task and
-- `NOTIFY pgtaskd_cancel`; returns the status before and after ("Cancel is a request").
-- With its owner's rights, so that producers need no UPDATE right.
CREATE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- `coalesce(status, '')`: found by primary key, never by a scan of a partial index. A
    -- WAITING task is canceled as a QUEUED one is, and waits for nothing any more; the tasks
    -- waiting on it are decided in this transaction (version 37).
    SELECT status INTO previous FROM pgtaskd.task_state
     WHERE id = task_id AND coalesce(status, '') IN ('QUEUED', 'WAITING')
       FOR UPDATE;
    IF FOUND THEN
        UPDATE pgtaskd.task_state
           SET status = 'CANCELED', cancel_requested = true, finished_at = now(), error = NULL
         WHERE id = task_id AND coalesce(status, '') IN ('QUEUED', 'WAITING')
        RETURNING status INTO current;
    END IF;
    IF current IS NOT NULL THEN
        DELETE FROM pgtaskd.task_deps WHERE child = task_id;
        PERFORM pgtaskd.notify_done(ARRAY[task_id]);
        PERFORM pgtaskd.end_parents(ARRAY[task_id]);
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

-- The same, returning the status after the request only (null: no such task).
CREATE FUNCTION pgtaskd.cancel(task_id bigint) RETURNS text
LANGUAGE sql AS $$
    SELECT current FROM pgtaskd.request_cancel(task_id)
$$;

-- `history` with the failure of attempt `attempt` (run `run`) appended, the last ten kept
-- (`tasks.errors`, version 30); a history that is not an array (written by hand) starts
-- again. EXECUTE stays with PUBLIC: it computes, and reads and writes nothing.
CREATE FUNCTION pgtaskd.error_history(history jsonb, attempt int, run int, error text)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(jsonb_agg(e.entry ORDER BY e.n), '[]'::jsonb)
      FROM (SELECT h.entry, h.n
              FROM jsonb_array_elements(
                       CASE WHEN jsonb_typeof(error_history.history) = 'array'
                            THEN error_history.history ELSE '[]'::jsonb END
                       || jsonb_build_array(jsonb_build_object(
                              'attempt', error_history.attempt,
                              'run', error_history.run,
                              'at', now(),
                              -- Its head (what failed) and its tail (where stderr ends).
                              'error', CASE WHEN char_length(error_history.error) <= 2000
                                            THEN coalesce(error_history.error, '')
                                            ELSE left(error_history.error, 500) || ' … '
                                                 || right(error_history.error, 1497) END)))
                   WITH ORDINALITY AS h(entry, n)
             ORDER BY h.n DESC
             LIMIT 10) AS e
$$;

-- ---------------------------------------------------------------------------------------
-- Schedules (version 31)
-- ---------------------------------------------------------------------------------------

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

-- ---------------------------------------------------------------------------------------
-- Functions for the daemon: claim, finish, prune
-- ---------------------------------------------------------------------------------------

-- Claim: QUEUED to RUNNING for up to `max_tasks` tasks of the served queues, one winner per
-- task ("One winner"), within a byte budget ("Bounded memory"), skipping paused queues,
-- optionally after a position ("Claims after a position"), each with a claim token of its
-- own ("One claim, one token"). The planner settings keep its plan right under statistics
-- taken while the table was empty ("SQL interface", "Functions").
CREATE FUNCTION pgtaskd.claim(
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
                 task_key text, task_idempotency_key text, task_traceparent text,
                 task_parents text, task_parent_count int, task_progress text,
                 task_batch bigint, task_batch_counts text)
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
                   AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS p WHERE p.id = k.id OFFSET 0)
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
                                                        WHERE p.id = q.id OFFSET 0)
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
                -- The payload's size from the task row, looked up by its key whatever the
                -- statistics say (schema 44); a state row without its task row (written by
                -- hand) is never claimed.
                SELECT k.id, k.priority, p.size
                  FROM pgtaskd.task_state AS k
                 CROSS JOIN LATERAL (SELECT octet_length(r.payload)::bigint AS size
                                       FROM pgtaskd.tasks AS r
                                      WHERE r.id = k.id
                                     OFFSET 0) AS p
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
                -- The payload's size from the task row, looked up by its key whatever the
                -- statistics say (schema 44); a state row without its task row (written by
                -- hand) is never claimed.
                SELECT k.id, k.priority, p.size
                  FROM pgtaskd.task_state AS k
                 CROSS JOIN LATERAL (SELECT octet_length(r.payload)::bigint AS size
                                       FROM pgtaskd.tasks AS r
                                      WHERE r.id = k.id
                                     OFFSET 0) AS p
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
        SELECT k.id, k.priority, p.size
          FROM pgtaskd.task_state AS k
         CROSS JOIN LATERAL (SELECT octet_length(r.payload)::bigint AS size
                               FROM pgtaskd.tasks AS r
                              WHERE r.id = k.id
                             OFFSET 0) AS p
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
         WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
           AND coalesce(t.status, '') = 'QUEUED'
        RETURNING t.id, t.attempt, t.priority, t.claim_token, t.queue, t.run_at, t.runs,
                  t.progress, t.batch_id, t.callback_of
    ), told AS (
        -- The task as its producer wrote it: the payload and what the handler is told, each
        -- task row looked up by its key whatever the statistics say (schema 44).
        SELECT c.id, c.attempt, c.priority, c.claim_token,
               CASE WHEN octet_length(p.payload) > claim.max_payload THEN NULL
                    ELSE p.payload END AS payload,
               octet_length(p.payload)::bigint AS size,
               extract(epoch FROM now() - greatest(p.created_at, c.run_at))::float8 AS waited,
               c.runs,
               coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || c.id || '-'
                   || (extract(epoch FROM p.created_at) * 1000000)::bigint AS task_key,
               p.idempotency_key, p.traceparent,
               -- Its parents and how each ended, the first 200 (version 37), each parent's
               -- state row looked up by its key.
               CASE WHEN cardinality(p.depends_on) > 0 THEN
                   (SELECT string_agg(x.parent || '=' ||
                                      coalesce((SELECT s.status FROM pgtaskd.task_state AS s
                                                 WHERE s.id = x.parent), 'GONE'), ','
                                      ORDER BY x.parent)
                      FROM (SELECT DISTINCT u.parent
                              FROM unnest(p.depends_on) AS u(parent)
                             ORDER BY u.parent
                             LIMIT 200) AS x)
               END AS parents,
               CASE WHEN cardinality(p.depends_on) > 0 THEN
                   (SELECT count(DISTINCT u.parent)::int FROM unnest(p.depends_on) AS u(parent))
               ELSE 0 END AS parent_count,
               -- The progress earlier attempts left, its batch, and a callback's counts
               -- (version 39).
               c.progress::text AS progress,
               coalesce(c.batch_id, c.callback_of) AS batch,
               CASE WHEN c.callback_of IS NOT NULL THEN
                   (SELECT format('succeeded=%s,failed=%s,canceled=%s',
                                  b.succeeded, b.failed, b.canceled)
                      FROM pgtaskd.batches AS b
                     WHERE b.id = c.callback_of AND b.ended_at IS NOT NULL)
               END AS batch_counts
          FROM claimed AS c
         CROSS JOIN LATERAL (SELECT r.payload, r.created_at, r.idempotency_key, r.traceparent,
                                    r.depends_on
                               FROM pgtaskd.tasks AS r
                              WHERE r.id = c.id
                             OFFSET 0) AS p
    ), starts AS (
        -- Each start of a rate-limited queue, for the next claims to count.
        INSERT INTO pgtaskd.queue_starts (queue, started_at)
        SELECT claimed.queue, coalesce(decided_at, now()) FROM claimed
         WHERE claimed.queue = ANY (rated)
    )
    (SELECT told.id, told.attempt, told.payload, told.size, told.waited,
            told.priority::int, told.claim_token, told.runs, told.task_key,
            told.idempotency_key, told.traceparent, told.parents,
            told.parent_count, told.progress, told.batch, told.batch_counts
       FROM told
      ORDER BY told.priority DESC, told.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8, NULL::int, NULL::bigint,
            NULL::int, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int,
            NULL::text, NULL::bigint, NULL::text
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1)
    UNION ALL
    SELECT NULL::bigint, NULL::int, NULL::text, NULL::bigint, again_in, NULL::int, NULL::bigint,
           NULL::int, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int,
            NULL::text, NULL::bigint, NULL::text
     WHERE again_in IS NOT NULL;
END
$$;

-- Finish: commit many claims' outcomes in one statement, each fenced on its claim token
-- ("Fenced finish", "Results with status"); rows someone else holds locked are skipped and
-- reported ("No one else's lock delays a batch"); one `pgtaskd_done` notification for the
-- rows it ended ("Completion notifications").
CREATE FUNCTION pgtaskd.finish(
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
DECLARE
    answer_ids     bigint[];
    answer_written text[];
    answer_current text[];
    answer_skipped boolean[];
BEGIN
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
                             WHEN f.status = 'SNOOZED' AND coalesce(t.snoozes, 0) < 100 THEN 'QUEUED'
                             WHEN f.status = 'SNOOZED' THEN 'FAILED'
                             ELSE f.status END,
               attempt = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND coalesce(t.snoozes, 0) < 100 THEN t.attempt - 1
                              ELSE t.attempt END,
               snoozes = CASE WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                   AND coalesce(t.snoozes, 0) < 100 THEN coalesce(t.snoozes, 0) + 1
                              ELSE t.snoozes END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.runes END,
               output = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.output END,
               error = CASE WHEN t.cancel_requested THEN NULL
                            WHEN f.status = 'SNOOZED' AND coalesce(t.snoozes, 0) < 100 THEN t.error
                            WHEN f.status NOT IN ('FAILED', 'SNOOZED') THEN NULL
                            ELSE f.error END,
               -- Every failed attempt's error, the last ten (version 30); a snooze is none.
               errors = CASE WHEN t.cancel_requested OR f.status NOT IN ('FAILED', 'SNOOZED')
                                  OR (f.status = 'SNOOZED' AND coalesce(t.snoozes, 0) < 100) THEN t.errors
                             ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs, f.error) END,
               run_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                  AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                             THEN now() + f.retry_in * interval '1 second'
                             WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                  AND coalesce(t.snoozes, 0) < 100
                             THEN now() + coalesce(f.retry_in, 0) * interval '1 second'
                             ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue))
                                  THEN NULL
                                  WHEN NOT t.cancel_requested AND f.status = 'SNOOZED'
                                       AND coalesce(t.snoozes, 0) < 100
                                  THEN NULL ELSE now() END
          FROM input AS f
         -- Looked up by primary key, the rows held as the index condition (version 11).
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           AND t.id = f.id
           -- Written so that it cannot steer the lookup to the partial index of RUNNING rows.
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = f.token
           -- Only a recorded cancel request ends a task CANCELED; an outcome is one of four
           -- (version 37: WAITING is a status, never an outcome).
           AND (f.status <> 'CANCELED' OR t.cancel_requested)
           AND f.status IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'SNOOZED')
        RETURNING t.id, t.status, t.queue
    ), freed AS (
        -- The tasks that stopped running free their slots of a running limit (version 33).
        SELECT pgtaskd.notify_freed(array_agg(done.queue)) AS sent FROM done
    ), notified AS (
        -- One row whatever `done` holds (an aggregate); volatile, so evaluated once, after
        -- every row of `done` was written. A task QUEUED again has not ended.
        SELECT pgtaskd.notify_done(array_agg(done.id)) AS sent FROM done
         WHERE done.status <> 'QUEUED'
    ), answers AS (
        SELECT f.id, d.status AS written,
               -- What a finish that wrote nothing found, as the row stands (not locked).
               CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.task_state AS c WHERE c.id = f.id) END
                   AS current,
               -- Skipped: not written, not held, and still this claim's.
               d.id IS NULL
                 AND NOT (f.id = ANY (ARRAY(SELECT held.id FROM held)))
                 AND EXISTS (SELECT 1 FROM pgtaskd.task_state AS c
                              WHERE c.id = f.id AND c.claim_token = f.token
                                AND coalesce(c.status, '') = 'RUNNING') AS skipped
          FROM input AS f
          LEFT JOIN done AS d ON d.id = f.id
         CROSS JOIN notified
         CROSS JOIN freed
    )
    SELECT array_agg(a.id ORDER BY a.id), array_agg(a.written ORDER BY a.id),
           array_agg(a.current ORDER BY a.id), array_agg(a.skipped ORDER BY a.id)
      INTO answer_ids, answer_written, answer_current, answer_skipped
      FROM answers AS a;
    -- The tasks that ended release or cancel those waiting on them, in this transaction
    -- (version 37).
    PERFORM pgtaskd.end_parents(ARRAY(
        SELECT u.id FROM unnest(answer_ids, answer_written) AS u(id, written)
         WHERE u.written IN ('SUCCEEDED', 'FAILED', 'CANCELED')));
    RETURN QUERY
    SELECT u.id, u.written, u.current, u.skipped
      FROM unnest(answer_ids, answer_written, answer_current, answer_skipped)
           AS u(id, written, current, skipped);
END
$$;

-- Extend by `lease_ms` the leases of the claims `tokens` of tasks `ids` (one token per id)
-- that are still held, without waiting for any row lock: a row another transaction holds is
-- answered with `task_extended` false (docs/design.md, "No one else's lock delays a batch").
-- A claim missing from the answer is no longer held.
CREATE FUNCTION pgtaskd.heartbeat(ids bigint[], tokens bigint[], lease_ms float8)
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
CREATE FUNCTION pgtaskd.extend_lease(id bigint, token bigint, lease_ms float8)
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

-- Take back up to `max_tasks` expired leases, other than those of lease owner `owner` (the
-- rescuing daemon's key, schema 41): QUEUED with a backoff while attempts remain, else
-- FAILED; CANCELED where a cancel was requested.
-- Rows are picked with SKIP LOCKED and re-checked (still RUNNING, same token, lease still
-- expired), so rescuers of many daemons never fight and a lease extended meanwhile stays.
-- The tasks it ends are announced on `pgtaskd_done` in the same transaction. A claim whose
-- result a stopped daemon parked is left to `write_parked` ("Parked results", version 28).
CREATE FUNCTION pgtaskd.rescue(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_attempt int, task_previous_owner text, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    answer_ids      bigint[];
    answer_attempts int[];
    answer_owners   text[];
    answer_statuses text[];
BEGIN
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
                               t.attempt, pgtaskd.lease_holder(t.lease_owner))
               END,
               -- A lost lease is a failed attempt (version 30).
               errors = CASE
                   WHEN t.cancel_requested THEN t.errors
                   ELSE pgtaskd.error_history(t.errors, t.attempt, t.runs,
                            format('lease lost (last held by %s)', pgtaskd.lease_holder(t.lease_owner)))
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
        RETURNING t.id, expired.attempt, pgtaskd.lease_holder(expired.lease_owner) AS lease_owner,
                  t.status, t.queue
    ), freed AS (
        SELECT pgtaskd.notify_freed(array_agg(r.queue)) AS sent FROM rescued AS r
    ), notified AS (
        SELECT pgtaskd.notify_done(array_agg(r.id)) AS sent
          FROM rescued AS r WHERE r.status <> 'QUEUED'
    )
    SELECT array_agg(r.id ORDER BY r.id), array_agg(r.attempt ORDER BY r.id),
           array_agg(r.lease_owner ORDER BY r.id), array_agg(r.status ORDER BY r.id)
      INTO answer_ids, answer_attempts, answer_owners, answer_statuses
      FROM rescued AS r CROSS JOIN notified CROSS JOIN freed;
    -- The tasks that ended release or cancel those waiting on them (version 37).
    PERFORM pgtaskd.end_parents(ARRAY(
        SELECT u.id FROM unnest(answer_ids, answer_statuses) AS u(id, status)
         WHERE u.status IN ('FAILED', 'CANCELED')));
    RETURN QUERY
    SELECT u.id, u.attempt, u.owner, u.status
      FROM unnest(answer_ids, answer_attempts, answer_owners, answer_statuses)
           AS u(id, attempt, owner, status);
END
$$;

-- Park the results of claims `tokens` of tasks `ids` (the arrays of `pgtaskd.finish`), for
-- the rows still RUNNING under those claims. Reads the rows without locking them, so that a
-- row someone else holds does not hold it up. Returns the ids parked, now or before.
CREATE FUNCTION pgtaskd.park(
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
CREATE FUNCTION pgtaskd.write_parked(max_tasks bigint, owner text)
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
CREATE FUNCTION pgtaskd.release(id bigint, token bigint, wait boolean)
RETURNS TABLE (written text, current text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    answer_written text;
    answer_current text;
BEGIN
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
      INTO answer_written, answer_current
      FROM notified CROSS JOIN freed;
    -- A release that ends the task releases or cancels those waiting on it (version 37).
    IF answer_written = 'CANCELED' THEN
        PERFORM pgtaskd.end_parents(ARRAY[release.id]);
    END IF;
    RETURN QUERY SELECT answer_written, answer_current;
END
$$;

-- Where the claim of task `id` stands, read after any transaction that still holds the row
-- (`FOR SHARE`), such as one whose commit outcome is unknown: waiting for it with `wait`,
-- else failing with lock_not_available (55P03). No row: no such task.
CREATE FUNCTION pgtaskd.claim_state(id bigint, wait boolean)
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
CREATE FUNCTION pgtaskd.prune(
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
           -- Never a parent a task still waits on (version 37): its dependents go first.
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.parent = k.id)
           -- Never a member of a batch that has not ended (version 39): its end counts it.
           AND (k.batch_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                                WHERE b.id = k.batch_id AND b.ended_at IS NULL))
           -- Nor the callback of one (canceled by hand): the batch's end looks for it.
           AND (k.callback_of IS NULL
                OR NOT EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                                WHERE b.id = k.callback_of AND b.ended_at IS NULL))
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

-- ---------------------------------------------------------------------------------------
-- Dependencies (schema 37, docs/dependencies.md)
-- ---------------------------------------------------------------------------------------

-- Decide what the ends of parents `parents` (null: of every parent that has ended) make of
-- the WAITING tasks `children`, in the transaction that commits those ends: an edge to a
-- parent that SUCCEEDED is gone; one to a parent that FAILED or was CANCELED is gone under
-- `on_dep_failure` 'run', stays under 'wait' (until a retry of the parent ends it), and under
-- 'cancel' (unset) cancels the child, naming the parent, and then its own dependents, all in
-- this transaction. A child no edge holds any more is QUEUED and a daemon is woken. No
-- periodic pass releases anything ("Released in the parent's commit").
CREATE FUNCTION pgtaskd.settle_waiting(children bigint[], parents bigint[]) RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each row found by its key, whatever the statistics say: a child of 10,000 parents is
-- decided by reading the edges it needs, never all of them.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_sort = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    canceled bigint[];
    below    bigint[];
    released bigint;
    locked   bigint[] := settle_waiting.children;
BEGIN
    IF settle_waiting.parents IS NOT NULL THEN
        -- Most ends are not the last of their child's: a child with another parent QUEUED
        -- or RUNNING, held here (FOR SHARE, passing over one another transaction holds) so
        -- that it cannot end before this commit, is not released now, and that parent's end
        -- will see these edges gone. Every end of such a row locks it first (a claim, a
        -- finish batch, a rescue pass over it, and the claim is then settled alone; a cancel
        -- and a release wait). Such a child loses its edges to these parents without being
        -- locked, so that the parents of one child do not wait for one another's commits
        -- ("Released in the parent's commit"). A settle never locks a QUEUED or RUNNING
        -- row, so this hold waits for no one and makes no settle wait. The parent held is
        -- the newest, the last a claim would take.
        WITH candidates AS MATERIALIZED (
            SELECT c.id
              FROM pgtaskd.task_state AS c
             -- Every other row by its key too, through a lookup the planner cannot turn into
             -- a walk of the table (schema 45).
             CROSS JOIN LATERAL (SELECT r.on_dep_failure
                                   FROM pgtaskd.tasks AS r
                                  WHERE r.id = c.id
                                 OFFSET 0) AS t
             -- `coalesce(status, '')`: found by primary key, never by a scan of the partial
             -- index of every WAITING task.
             WHERE c.id = ANY (settle_waiting.children) AND coalesce(c.status, '') = 'WAITING'
               -- No end here cancels it.
               AND NOT (coalesce(t.on_dep_failure, 'cancel') = 'cancel' AND EXISTS (
                        SELECT 1 FROM pgtaskd.task_deps AS d
                         WHERE d.child = c.id AND d.parent = ANY (settle_waiting.parents)
                           AND (SELECT p.status FROM pgtaskd.task_state AS p
                                 WHERE p.id = d.parent) IN ('FAILED', 'CANCELED')))
        ), fast AS MATERIALIZED (
            -- Only then a parent is held: never for a child decided below anyway.
            SELECT c.id
              FROM candidates AS c
             WHERE EXISTS (SELECT 1
                             FROM (SELECT p.id
                                     -- The child's edges, newest parent first (`OFFSET 0`:
                                     -- read from the edges' key, never from the newest
                                     -- task of all backwards).
                                     FROM (SELECT d.parent
                                             FROM pgtaskd.task_deps AS d
                                            WHERE d.child = c.id
                                              AND NOT (d.parent = ANY (settle_waiting.parents))
                                            ORDER BY d.parent DESC
                                           OFFSET 0) AS x
                                    CROSS JOIN LATERAL (
                                           SELECT q.id FROM pgtaskd.task_state AS q
                                            WHERE q.id = x.parent
                                              AND coalesce(q.status, '') IN ('QUEUED', 'RUNNING')
                                              FOR SHARE SKIP LOCKED) AS p
                                    LIMIT 1) AS h)
        ), resolved AS (
            DELETE FROM pgtaskd.task_deps AS d
             WHERE d.child = ANY (ARRAY(SELECT f.id FROM fast AS f))
               AND d.parent = ANY (settle_waiting.parents)
               AND ((SELECT p.status FROM pgtaskd.task_state AS p WHERE p.id = d.parent)
                        = 'SUCCEEDED'
                    OR ((SELECT p.status FROM pgtaskd.task_state AS p WHERE p.id = d.parent)
                            IN ('FAILED', 'CANCELED')
                        AND (SELECT t.on_dep_failure FROM pgtaskd.tasks AS t
                              WHERE t.id = d.child) = 'run'))
        )
        SELECT ARRAY(SELECT x.id FROM unnest(settle_waiting.children) AS x(id)
                      WHERE NOT (x.id = ANY (ARRAY(SELECT f.id FROM fast AS f))))
          INTO locked;
        IF cardinality(locked) = 0 THEN
            RETURN '{}';
        END IF;
    END IF;
    -- The other children, locked in id order: a settle of a child waits for the one before
    -- it, and each statement below sees what that one committed. Where a parent failed, a
    -- cancel may cascade: every waiting task below these children is locked too, in the same
    -- order and the same statement, so that two cascades through one graph take their locks
    -- in one order and never deadlock.
    IF EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d
                WHERE d.child = ANY (locked)
                  AND (settle_waiting.parents IS NULL OR d.parent = ANY (settle_waiting.parents))
                  AND (SELECT p.status FROM pgtaskd.task_state AS p WHERE p.id = d.parent)
                      IN ('FAILED', 'CANCELED')) THEN
        PERFORM 1 FROM pgtaskd.task_state AS c
          WHERE c.id = ANY (ARRAY(
                    WITH RECURSIVE below (id) AS (
                        SELECT x.id FROM unnest(locked) AS x(id)
                        UNION
                        SELECT d.child FROM pgtaskd.task_deps AS d JOIN below AS b ON d.parent = b.id)
                    SELECT below.id FROM below))
            AND coalesce(c.status, '') = 'WAITING'
          ORDER BY c.id
            FOR UPDATE;
    ELSE
        PERFORM 1 FROM pgtaskd.task_state AS c
          WHERE c.id = ANY (locked) AND coalesce(c.status, '') = 'WAITING'
          ORDER BY c.id
            FOR UPDATE;
    END IF;
    WITH ended AS MATERIALIZED (
        -- Each edge of these children to a parent that has ended, with the child's policy.
        SELECT e.child, e.parent, e.outcome, coalesce(e.on_dep_failure, 'cancel') AS policy
          FROM (SELECT d.child, d.parent,
                       (SELECT p.status FROM pgtaskd.task_state AS p
                         WHERE p.id = d.parent) AS outcome,
                       (SELECT c.status FROM pgtaskd.task_state AS c
                         WHERE c.id = d.child) AS child_status,
                       t.on_dep_failure
                  FROM pgtaskd.task_deps AS d
                 CROSS JOIN LATERAL (SELECT r.on_dep_failure
                                       FROM pgtaskd.tasks AS r
                                      WHERE r.id = d.child
                                     OFFSET 0) AS t
                 WHERE d.child = ANY (locked)
                   AND (settle_waiting.parents IS NULL
                        OR d.parent = ANY (settle_waiting.parents))
                OFFSET 0) AS e
         WHERE coalesce(e.child_status, '') = 'WAITING'
           AND e.outcome IN ('SUCCEEDED', 'FAILED', 'CANCELED')
    ), resolved AS (
        DELETE FROM pgtaskd.task_deps AS d
         USING ended AS e
         WHERE d.child = e.child AND d.parent = e.parent
           AND (e.outcome = 'SUCCEEDED' OR e.policy = 'run')
    ), failing AS (
        -- The first parent that failed, named in the error.
        SELECT DISTINCT ON (e.child) e.child, e.parent, e.outcome
          FROM ended AS e
         WHERE e.outcome <> 'SUCCEEDED' AND e.policy = 'cancel'
         ORDER BY e.child, e.parent
    ), canceled_now AS (
        UPDATE pgtaskd.task_state AS s
           SET status = 'CANCELED',
               cancel_requested = true,
               canceled_by = f.parent,
               error = format('parent task %s %s', f.parent, lower(f.outcome)),
               finished_at = now()
          FROM failing AS f
         -- The failing children by their keys: the join alone could walk the whole table.
         WHERE s.id = ANY (ARRAY(SELECT g.child FROM failing AS g))
           AND s.id = f.child AND coalesce(s.status, '') = 'WAITING'
        RETURNING s.id
    )
    SELECT array_agg(n.id ORDER BY n.id) INTO canceled FROM canceled_now AS n;
    IF canceled IS NOT NULL THEN
        -- A canceled task waits for nothing any more; its own dependents are decided next,
        -- in this transaction (a cascade).
        DELETE FROM pgtaskd.task_deps AS d WHERE d.child = ANY (canceled);
        PERFORM pgtaskd.notify_done(canceled);
        SELECT array_agg(DISTINCT d.child) INTO below
          FROM pgtaskd.task_deps AS d
         WHERE d.parent = ANY (canceled);
        IF below IS NOT NULL THEN
            canceled := canceled || pgtaskd.settle_waiting(below, canceled);
        END IF;
    END IF;
    -- The children no edge holds: QUEUED, due from now at the earliest.
    WITH queued AS (
        UPDATE pgtaskd.task_state AS s
           SET status = 'QUEUED', run_at = greatest(s.run_at, now())
         WHERE s.id = ANY (locked) AND coalesce(s.status, '') = 'WAITING'
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.child = s.id)
        RETURNING s.id
    )
    SELECT count(*) INTO released FROM queued;
    IF released > 0 THEN
        PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    END IF;
    -- Every task canceled here and below, for the caller's batches (version 39).
    RETURN coalesce(canceled, '{}');
END
$$;

-- The tasks `ended` ended in this transaction: decide for each task waiting on one of them
-- (`pgtaskd.settle_waiting`). Called by every function that ends a task, after its write: the
-- finish (and so the parked results' write), the rescue, a cancel and a release.
CREATE FUNCTION pgtaskd.end_parents(ended bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    children  bigint[];
    all_ended bigint[];
BEGIN
    IF end_parents.ended IS NULL OR cardinality(end_parents.ended) = 0 THEN
        RETURN;
    END IF;
    -- Each statement here must see what committed before it: a snapshot held from the
    -- transaction's start would miss a task inserted since with these as parents, or a parent's
    -- end, and leave a task waiting for ever.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a task ends only in a READ COMMITTED transaction (this one is %): the tasks waiting on it are decided from what has committed',
            pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = '0A000',
                  HINT = 'Cancel it in a transaction of its own, or SET TRANSACTION ISOLATION LEVEL READ COMMITTED first.';
    END IF;
    SELECT array_agg(DISTINCT d.child) INTO children
      FROM pgtaskd.task_deps AS d
     WHERE d.parent = ANY (end_parents.ended);
    IF children IS NOT NULL THEN
        -- With the tasks its cascade canceled (version 39).
        all_ended := end_parents.ended || pgtaskd.settle_waiting(children, end_parents.ended);
    END IF;
    -- The batches they were members of, each row locked once, in id order (version 39).
    PERFORM pgtaskd.end_batches(coalesce(all_ended, end_parents.ended));
END
$$;

-- Tasks `ids` just put back to QUEUED by a retry: those with parents wait again for each
-- parent that has not SUCCEEDED (WAITING), and are then decided as at their insert. The
-- parents are held first (FOR SHARE, in id order), so that a parent ending meanwhile either
-- has ended before (and reads so) or waits for this commit and then finds the edges.
CREATE FUNCTION pgtaskd.wait_again(ids bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    waiting bigint[];
BEGIN
    IF wait_again.ids IS NULL OR cardinality(wait_again.ids) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM pgtaskd.task_state AS p
      WHERE p.id = ANY (ARRAY(SELECT DISTINCT x.parent
                                FROM pgtaskd.tasks AS t
                               CROSS JOIN LATERAL unnest(t.depends_on) AS x(parent)
                               WHERE t.id = ANY (wait_again.ids)))
      ORDER BY p.id
        FOR SHARE;
    INSERT INTO pgtaskd.task_deps (child, parent)
    SELECT DISTINCT t.id, x.parent
      FROM pgtaskd.tasks AS t
     CROSS JOIN LATERAL unnest(t.depends_on) AS x(parent)
      JOIN pgtaskd.task_state AS s ON s.id = t.id AND coalesce(s.status, '') = 'QUEUED'
      JOIN pgtaskd.task_state AS p ON p.id = x.parent AND p.status <> 'SUCCEEDED'
     WHERE t.id = ANY (wait_again.ids)
        ON CONFLICT DO NOTHING;
    WITH waits AS (
        UPDATE pgtaskd.task_state AS s
           SET status = 'WAITING'
         WHERE s.id = ANY (wait_again.ids) AND coalesce(s.status, '') = 'QUEUED'
           AND EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.child = s.id)
        RETURNING s.id
    )
    SELECT array_agg(w.id ORDER BY w.id) INTO waiting FROM waits AS w;
    IF waiting IS NOT NULL THEN
        -- The batches of the tasks it canceled (version 39).
        PERFORM pgtaskd.end_batches(pgtaskd.settle_waiting(waiting, NULL));
    END IF;
    -- A batch's callback brought back before its batch has ended waits for it again (version
    -- 39): the batch's end releases it.
    UPDATE pgtaskd.task_state AS s
       SET status = 'WAITING'
     WHERE s.id = ANY (wait_again.ids) AND coalesce(s.status, '') = 'QUEUED'
       AND s.callback_of IS NOT NULL
       AND EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                    WHERE b.id = s.callback_of AND b.ended_at IS NULL);
END
$$;

-- A FAILED or CANCELED task back to QUEUED as `pgtaskd.retry` does, and with it every task
-- its end canceled (`on_dep_failure` 'cancel'), and theirs, which wait for it again. One row
-- per task brought back: the task and its status before.
CREATE FUNCTION pgtaskd.retry_with_dependents(task_id bigint)
RETURNS TABLE (retried_id bigint, previous text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    first text;
    level bigint[];
    next_level bigint[];
BEGIN
    first := pgtaskd.retry(retry_with_dependents.task_id);
    retried_id := retry_with_dependents.task_id;
    previous := first;
    RETURN NEXT;
    IF first IS NULL OR first NOT IN ('FAILED', 'CANCELED') THEN
        RETURN;
    END IF;
    level := ARRAY[retry_with_dependents.task_id];
    LOOP
        WITH back AS (
            UPDATE pgtaskd.task_state AS t
               SET status = 'QUEUED',
                   attempt = 0,
                   snoozes = 0,
                   cancel_requested = false,
                   canceled_by = NULL,
                   error = NULL,
                   started_at = NULL,
                   finished_at = NULL,
                   run_at = now()
             WHERE t.id = ANY (ARRAY(SELECT k.id FROM pgtaskd.task_state AS k
                                      WHERE k.canceled_by = ANY (level)
                                        AND k.status = 'CANCELED'
                                      ORDER BY k.id
                                        FOR UPDATE))
               AND t.status = 'CANCELED'
            RETURNING t.id
        )
        SELECT array_agg(b.id ORDER BY b.id) INTO next_level FROM back AS b;
        EXIT WHEN next_level IS NULL;
        PERFORM pgtaskd.wait_again(next_level);
        RETURN QUERY SELECT u.id, 'CANCELED'::text FROM unnest(next_level) AS u(id);
        level := next_level;
    END LOOP;
END
$$;

-- An auditor for tests and operators: one row for every inconsistency of the dependency
-- edges it finds, in one snapshot; it repairs nothing. Empty is the only right answer.
CREATE FUNCTION pgtaskd.check_deps()
RETURNS TABLE (task_id bigint, problem text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Waiting for nothing.
    SELECT s.id, 'WAITING with no edge left'
      FROM pgtaskd.task_state AS s
     WHERE s.status = 'WAITING'
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d WHERE d.child = s.id)
       -- A batch's callback waits for its batch, not for edges (version 39).
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                        WHERE b.id = s.callback_of AND b.ended_at IS NULL)
    UNION ALL
    -- An edge its parent's end should have taken.
    SELECT d.child, format('an edge to task %s, which is %s', d.parent, coalesce(p.status, 'gone'))
      FROM pgtaskd.task_deps AS d
      LEFT JOIN pgtaskd.task_state AS p ON p.id = d.parent
      LEFT JOIN pgtaskd.tasks AS t ON t.id = d.child
     WHERE p.id IS NULL OR p.status = 'SUCCEEDED'
        OR (p.status IN ('FAILED', 'CANCELED') AND coalesce(t.on_dep_failure, 'cancel') <> 'wait')
    UNION ALL
    -- An edge of a task that does not wait.
    SELECT d.child, format('an edge to task %s, but the task is %s', d.parent, coalesce(c.status, 'gone'))
      FROM pgtaskd.task_deps AS d
      LEFT JOIN pgtaskd.task_state AS c ON c.id = d.child
     WHERE c.id IS NULL OR c.status <> 'WAITING'
    UNION ALL
    -- An edge the task never asked for.
    SELECT d.child, format('an edge to task %s, which it does not depend on', d.parent)
      FROM pgtaskd.task_deps AS d
      JOIN pgtaskd.tasks AS t ON t.id = d.child
     WHERE NOT (d.parent = ANY (coalesce(t.depends_on, '{}')))
    UNION ALL
    -- A waiting task missing the edge to a parent that has not ended, or that failed under
    -- 'wait': it would be released before that parent. Not under 'run', where a parent's
    -- first end takes the edge for good, and a retry of that parent leaves it QUEUED again.
    SELECT s.id, format('no edge to task %s, which is %s', x.parent, p.status)
      FROM pgtaskd.task_state AS s
      JOIN pgtaskd.tasks AS t ON t.id = s.id
     CROSS JOIN LATERAL unnest(t.depends_on) AS x(parent)
      JOIN pgtaskd.task_state AS p ON p.id = x.parent
     WHERE s.status = 'WAITING'
       AND p.status <> 'SUCCEEDED'
       AND coalesce(t.on_dep_failure, 'cancel') <> 'run'
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_deps AS d
                        WHERE d.child = s.id AND d.parent = x.parent)
    UNION ALL
    -- A batch whose end was missed: sealed, every member ended, and not ended (version 39).
    SELECT b.callback, format('batch %s is sealed and its members have ended, but it has not ended', b.id)
      FROM pgtaskd.batches AS b
     WHERE b.sealed_at IS NOT NULL AND b.ended_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS m
                        WHERE m.batch_id = b.id AND m.status IN ('WAITING', 'QUEUED', 'RUNNING'))
    UNION ALL
    -- A callback left waiting by its batch's end, or let go before it.
    SELECT s.id, format('the callback of batch %s is %s, but the batch %s', b.id, s.status,
                        CASE WHEN b.ended_at IS NULL THEN 'has not ended' ELSE 'has ended' END)
      FROM pgtaskd.batches AS b
      JOIN pgtaskd.task_state AS s ON s.id = b.callback
     WHERE (b.ended_at IS NOT NULL AND s.status = 'WAITING')
        OR (b.ended_at IS NULL AND s.status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED'))
    UNION ALL
    -- A batch that ended without counting every member (members retried after the end
    -- change their outcome, and retention takes some: neither adds one).
    SELECT b.callback, format('batch %s counted %s members, but has %s',
                              b.id, b.succeeded + b.failed + b.canceled, m.n)
      FROM pgtaskd.batches AS b
     CROSS JOIN LATERAL (SELECT count(*) AS n FROM pgtaskd.task_state AS x
                          WHERE x.batch_id = b.id) AS m
     WHERE b.ended_at IS NOT NULL
       AND m.n > b.succeeded + b.failed + b.canceled
$$;

-- Open a batch (version 39, docs/dependencies.md, "Batches"): its callback task, in queue
-- `callback_queue` with `payload`, is WAITING until the batch is sealed and its last member
-- has ended; it then runs if `callback_on` is 'finish', or is 'success' and every member
-- SUCCEEDED, and is CANCELED otherwise. Answers the batch's id; members are inserted with it
-- as `batch_id`.
CREATE FUNCTION pgtaskd.open_batch(callback_queue text, callback_on text, payload text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    callback_id bigint;
    new_batch   bigint;
BEGIN
    IF open_batch.callback_on IS NULL OR open_batch.callback_on NOT IN ('success', 'finish') THEN
        RAISE EXCEPTION 'a batch''s callback runs on success or on finish, not on %',
            coalesce(open_batch.callback_on, 'null')
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO pgtaskd.tasks (queue, payload)
    VALUES (coalesce(open_batch.callback_queue, 'default'), open_batch.payload)
    RETURNING id INTO callback_id;
    INSERT INTO pgtaskd.batches (callback, callback_on)
    VALUES (callback_id, open_batch.callback_on)
    RETURNING id INTO new_batch;
    UPDATE pgtaskd.task_state AS s
       SET status = 'WAITING', callback_of = new_batch
     WHERE s.id = callback_id;
    RETURN new_batch;
END
$$;

-- Decide batch `batch_id`, whose row the caller holds locked: if it is sealed and has not
-- ended, and no member is WAITING, QUEUED or RUNNING (read after the lock: every end
-- committed before it is seen), it ends now: the members are counted by outcome, and its
-- callback is QUEUED (a daemon is woken) or CANCELED naming the counts, once.
CREATE FUNCTION pgtaskd.decide_batch(batch_id bigint) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    b           record;
    n_succeeded bigint;
    n_failed    bigint;
    n_canceled  bigint;
BEGIN
    SELECT x.id, x.callback, x.callback_on, x.sealed_at, x.ended_at INTO b
      FROM pgtaskd.batches AS x
     WHERE x.id = decide_batch.batch_id;
    IF NOT FOUND OR b.sealed_at IS NULL OR b.ended_at IS NOT NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pgtaskd.task_state AS m
                WHERE m.batch_id = b.id AND m.status IN ('WAITING', 'QUEUED', 'RUNNING')) THEN
        RETURN;
    END IF;
    -- The callback's row first: a retry or a cancel of it in flight commits before it is read
    -- below, and a retry that follows reads the batch ended.
    PERFORM 1 FROM pgtaskd.task_state AS s WHERE s.id = b.callback FOR UPDATE;
    SELECT count(*) FILTER (WHERE m.status = 'SUCCEEDED'),
           count(*) FILTER (WHERE m.status = 'FAILED'),
           count(*) FILTER (WHERE m.status = 'CANCELED')
      INTO n_succeeded, n_failed, n_canceled
      FROM pgtaskd.task_state AS m
     WHERE m.batch_id = b.id;
    UPDATE pgtaskd.batches AS x
       SET ended_at = now(), succeeded = n_succeeded, failed = n_failed, canceled = n_canceled
     WHERE x.id = b.id;
    IF b.callback_on = 'finish' OR (n_failed = 0 AND n_canceled = 0) THEN
        UPDATE pgtaskd.task_state AS s
           SET status = 'QUEUED', run_at = greatest(s.run_at, now())
         WHERE s.id = b.callback AND coalesce(s.status, '') = 'WAITING';
        IF FOUND THEN
            PERFORM pgtaskd.notify('pgtaskd_tasks', '');
        END IF;
    ELSE
        UPDATE pgtaskd.task_state AS s
           SET status = 'CANCELED',
               cancel_requested = true,
               error = format('batch %s: %s of its %s members failed and %s were canceled',
                              b.id, n_failed, n_succeeded + n_failed + n_canceled, n_canceled),
               finished_at = now()
         WHERE s.id = b.callback AND coalesce(s.status, '') = 'WAITING';
        IF FOUND THEN
            PERFORM pgtaskd.notify_done(ARRAY[b.callback]);
            PERFORM pgtaskd.end_parents(ARRAY[b.callback]);
        END IF;
    END IF;
END
$$;

-- The tasks `ended` ended in this transaction (called by `pgtaskd.end_parents`, so by every
-- function that ends a task): decide each batch one of them was a member of. Most ends are
-- not their batch's last: a batch with another member QUEUED or RUNNING, held here (FOR
-- SHARE, passing over rows another transaction holds) so that it cannot end before this
-- commit, is left to that member's end, which will see this one. Otherwise the batch's row is
-- locked (FOR NO KEY UPDATE, in id order: producers adding members hold FOR KEY SHARE, which
-- does not wait for it; a seal holds FOR UPDATE) and the batch is decided from what has
-- committed (`pgtaskd.decide_batch`). No periodic pass ends a batch.
CREATE FUNCTION pgtaskd.end_batches(ended bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    open_ids bigint[];
    b        bigint;
BEGIN
    -- Read by primary key (the filter, not the condition, names `batch_id`: the index of
    -- members would read every member of every batch).
    SELECT array_agg(DISTINCT s.batch_id)
               FILTER (WHERE s.batch_id IS NOT NULL
                         AND s.status IN ('SUCCEEDED', 'FAILED', 'CANCELED'))
      INTO open_ids
      FROM pgtaskd.task_state AS s
     WHERE s.id = ANY (end_batches.ended);
    IF open_ids IS NULL THEN
        RETURN;
    END IF;
    open_ids := ARRAY(
        SELECT x.id FROM unnest(open_ids) AS x(id)
         WHERE NOT EXISTS (SELECT 1
                             FROM (SELECT m.id
                                     FROM pgtaskd.task_state AS m
                                    WHERE m.batch_id = x.id
                                      AND m.status IN ('QUEUED', 'RUNNING')
                                    LIMIT 1
                                      FOR SHARE OF m SKIP LOCKED) AS h)
         ORDER BY x.id);
    IF cardinality(open_ids) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM pgtaskd.batches AS x
      WHERE x.id = ANY (open_ids) AND x.ended_at IS NULL
      ORDER BY x.id
        FOR NO KEY UPDATE;
    FOREACH b IN ARRAY open_ids LOOP
        PERFORM pgtaskd.decide_batch(b);
    END LOOP;
END
$$;

-- Seal batch `batch_id`: no member can join it any more, and it ends once its last member
-- has ended (at once if they all have). Waits for the producers still adding members (their
-- FOR KEY SHARE), so that each member they commit is counted. Answers the batch's state after:
-- 'sealed' or 'ended'. Sealing a sealed batch changes nothing.
CREATE FUNCTION pgtaskd.seal_batch(batch_id bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    sealed timestamptz;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a batch is sealed only in a READ COMMITTED transaction (this one is %): its end is decided from what has committed',
            pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = '0A000',
                  HINT = 'Seal it in a transaction of its own, or SET TRANSACTION ISOLATION LEVEL READ COMMITTED first.';
    END IF;
    SELECT x.sealed_at INTO sealed
      FROM pgtaskd.batches AS x
     WHERE x.id = seal_batch.batch_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % does not exist', seal_batch.batch_id
            USING ERRCODE = 'P0002';
    END IF;
    IF sealed IS NULL THEN
        UPDATE pgtaskd.batches AS x SET sealed_at = now() WHERE x.id = seal_batch.batch_id;
    END IF;
    PERFORM pgtaskd.decide_batch(seal_batch.batch_id);
    RETURN (SELECT CASE WHEN x.ended_at IS NULL THEN 'sealed' ELSE 'ended' END
              FROM pgtaskd.batches AS x
             WHERE x.id = seal_batch.batch_id);
END
$$;

-- Write handlers' progress (version 39, docs/handlers.md): for each task `ids[i]` still
-- RUNNING under the claim `tokens[i]`, `progress[i]` (a JSON object of at most 4 KiB), passing
-- over rows another transaction holds (a flush never waits; the next one tries again). Answers
-- the ids written. A write from a claim that is no longer current changes nothing; progress is
-- never cleared, so the next attempt reads what the last one wrote.
CREATE FUNCTION pgtaskd.write_progress(ids bigint[], tokens bigint[], progress jsonb[])
RETURNS TABLE (task_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT DISTINCT ON (u.id) u.id, u.token, u.progress
          FROM unnest(write_progress.ids, write_progress.tokens, write_progress.progress)
               AS u(id, token, progress)
         ORDER BY u.id
    ), held AS MATERIALIZED (
        SELECT k.id FROM pgtaskd.task_state AS k
         WHERE k.id = ANY (write_progress.ids)
         ORDER BY k.id
           FOR NO KEY UPDATE SKIP LOCKED
    ), written AS (
        UPDATE pgtaskd.task_state AS t
           SET progress = i.progress, progress_at = now()
          FROM input AS i
         WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
           AND t.id = i.id
           AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = i.token
           AND jsonb_typeof(i.progress) = 'object'
           AND octet_length(i.progress::text) <= 4096
        RETURNING t.id
    )
    SELECT written.id FROM written;
END
$$;

-- Insert a whole graph of tasks in one transaction, named by local refs: `graph` is a JSON
-- array of objects {"ref", "payload", and optionally "queue", "priority", "run_at",
-- "max_attempts", "idempotency_key", "concurrency_key", "on_dep_failure", "tags",
-- "metadata" (schema 38), "after"}, where
-- "after" lists refs of the graph (strings) and ids of tasks already there (numbers). Parents
-- are inserted before their children, so each parent's id is the smaller; a cycle is refused
-- naming it (`cycle: a -> b -> a`, each waiting for the next) and nothing is inserted. With
-- the caller's rights: a producer inserts as itself. One row per task: its ref and its id.
CREATE FUNCTION pgtaskd.enqueue_graph(graph jsonb)
RETURNS TABLE (ref text, task_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n         int;
    ords      jsonb;
    bad       text;
    e_parent  int[];
    e_child   int[];
    first_out int[];
    indegree  int[];
    ready     int[];
    placed    int[] := '{}';
    ids       bigint[];
    node      jsonb;
    u         int;
    v         int;
    i         int;
    head      int := 1;
    walk      int[];
    seen      int[];
    pred      int[];
    new_id    bigint;
BEGIN
    IF enqueue_graph.graph IS NULL OR jsonb_typeof(enqueue_graph.graph) <> 'array' THEN
        RAISE EXCEPTION 'enqueue_graph: the graph is a JSON array of tasks'
            USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(enqueue_graph.graph);
    IF n = 0 THEN
        RETURN;
    END IF;
    IF n > 100000 THEN
        RAISE EXCEPTION 'enqueue_graph: % tasks, at most 100000 in one graph', n
            USING ERRCODE = '54000';
    END IF;
    -- Each task an object with a ref of its own and a payload.
    SELECT format('task %s: %s', e.ord,
                  CASE WHEN jsonb_typeof(e.node) <> 'object' THEN 'not a JSON object'
                       WHEN jsonb_typeof(e.node -> 'ref') IS DISTINCT FROM 'string'
                            OR e.node ->> 'ref' = '' THEN '"ref" is not a non-empty string'
                       WHEN jsonb_typeof(e.node -> 'payload') IS DISTINCT FROM 'string'
                            THEN '"payload" is not a string'
                       ELSE '"after" is not an array of refs and ids' END)
      INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord)
     WHERE jsonb_typeof(e.node) <> 'object'
        OR jsonb_typeof(e.node -> 'ref') IS DISTINCT FROM 'string' OR e.node ->> 'ref' = ''
        OR jsonb_typeof(e.node -> 'payload') IS DISTINCT FROM 'string'
        OR (e.node ? 'after' AND (jsonb_typeof(e.node -> 'after') <> 'array'
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.node -> 'after') AS a
                        WHERE jsonb_typeof(a) NOT IN ('string', 'number'))))
     ORDER BY e.ord
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: %', bad USING ERRCODE = '22023';
    END IF;
    -- The first ten refs named twice or more, each cut to 100 characters (schema 42).
    SELECT string_agg(left(d.ref, 100), ', ' ORDER BY d.ref) FILTER (WHERE d.k <= 10)
           || CASE WHEN count(*) > 10 THEN format(' and %s more', count(*) - 10) ELSE '' END
      INTO bad
      FROM (SELECT e.node ->> 'ref' AS ref, row_number() OVER (ORDER BY e.node ->> 'ref') AS k
              FROM jsonb_array_elements(enqueue_graph.graph) AS e(node)
             GROUP BY e.node ->> 'ref' HAVING count(*) > 1) AS d;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: more than one task has ref %', bad USING ERRCODE = '22023';
    END IF;
    -- ref -> position, 1 to n.
    SELECT jsonb_object_agg(e.node ->> 'ref', e.ord) INTO ords
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord);
    -- The first task waiting for a ref no task has, both refs cut to 100 characters
    -- (schema 43).
    SELECT format('task %s waits for ref %s, which the graph does not name',
                  left(e.node ->> 'ref', 100), left(a.ref #>> '{}', 100))
      INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord),
           jsonb_array_elements(coalesce(e.node -> 'after', '[]')) WITH ORDINALITY AS a(ref, k)
     WHERE jsonb_typeof(a.ref) = 'string' AND NOT ords ? (a.ref #>> '{}')
     ORDER BY e.ord, a.k
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: %', bad USING ERRCODE = '22023';
    END IF;
    -- The edges between refs, by parent: first_out[u] .. first_out[u + 1] - 1.
    SELECT coalesce(array_agg(x.p ORDER BY x.p, x.c), '{}'),
           coalesce(array_agg(x.c ORDER BY x.p, x.c), '{}')
      INTO e_parent, e_child
      FROM (SELECT DISTINCT (ords ->> (a #>> '{}'))::int AS p, e.ord::int AS c
              FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord),
                   jsonb_array_elements(coalesce(e.node -> 'after', '[]')) AS a
             WHERE jsonb_typeof(a) = 'string') AS x;
    indegree := array_fill(0, ARRAY[n]);
    first_out := array_fill(0, ARRAY[n + 1]);
    FOR i IN 1 .. coalesce(array_length(e_child, 1), 0) LOOP
        indegree[e_child[i]] := indegree[e_child[i]] + 1;
        first_out[e_parent[i]] := first_out[e_parent[i]] + 1;
    END LOOP;
    -- Counts to starts (prefix sums).
    v := 1;
    FOR u IN 1 .. n + 1 LOOP
        i := first_out[u];
        first_out[u] := v;
        v := v + i;
    END LOOP;
    -- Kahn's order, the graph's own order among tasks ready together.
    ready := ARRAY(SELECT g FROM generate_series(1, n) AS g WHERE indegree[g] = 0);
    WHILE head <= coalesce(array_length(ready, 1), 0) LOOP
        u := ready[head];
        head := head + 1;
        placed := placed || u;
        FOR i IN first_out[u] .. first_out[u + 1] - 1 LOOP
            indegree[e_child[i]] := indegree[e_child[i]] - 1;
            IF indegree[e_child[i]] = 0 THEN
                ready := ready || e_child[i];
            END IF;
        END LOOP;
    END LOOP;
    IF coalesce(array_length(placed, 1), 0) < n THEN
        -- Every task left waits for another task left: its first such parent (the edges are
        -- in parent order), found in one pass over the edges (schema 42: one search of all
        -- the edges a step made a cycle of 100,000 tasks take most of an hour). Follow them
        -- from the first task left until a task comes round again.
        pred := array_fill(0, ARRAY[n]);
        FOR i IN 1 .. coalesce(array_length(e_child, 1), 0) LOOP
            IF pred[e_child[i]] = 0 AND indegree[e_child[i]] > 0
               AND indegree[e_parent[i]] > 0 THEN
                pred[e_child[i]] := e_parent[i];
            END IF;
        END LOOP;
        u := (SELECT min(g) FROM generate_series(1, n) AS g WHERE indegree[g] > 0);
        seen := array_fill(0, ARRAY[n]);
        walk := '{}';
        WHILE seen[u] = 0 LOOP
            seen[u] := coalesce(array_length(walk, 1), 0) + 1;
            walk := walk || u;
            u := pred[u];
        END LOOP;
        walk := walk[seen[u]:] || u;
        -- A long cycle is named by its first and last ten steps, and each ref by its first
        -- 100 characters: the error stays a line.
        i := array_length(walk, 1);
        IF i > 21 THEN
            walk := walk[1:10] || 0 || walk[i - 9:i];
        END IF;
        RAISE EXCEPTION 'cycle: %',
            (SELECT string_agg(CASE WHEN w.o = 0 THEN format('(%s more)', i - 20)
                                    ELSE left(enqueue_graph.graph -> (w.o - 1) ->> 'ref', 100)
                               END, ' -> ' ORDER BY w.k)
               FROM unnest(walk) WITH ORDINALITY AS w(o, k))
            USING ERRCODE = '22023';
    END IF;
    ids := array_fill(NULL::bigint, ARRAY[n]);
    FOREACH u IN ARRAY placed LOOP
        node := enqueue_graph.graph -> (u - 1);
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts,
                                   idempotency_key, concurrency_key, on_dep_failure, depends_on,
                                   tags, metadata)
        VALUES (node ->> 'payload',
                coalesce(node ->> 'queue', 'default'),
                coalesce((node ->> 'priority')::smallint, 0),
                coalesce((node ->> 'run_at')::timestamptz, now()),
                (node ->> 'max_attempts')::int,
                node ->> 'idempotency_key',
                node ->> 'concurrency_key',
                node ->> 'on_dep_failure',
                nullif(ARRAY(SELECT CASE WHEN jsonb_typeof(a) = 'string'
                                         THEN ids[(ords ->> (a #>> '{}'))::int]
                                         ELSE (a #>> '{}')::bigint END
                               FROM jsonb_array_elements(coalesce(node -> 'after', '[]')) AS a),
                       '{}'),
                CASE WHEN node ? 'tags' THEN
                    ARRAY(SELECT g #>> '{}' FROM jsonb_array_elements(node -> 'tags') AS g) END,
                node -> 'metadata')
        RETURNING id INTO new_id;
        ids[u] := new_id;
        ref := node ->> 'ref';
        task_id := new_id;
        RETURN NEXT;
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------------------
-- Functions for operators: pause, resume, retry, vacuum health
-- ---------------------------------------------------------------------------------------

-- Pause a queue: claims skip it from their next statement ("Table `pgtaskd.paused_queues`",
-- "Functions").
CREATE FUNCTION pgtaskd.pause_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO pgtaskd.paused_queues AS p (queue) VALUES (pause_queue.queue)
        ON CONFLICT (queue) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgtaskd.notify('pgtaskd_queues', pause_queue.queue);
    RETURN true;
END
$$;

-- Resume a queue, and wake every daemon to claim from it at once.
CREATE FUNCTION pgtaskd.resume_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    DELETE FROM pgtaskd.paused_queues AS p WHERE p.queue = resume_queue.queue;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgtaskd.notify('pgtaskd_queues', resume_queue.queue);
    PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    RETURN true;
END
$$;

-- Set the settings of `queue` named in `settings` (a JSON object: `max_running`,
-- `max_running_per_key`, `rate_limit` with `rate_period`, `max_attempts`, `retain`; a JSON
-- null removes one), keep the others, and wake every daemon. Returns the settings now in
-- force; a queue left with none loses its row.
CREATE FUNCTION pgtaskd.set_queue(queue text, settings jsonb) RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    known CONSTANT text[] := ARRAY['max_running', 'max_running_per_key', 'rate_limit',
                                   'rate_period', 'max_attempts', 'retain'];
    unknown text;
    kept pgtaskd.queue_settings;
BEGIN
    IF settings IS NULL OR jsonb_typeof(settings) <> 'object' THEN
        RAISE EXCEPTION 'pgtaskd.set_queue: the settings must be a JSON object'
            USING ERRCODE = '22023';
    END IF;
    SELECT k INTO unknown FROM jsonb_object_keys(settings) AS k WHERE k <> ALL (known) LIMIT 1;
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'pgtaskd.set_queue: unknown setting "%" (known: %)', unknown,
            array_to_string(known, ', ')
            USING ERRCODE = '22023';
    END IF;
    IF (settings ? 'rate_limit') <> (settings ? 'rate_period') THEN
        RAISE EXCEPTION 'pgtaskd.set_queue: rate_limit and rate_period are set together'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO pgtaskd.queue_settings AS s (queue) VALUES (set_queue.queue)
        ON CONFLICT (queue) DO NOTHING;
    UPDATE pgtaskd.queue_settings AS s
       SET max_running = CASE WHEN settings ? 'max_running'
                              THEN (settings ->> 'max_running')::int ELSE s.max_running END,
           max_running_per_key = CASE WHEN settings ? 'max_running_per_key'
                                      THEN (settings ->> 'max_running_per_key')::int
                                      ELSE s.max_running_per_key END,
           rate_limit = CASE WHEN settings ? 'rate_limit'
                             THEN (settings ->> 'rate_limit')::int ELSE s.rate_limit END,
           rate_period = CASE WHEN settings ? 'rate_period'
                              THEN (settings ->> 'rate_period')::interval ELSE s.rate_period END,
           max_attempts = CASE WHEN settings ? 'max_attempts'
                               THEN (settings ->> 'max_attempts')::int ELSE s.max_attempts END,
           retain = CASE WHEN settings ? 'retain'
                         THEN (settings ->> 'retain')::interval ELSE s.retain END,
           updated_at = now()
     WHERE s.queue = set_queue.queue
    RETURNING s.* INTO kept;
    IF kept.rate_limit IS NULL THEN
        DELETE FROM pgtaskd.queue_starts AS r WHERE r.queue = set_queue.queue;
    END IF;
    IF kept.max_running IS NULL AND kept.max_running_per_key IS NULL AND kept.rate_limit IS NULL
       AND kept.max_attempts IS NULL AND kept.retain IS NULL THEN
        DELETE FROM pgtaskd.queue_settings AS s WHERE s.queue = set_queue.queue;
    END IF;
    -- A raised or removed limit lets waiting tasks start now.
    PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'queue', set_queue.queue,
        'max_running', kept.max_running,
        'max_running_per_key', kept.max_running_per_key,
        'rate_limit', kept.rate_limit,
        'rate_period', kept.rate_period::text,
        'max_attempts', kept.max_attempts,
        'retain', kept.retain::text));
END
$$;

-- A slot of a running limit may have been freed by tasks of `queues` that stopped running:
-- wake the daemons waiting for one.
CREATE FUNCTION pgtaskd.notify_freed(queues text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgtaskd.queue_settings AS s
                WHERE s.queue = ANY (notify_freed.queues)
                  AND (s.max_running IS NOT NULL OR s.max_running_per_key IS NOT NULL)) THEN
        PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    END IF;
END
$$;

-- A FAILED or CANCELED task back to QUEUED, as if new ("States").
CREATE FUNCTION pgtaskd.retry(task_id bigint) RETURNS text
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
           canceled_by = NULL,
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
    -- A task with parents waits again for those that have not SUCCEEDED (version 37).
    PERFORM pgtaskd.wait_again(ARRAY[retry.task_id]);
    PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    RETURN previous;
END
$$;

-- At most `max_rows` FAILED tasks of a queue above `after_id` back to QUEUED, as
-- `pgtaskd.retry` does; one batch per call, called until `retried` is 0 ("States").
CREATE FUNCTION pgtaskd.retry_failed(
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
DECLARE
    back bigint[];
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
               canceled_by = NULL,
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
    SELECT count(*), coalesce(max(done.id), coalesce(retry_failed.after_id, 0)),
           array_agg(done.id ORDER BY done.id)
      INTO retried, last_id, back
      FROM done;
    -- Tasks with parents wait again for those that have not SUCCEEDED (version 37).
    PERFORM pgtaskd.wait_again(back);
    IF retried > 0 THEN
        PERFORM pgtaskd.notify('pgtaskd_tasks', '');
    END IF;
END
$$;

-- One row: the bloat of `pgtaskd.task_state`, the table claims and finishes write (version
-- 36), and the oldest xmin horizon holding back its vacuum, with its owner's rights and never
-- a query's text ("Vacuum health").
CREATE FUNCTION pgtaskd.vacuum_health(
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

COMMENT ON FUNCTION pgtaskd.vacuum_health() IS
    'pgtaskd: bloat of pgtaskd.task_state and the oldest xmin horizon holding back its vacuum; no query text';

-- ---------------------------------------------------------------------------------------
-- The idle flags' functions and the triggers ("Idle flags")
-- ---------------------------------------------------------------------------------------

-- The insert trigger's function: `NOTIFY pgtaskd_tasks` while some daemon's flag is live,
-- unless the transaction set `pgtaskd.notify = off` ("Idle flags", "Prepared producers").
-- It runs on every producer's INSERT or COPY statement that passes the trigger's condition,
-- so it sets no search_path (a SET clause costs every call) and names everything instead.
CREATE FUNCTION pgtaskd.notify_tasks() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
BEGIN
    IF pg_catalog.lower(pg_catalog.current_setting('pgtaskd.notify', true))
       OPERATOR(pg_catalog.=) ANY (ARRAY['off', 'false', 'no', '0']) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1
                 FROM pgtaskd.idle_daemons AS d
                WHERE d.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) THEN
        PERFORM pg_catalog.pg_notify('pgtaskd_tasks', '');
    END IF;
    RETURN NULL;
END
$$;

-- The latest expiry of a live flag, in whole milliseconds, or 0: what `idle_until` is set to.
CREATE FUNCTION pgtaskd.idle_flags_until() RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT least(coalesce(pg_catalog.ceil(pg_catalog.date_part('epoch', pg_catalog.max(d.expires_at))
                                          OPERATOR(pg_catalog.*) 1000::pg_catalog.float8),
                          0),
                 9.2e18::pg_catalog.float8)::bigint
      FROM pgtaskd.idle_daemons AS d
     WHERE d.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
$$;

-- Before a statement writes flags: take the turn (a lock on the flags table that conflicts
-- only with itself and vacuum's), so that each writer reads the flags after the previous
-- one committed; tried for at most half a second ("Idle flags").
CREATE FUNCTION pgtaskd.take_idle_turn() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- After a statement wrote flags: with the turn, set `idle_until` from the flags; without it,
-- only raise it.
CREATE FUNCTION pgtaskd.set_idle_until() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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

-- One NOTIFY per INSERT or COPY statement while a daemon is idle. The WHEN condition, which
-- PostgreSQL evaluates as the inserting role without calling a function, reads the hint; every
-- name in it is qualified ("Idle flags", "The hint (schema 14)"). Sites that poll:
-- `ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify`.
CREATE TRIGGER tasks_notify
    AFTER INSERT ON pgtaskd.tasks
    FOR EACH STATEMENT
    WHEN (pg_catalog.has_sequence_privilege('pgtaskd.idle_until'::pg_catalog.regclass, 'SELECT')
          AND pg_catalog.pg_sequence_last_value('pgtaskd.idle_until'::pg_catalog.regclass)::pg_catalog.float8
              OPERATOR(pg_catalog.>)
              (pg_catalog.date_part('epoch', pg_catalog.now()) OPERATOR(pg_catalog.*) 1000::pg_catalog.float8))
    EXECUTE FUNCTION pgtaskd.notify_tasks();

-- The producer's statement fills the state table itself, whatever its size (an INSERT, an
-- INSERT ... SELECT, a COPY): one INSERT ... SELECT per statement over its new rows. With the
-- owner's rights: producers have no right on the state table. Like every trigger, these do
-- not fire where `session_replication_role` is `replica` (a logical replication apply, a
-- restore with triggers disabled): those copy both tables. A task with parents is WAITING,
-- with an edge to each (version 37); each parent must exist.
CREATE FUNCTION pgtaskd.tasks_state() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each parent and child row by its key, whatever the statistics say (schema 45).
SET enable_seqscan = off
AS $$
DECLARE
    missing bigint;
BEGIN
    INSERT INTO pgtaskd.task_state (id, queue, priority, run_at, max_attempts, concurrency_key,
                                    status, batch_id)
    SELECT n.id, n.queue, n.priority, n.run_at, n.max_attempts, n.concurrency_key,
           CASE WHEN cardinality(n.depends_on) > 0 THEN 'WAITING' ELSE 'QUEUED' END,
           n.batch_id
      FROM new_tasks AS n
    -- A state row loaded before its task row (a data-only restore of both tables) is kept.
        ON CONFLICT (id) DO NOTHING;
    IF EXISTS (SELECT 1 FROM new_tasks AS n WHERE cardinality(n.depends_on) > 0) THEN
        SELECT x.parent INTO missing
          FROM new_tasks AS n
         CROSS JOIN LATERAL unnest(n.depends_on) AS x(parent)
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = x.parent OFFSET 0)
         LIMIT 1;
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'task depends on task %, which does not exist', missing
                USING ERRCODE = '23503';
        END IF;
        -- The edges of the tasks that wait (not those of a restored task that ended).
        INSERT INTO pgtaskd.task_deps (child, parent)
        SELECT DISTINCT n.id, x.parent
          FROM new_tasks AS n
         CROSS JOIN LATERAL unnest(n.depends_on) AS x(parent)
         WHERE EXISTS (SELECT 1 FROM pgtaskd.task_state AS s
                        WHERE s.id = n.id AND s.status = 'WAITING' OFFSET 0)
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_state() FROM PUBLIC;
CREATE TRIGGER tasks_state AFTER INSERT ON pgtaskd.tasks
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.tasks_state();

-- Before the CHECK of each new task with parents (version 37): a parent not older than the
-- task is named, as not existing (ids only grow), or, written by the owner with an id of its
-- choosing, as newer.
CREATE FUNCTION pgtaskd.tasks_parents_check() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    newer bigint;
BEGIN
    SELECT max(x.parent) INTO newer
      FROM unnest(NEW.depends_on) AS x(parent)
     WHERE x.parent >= NEW.id;
    IF newer IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = newer) THEN
            RAISE EXCEPTION 'task % may depend only on tasks inserted before it, not on task % (tasks_depends_on_earlier)',
                NEW.id, newer
                USING ERRCODE = '23514', CONSTRAINT = 'tasks_depends_on_earlier';
        END IF;
        RAISE EXCEPTION 'task depends on task %, which does not exist', newer
            USING ERRCODE = '23503';
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_parents_check() FROM PUBLIC;
CREATE TRIGGER tasks_parents_check BEFORE INSERT ON pgtaskd.tasks
    FOR EACH ROW
    WHEN (pg_catalog.cardinality(NEW.depends_on) OPERATOR(pg_catalog.>) 0)
    EXECUTE FUNCTION pgtaskd.tasks_parents_check();

-- Before each new member of a batch (version 39): the batch must exist and not be sealed.
-- Its row is held FOR KEY SHARE until the producer's commit: a seal (FOR UPDATE) waits for
-- it, so the member is counted; the ends of other members (FOR NO KEY UPDATE) do not. The
-- callback waits for the member, so the member may wait for nothing that waits for the
-- callback (version 48): neither the callback itself, nor a task that waits for it through
-- other tasks' parents or through other batches' callbacks (a member of an open batch is
-- waited for by that batch's callback). The walk goes from the callback to what waits for
-- it, which is nothing at all unless a task depends on the callback.
CREATE FUNCTION pgtaskd.tasks_batch_check() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each row found by its key, whatever the statistics say.
SET enable_seqscan = off
AS $$
DECLARE
    batch record;
    waiting_parent bigint;
BEGIN
    SELECT b.sealed_at, b.callback INTO batch
      FROM pgtaskd.batches AS b
     WHERE b.id OPERATOR(pg_catalog.=) NEW.batch_id
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % does not exist', NEW.batch_id
            USING ERRCODE = '23503';
    END IF;
    -- The callback waits for the member: the member cannot wait for it.
    IF batch.callback OPERATOR(pg_catalog.=) ANY (NEW.depends_on) THEN
        RAISE EXCEPTION 'a member of batch % cannot depend on its callback, task %', NEW.batch_id, batch.callback
            USING ERRCODE = '23514';
    END IF;
    IF pg_catalog.cardinality(NEW.depends_on) OPERATOR(pg_catalog.>) 0 THEN
        WITH RECURSIVE after (id) AS (
            SELECT batch.callback
            UNION
            SELECT n.next
              FROM after AS a
             CROSS JOIN LATERAL (
                   SELECT d.child AS next
                     FROM pgtaskd.task_deps AS d
                    WHERE d.parent OPERATOR(pg_catalog.=) a.id
                   UNION ALL
                   SELECT b.callback
                     FROM pgtaskd.task_state AS s, pgtaskd.batches AS b
                    WHERE s.id OPERATOR(pg_catalog.=) a.id
                      AND b.id OPERATOR(pg_catalog.=) s.batch_id
                      AND b.ended_at IS NULL
                      AND s.status OPERATOR(pg_catalog.=) ANY (ARRAY['WAITING', 'QUEUED', 'RUNNING'])
                   OFFSET 0) AS n
        )
        SELECT a.id INTO waiting_parent
          FROM after AS a
         WHERE a.id OPERATOR(pg_catalog.=) ANY (NEW.depends_on)
         LIMIT 1;
        IF waiting_parent IS NOT NULL THEN
            RAISE EXCEPTION 'a member of batch % cannot depend on task %, which waits for the batch''s callback, task %', NEW.batch_id, waiting_parent, batch.callback
                USING ERRCODE = '23514';
        END IF;
    END IF;
    IF batch.sealed_at IS NOT NULL THEN
        RAISE EXCEPTION 'batch % is sealed: no task can join it', NEW.batch_id
            USING ERRCODE = '55000',
                  HINT = 'Open another batch (pgtaskd.open_batch).';
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_batch_check() FROM PUBLIC;
CREATE TRIGGER tasks_batch_check BEFORE INSERT ON pgtaskd.tasks
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL)
    EXECUTE FUNCTION pgtaskd.tasks_batch_check();

-- At the producer's commit, each new task with parents (version 37): its parents are held
-- (FOR SHARE, in id order) until that commit, so that an end of one of them either committed
-- before (and is decided here, as `pgtaskd.settle_waiting` decides it) or waits for this
-- commit and then finds the task's edges. A parent deleted meanwhile fails the commit.
CREATE FUNCTION pgtaskd.tasks_deps_settle() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each parent row by its key, whatever the statistics say (schema 45).
SET enable_seqscan = off
AS $$
DECLARE
    missing bigint;
BEGIN
    PERFORM 1 FROM pgtaskd.task_state AS p
      WHERE p.id = ANY (ARRAY(SELECT d.parent FROM pgtaskd.task_deps AS d
                               WHERE d.child = NEW.id))
      ORDER BY p.id
        FOR SHARE;
    SELECT d.parent INTO missing
      FROM pgtaskd.task_deps AS d
     WHERE d.child = NEW.id
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS p WHERE p.id = d.parent OFFSET 0)
     LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'task depends on task %, which does not exist', missing
            USING ERRCODE = '23503';
    END IF;
    PERFORM pgtaskd.end_batches(pgtaskd.settle_waiting(ARRAY[NEW.id], NULL));
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_deps_settle() FROM PUBLIC;
CREATE CONSTRAINT TRIGGER tasks_deps_settle AFTER INSERT ON pgtaskd.tasks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (pg_catalog.cardinality(NEW.depends_on) OPERATOR(pg_catalog.>) 0)
    EXECUTE FUNCTION pgtaskd.tasks_deps_settle();

-- A task deleted (retention deletes both rows itself; an operator's DELETE too) takes its
-- state with it.
CREATE FUNCTION pgtaskd.tasks_state_gone() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held record;
BEGIN
    -- A task another task still waits on stays (version 37): retention takes the dependents
    -- first.
    SELECT d.parent, d.child INTO held
      FROM pgtaskd.task_deps AS d
     WHERE d.parent OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o))
       AND NOT (d.child OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o)))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'task % cannot be deleted: task % waits for it', held.parent, held.child
            USING ERRCODE = '23503',
                  HINT = 'Cancel or delete the waiting task first.';
    END IF;
    -- A member of a batch that has not ended stays (version 39): the batch's end counts it.
    SELECT o.id, o.batch_id INTO held
      FROM gone_tasks AS o
      JOIN pgtaskd.batches AS b ON b.id OPERATOR(pg_catalog.=) o.batch_id
     WHERE b.ended_at IS NULL
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'task % cannot be deleted: it is a member of batch %, which has not ended', held.id, held.batch_id
            USING ERRCODE = '23503',
                  HINT = 'Seal the batch and let its members end (or cancel them) first.';
    END IF;
    SELECT o.id, b.id AS batch_id INTO held
      FROM gone_tasks AS o
      JOIN pgtaskd.batches AS b ON b.callback OPERATOR(pg_catalog.=) o.id
     WHERE b.ended_at IS NULL
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'task % cannot be deleted: it is the callback of batch %, which has not ended', held.id, held.batch_id
            USING ERRCODE = '23503',
                  HINT = 'Seal the batch and let its members end (or cancel them) first.';
    END IF;
    DELETE FROM pgtaskd.task_deps AS d
     WHERE d.child OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o));
    -- An ended batch goes with its callback.
    DELETE FROM pgtaskd.batches AS b
     WHERE b.callback OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.id FROM gone_tasks AS o))
       AND b.ended_at IS NOT NULL;
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
    TRUNCATE pgtaskd.task_state, pgtaskd.task_deps, pgtaskd.batches;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION pgtaskd.tasks_state_truncate() FROM PUBLIC;
CREATE TRIGGER tasks_state_truncate AFTER TRUNCATE ON pgtaskd.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.tasks_state_truncate();

-- The schema's owner may still change a task's queue, priority, attempts or key, or move a
-- QUEUED task's `run_at` (pgtaskd never does): the state's copies follow. Its id never
-- changes: that would part the task from its state; nor do its parents (version 37).
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
    IF (NEW.depends_on, NEW.on_dep_failure) IS DISTINCT FROM (OLD.depends_on, OLD.on_dep_failure) THEN
        RAISE EXCEPTION 'the parents of a task do not change (task %)', OLD.id
            USING ERRCODE = '42501';
    END IF;
    IF NEW.batch_id IS DISTINCT FROM OLD.batch_id THEN
        RAISE EXCEPTION 'the batch of a task does not change (task %)', OLD.id
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
    AFTER UPDATE OF id, queue, priority, run_at, max_attempts, concurrency_key, depends_on,
                    on_dep_failure, batch_id ON pgtaskd.tasks
    FOR EACH ROW
    WHEN ((OLD.id, OLD.queue, OLD.priority, OLD.run_at, OLD.max_attempts, OLD.concurrency_key,
           OLD.depends_on, OLD.on_dep_failure, OLD.batch_id)
          IS DISTINCT FROM
          (NEW.id, NEW.queue, NEW.priority, NEW.run_at, NEW.max_attempts, NEW.concurrency_key,
           NEW.depends_on, NEW.on_dep_failure, NEW.batch_id))
    EXECUTE FUNCTION pgtaskd.tasks_state_copy();

-- Every write of a flag takes the turn first and sets the hint after.
CREATE TRIGGER idle_daemons_take_turn
    BEFORE INSERT OR UPDATE OR DELETE ON pgtaskd.idle_daemons
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.take_idle_turn();

CREATE TRIGGER idle_daemons_set_idle_until
    AFTER INSERT OR UPDATE OR DELETE ON pgtaskd.idle_daemons
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.set_idle_until();

-- ---------------------------------------------------------------------------------------
-- Roles ("SQL interface", "Functions")
-- ---------------------------------------------------------------------------------------

-- Run as the schema's owner (the role that migrated). A producer inserts the columns a
-- producer chooses, reads, enqueues and cancels; never a status, a lease or a result.
CREATE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_state, pgtaskd.task_view TO %I',
                   role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent, concurrency_key, depends_on, on_dep_failure, tags, metadata, batch_id) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
    -- Graphs of tasks (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue_graph(jsonb) TO %I', role_name);
    -- Batches: opened, sealed and read (version 39).
    EXECUTE format('GRANT SELECT ON pgtaskd.batches TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.open_batch(text, text, text), '
                   'pgtaskd.seal_batch(bigint) TO %I', role_name);
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
CREATE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
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
                   'traceparent, concurrency_key, depends_on, on_dep_failure, tags, metadata, batch_id) '
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
    -- Dependencies: each end decides its dependents; graphs, retries with dependents and the
    -- auditor (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.end_parents(bigint[]), '
                   'pgtaskd.enqueue_graph(jsonb), pgtaskd.retry_with_dependents(bigint), '
                   'pgtaskd.check_deps() TO %I', role_name);
    -- Batches, and the handlers' progress (version 39).
    EXECUTE format('GRANT SELECT ON pgtaskd.batches TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.open_batch(text, text, text), '
                   'pgtaskd.seal_batch(bigint), '
                   'pgtaskd.write_progress(bigint[], bigint[], jsonb[]) TO %I', role_name);
END
$$;

-- An operator reads, pauses, resumes, retries and cancels; inserts and claims nothing.
CREATE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
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
    -- Retries with dependents and the dependencies' auditor (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.retry_with_dependents(bigint), '
                   'pgtaskd.check_deps() TO %I', role_name);
    -- Batches: read and sealed (version 39).
    EXECUTE format('GRANT SELECT ON pgtaskd.batches TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.seal_batch(bigint) TO %I', role_name);
END
$$;

-- ---------------------------------------------------------------------------------------
-- Privileges: EXECUTE on every function but the insert trigger's, `pgtaskd.notify` (which
-- does what `pg_notify` does) and the two the view calls (`queue_max_attempts`,
-- `lease_holder`) is revoked from PUBLIC (roles get what they need from the grant
-- functions above); the idle hint is readable by
-- every role, so that any producer's inserts can read the trigger's condition ("Idle flags").
-- ---------------------------------------------------------------------------------------

REVOKE ALL ON FUNCTION pgtaskd.notify_done(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.request_cancel(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.cancel(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[], boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.heartbeat(bigint[], bigint[], float8) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.extend_lease(bigint, bigint, float8) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.rescue(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.park(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.write_parked(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.release(bigint, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.claim_state(bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.prune(float8, bigint, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.pause_queue(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.resume_queue(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.retry(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.retry_failed(text, integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.vacuum_health() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.idle_flags_until() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.take_idle_turn() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.set_idle_until() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.grant_producer(name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.grant_daemon(name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.grant_operator(name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.remove_schedule(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.pause_schedule(text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.set_queue(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.notify_freed(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.settle_waiting(bigint[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.end_parents(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.wait_again(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.retry_with_dependents(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.check_deps() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.enqueue_graph(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.open_batch(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.decide_batch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.end_batches(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.seal_batch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.write_progress(bigint[], bigint[], jsonb[]) FROM PUBLIC;
GRANT SELECT ON pgtaskd.site TO PUBLIC;

REVOKE ALL ON SEQUENCE pgtaskd.claim_tokens FROM PUBLIC;
GRANT SELECT ON SEQUENCE pgtaskd.idle_until TO PUBLIC;

COMMIT;
