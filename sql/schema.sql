-- pgtaskd's schema as the last migration (sql/0029_quiet_sessions.sql) leaves it: every table,
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
-- - columns are in the order the migrations added them (`idempotency_key`, schema 5,
--   `claim_token`, schema 16, `output` and `traceparent`, schema 19, come last);
-- - `tasks_queue_name` is NOT VALID, as schema 18 added it, and so are the three
--   constraints schema 19 added (see "Migrations and the schema version");
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

-- The queue and the only record of a task ("Data flow"; columns: "Table `pgtaskd.tasks`";
-- its states and who moves them: "States"). The CHECK constraints make a row whose status,
-- counts, error and lease disagree impossible, whoever writes it ("Results with status",
-- "Cancel is a request"). The storage parameters make autovacuum keep up with the queue's
-- churn ("Vacuum"); an operator may change them, and no migration sets them again.
CREATE TABLE pgtaskd.tasks (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    payload          text        NOT NULL,
    status           text        NOT NULL DEFAULT 'QUEUED',
    priority         smallint    NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempt          int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL DEFAULT 3,
    cancel_requested boolean     NOT NULL DEFAULT false,
    words            bigint      NOT NULL DEFAULT 0,
    bytes            bigint      NOT NULL DEFAULT 0,
    runes            bigint      NOT NULL DEFAULT 0,
    error            text,
    lease_owner      text,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    -- Unique per queue where set ("Idempotent enqueue").
    idempotency_key  text,
    -- The fencing token of the claim that holds or last held the row ("One claim, one token").
    claim_token      bigint,
    -- A handler's answer, on SUCCEEDED rows only ("Handlers", schema 19).
    output           text,
    -- The producer's W3C trace context, handed to the handler (schema 19).
    traceparent      text,

    CONSTRAINT tasks_status_check
        CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELED')),
    CONSTRAINT tasks_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT tasks_attempt_check CHECK (attempt >= 0),
    -- Results only on SUCCEEDED rows ("Results with status"); the error rule is below.
    CONSTRAINT tasks_results_only_when_succeeded
        CHECK (status = 'SUCCEEDED' OR (words = 0 AND bytes = 0 AND runes = 0)),
    -- A lease exists exactly while the task runs.
    CONSTRAINT tasks_lease_only_when_running
        CHECK ((status = 'RUNNING') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    -- A CANCELED row comes from a recorded cancel request ("Cancel is a request").
    CONSTRAINT tasks_canceled_only_when_requested
        CHECK (status <> 'CANCELED' OR cancel_requested)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false,
    -- Room on each page for the claim's and the finish's versions, so that each is logged
    -- as the bytes it changed rather than the whole row again (schema 27).
    fillfactor = 50
);

-- A queue name is 1 to 128 bytes: a pause NOTIFYs it, and the idempotency index holds it
-- ("Table `pgtaskd.tasks`"). NOT VALID as schema 18 added it (every row written since is
-- checked; `ALTER TABLE pgtaskd.tasks VALIDATE CONSTRAINT tasks_queue_name` marks it valid
-- without stopping writers).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_queue_name
        CHECK (pg_catalog.octet_length(queue) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(queue) OPERATOR(pg_catalog.<=) 128) NOT VALID;

-- An error on every FAILED row, none on SUCCEEDED or CANCELED rows, the last failed
-- attempt's (or none) on QUEUED and RUNNING rows; an output on SUCCEEDED rows only; a trace
-- context of at most 512 bytes. NOT VALID as schema 19 added them (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_error_when_failed
        CHECK ((status OPERATOR(pg_catalog.<>) 'FAILED' OR error IS NOT NULL)
               AND (error IS NULL OR status OPERATOR(pg_catalog.=) ANY (ARRAY['FAILED', 'QUEUED', 'RUNNING'])))
        NOT VALID,
    ADD CONSTRAINT tasks_output_only_when_succeeded
        CHECK (status OPERATOR(pg_catalog.=) 'SUCCEEDED' OR output IS NULL) NOT VALID,
    ADD CONSTRAINT tasks_traceparent_length
        CHECK (pg_catalog.octet_length(traceparent) OPERATOR(pg_catalog.<=) 512) NOT VALID;

COMMENT ON TABLE pgtaskd.tasks IS
    'pgtaskd task queue: INSERT (payload) to enqueue; pgtaskd.cancel(id) to cancel';
COMMENT ON COLUMN pgtaskd.tasks.claim_token IS
    'The token of the claim that holds or last held the task: unique per claim; every write after a claim is fenced on it.';

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

-- Where a task's state and results are read (version 24): today every column of
-- `pgtaskd.tasks`; when the table keeps only what the producer wrote (docs/storage.md), the
-- same columns gathered from the tables that hold the state ("Table `pgtaskd.tasks`").
-- With the reader's rights (PostgreSQL 15 and later; the migration sets it where it can): a
-- row-level security policy or a column grant on the table holds through the view.
CREATE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT t.id, t.queue, t.payload, t.status, t.priority, t.run_at, t.attempt, t.max_attempts,
       t.cancel_requested, t.words, t.bytes, t.runes, t.error, t.lease_owner,
       t.lease_expires_at, t.created_at, t.started_at, t.finished_at, t.idempotency_key,
       t.claim_token, t.output, t.traceparent
  FROM pgtaskd.tasks AS t;

COMMENT ON VIEW pgtaskd.task_view IS
    'pgtaskd: every task with its state and results: SELECT status, words, bytes, runes, output, error FROM pgtaskd.task_view WHERE id = $1';

-- ---------------------------------------------------------------------------------------
-- Indexes (the primary keys aside)
-- ---------------------------------------------------------------------------------------

-- Claims read only QUEUED rows, in (priority DESC, id) order per queue, so finished rows
-- cost them nothing ("One winner", "Claims after a position").
CREATE INDEX tasks_claim_idx ON pgtaskd.tasks (queue, priority DESC, id)
    WHERE status = 'QUEUED';

-- The rescuer looks for RUNNING rows whose lease expired ("Data flow").
CREATE INDEX tasks_lease_idx ON pgtaskd.tasks (lease_expires_at)
    WHERE status = 'RUNNING';

-- Retention prunes finished rows by age ("Vacuum"); stats and the dashboard read the recent
-- ones ("Table `pgtaskd.tasks`").
CREATE INDEX tasks_finished_idx ON pgtaskd.tasks (finished_at)
    WHERE finished_at IS NOT NULL;

-- The list of tasks (`GET /tasks`, `pgtaskd list`), newest first, filtered by a queue and a
-- status, or by a status few rows have, reads these instead of walking past every other row
-- of the primary key (schema 19). Finished rows only: no claim, finish or cancel can be
-- planned on them.
CREATE INDEX tasks_list_queue_idx ON pgtaskd.tasks (queue, status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

CREATE INDEX tasks_list_status_idx ON pgtaskd.tasks (status, id)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED');

-- Queue and status together, so that a status absent from one queue is not estimated as if
-- spread evenly (schema 19).
CREATE STATISTICS pgtaskd.tasks_queue_status (mcv) ON queue, status FROM pgtaskd.tasks;

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
    max_attempts    int         DEFAULT 3,
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
    -- `coalesce(status, '')`: found by primary key, never by a scan of a partial index.
    UPDATE pgtaskd.tasks
       SET status = 'CANCELED', cancel_requested = true, finished_at = now(), error = NULL
     WHERE id = task_id AND coalesce(status, '') = 'QUEUED'
    RETURNING 'QUEUED', status INTO previous, current;
    IF FOUND THEN
        PERFORM pgtaskd.notify_done(ARRAY[task_id]);
        RETURN;
    END IF;

    UPDATE pgtaskd.tasks SET cancel_requested = true
     WHERE id = task_id AND coalesce(status, '') = 'RUNNING'
    RETURNING 'RUNNING', status INTO previous, current;
    IF FOUND THEN
        PERFORM pgtaskd.notify('pgtaskd_cancel', task_id::text);
        RETURN;
    END IF;

    SELECT status, status INTO previous, current FROM pgtaskd.tasks WHERE id = task_id;
END
$$;

-- The same, returning the status after the request only (null: no such task).
CREATE FUNCTION pgtaskd.cancel(task_id bigint) RETURNS text
LANGUAGE sql AS $$
    SELECT current FROM pgtaskd.request_cancel(task_id)
$$;

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
                 waited_s float8, task_priority int, task_claim bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- Flushed before the daemon runs the work (version 25): with `synchronous_commit = off` a
    -- crash could lose a claim already answered, and the sequence's last values with it, and
    -- the same task would be claimed again under the same token. `local`, not `on`: a daemon
    -- whose server waits for a synchronous standby that is not there commits with `local`,
    -- and so must its claims.
    IF pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    END IF;
    RETURN QUERY
    WITH candidates AS MATERIALIZED (
        -- No position (either half null) is before every task: all of it is "the lower
        -- priorities" below (a smallint priority is always under 32768), read from the
        -- start of the queue.
        SELECT c.id, c.priority, c.size
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                -- After the position: the rest of its priority...
                SELECT k.id, k.priority, octet_length(k.payload)::bigint AS size
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority = claim.after_priority
                   AND k.id > claim.after_id
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
        UNION ALL
        SELECT c.id, c.priority, c.size
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                -- ...then the lower priorities.
                SELECT k.id, k.priority, octet_length(k.payload)::bigint AS size
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.priority < CASE WHEN claim.after_id IS NULL THEN 32768
                                         ELSE coalesce(claim.after_priority, 32768) END
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.paused_queues AS p WHERE p.queue = q.name)
         ORDER BY 2 DESC, 1
         LIMIT claim.max_tasks
    ), sized AS MATERIALIZED (
        -- A payload that will not be loaded weighs nothing in the budget.
        SELECT s.id, s.size,
               row_number() OVER w AS n,
               sum(CASE WHEN s.size > claim.max_payload THEN 0 ELSE s.size END) OVER w AS running
          FROM candidates AS s
        WINDOW w AS (ORDER BY s.priority DESC, s.id)
    ), picked AS MATERIALIZED (
        SELECT z.id FROM sized AS z
         WHERE z.running <= claim.max_bytes OR (claim.take_one AND z.n = 1)
    ), claimed AS (
        UPDATE pgtaskd.tasks AS t
           SET status = 'RUNNING',
               attempt = t.attempt + 1,
               -- The server's timeline above the sequence's value (version 25): a new
               -- primary's sequence may be behind the old one's after a failover.
               claim_token = (SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN 0::bigint
                                          ELSE ((('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(
                                                    pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                                                 - 1) % 65536) << 47 END)
                             | (pg_catalog.nextval('pgtaskd.claim_tokens') & 140737488355327),
               lease_owner = claim.owner,
               lease_expires_at = now() + claim.lease_ms * interval '1 millisecond',
               started_at = now()
         WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
           -- Found by primary key, never through a partial index (see version 4).
           AND coalesce(t.status, '') = 'QUEUED'
        RETURNING t.id, t.attempt, t.priority, t.claim_token,
                  CASE WHEN octet_length(t.payload) > claim.max_payload THEN NULL
                       ELSE t.payload END AS payload,
                  octet_length(t.payload)::bigint AS size,
                  extract(epoch FROM now() - greatest(t.created_at, t.run_at))::float8 AS waited
    )
    (SELECT claimed.id, claimed.attempt, claimed.payload, claimed.size, claimed.waited,
            claimed.priority::int, claimed.claim_token
       FROM claimed
      ORDER BY claimed.priority DESC, claimed.id)
    UNION ALL
    (SELECT NULL::bigint, NULL::int, NULL::text, z.size, NULL::float8, NULL::int, NULL::bigint
       FROM sized AS z
      WHERE z.id NOT IN (SELECT picked.id FROM picked)
      ORDER BY z.n
      LIMIT 1);
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
            SELECT k.id FROM pgtaskd.tasks AS k
             WHERE NOT finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE SKIP LOCKED) AS h
        UNION ALL
        -- ...or, asked to wait, every one of them.
        SELECT w.id FROM (
            SELECT k.id FROM pgtaskd.tasks AS k
             WHERE finish.wait AND k.id = ANY (finish.ids)
             ORDER BY k.id
               FOR UPDATE) AS w
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           -- Tried again: a failed attempt with a delay, attempts left, no cancel.
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED'
                             WHEN f.status = 'FAILED' AND f.retry_in IS NOT NULL
                                  AND t.attempt < t.max_attempts THEN 'QUEUED'
                             ELSE f.status END,
               words = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.words END,
               bytes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.bytes END,
               runes = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN 0 ELSE f.runes END,
               output = CASE WHEN t.cancel_requested OR f.status <> 'SUCCEEDED' THEN NULL ELSE f.output END,
               error = CASE WHEN t.cancel_requested OR f.status <> 'FAILED' THEN NULL ELSE f.error END,
               run_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                  AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
                             THEN now() + f.retry_in * interval '1 second' ELSE t.run_at END,
               lease_owner = NULL,
               lease_expires_at = NULL,
               finished_at = CASE WHEN NOT t.cancel_requested AND f.status = 'FAILED'
                                       AND f.retry_in IS NOT NULL AND t.attempt < t.max_attempts
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
        RETURNING t.id, t.status
    ), notified AS (
        -- One row whatever `done` holds (an aggregate); volatile, so evaluated once, after
        -- every row of `done` was written. A task QUEUED again has not ended.
        SELECT pgtaskd.notify_done(array_agg(done.id)) AS sent FROM done
         WHERE done.status <> 'QUEUED'
    )
    SELECT f.id, d.status,
           -- What a finish that wrote nothing found, as the row stands (not locked).
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.tasks AS c WHERE c.id = f.id) END,
           -- Skipped: not written, not held, and still this claim's.
           d.id IS NULL
             AND NOT (f.id = ANY (ARRAY(SELECT held.id FROM held)))
             AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS c
                          WHERE c.id = f.id AND c.claim_token = f.token
                            AND coalesce(c.status, '') = 'RUNNING')
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id
     CROSS JOIN notified;
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
          FROM pgtaskd.tasks AS k
         WHERE k.id = ANY (heartbeat.ids) AND k.claim_token = ANY (heartbeat.tokens)
           AND coalesce(k.status, '') = 'RUNNING'
         ORDER BY k.id
           FOR UPDATE SKIP LOCKED
    ), extended AS (
        UPDATE pgtaskd.tasks AS t
           SET lease_expires_at = now() + heartbeat.lease_ms * interval '1 millisecond'
          FROM held
         WHERE t.id = held.id
        RETURNING t.id, t.cancel_requested
    )
    SELECT e.id, true, e.cancel_requested FROM extended AS e
    UNION ALL
    SELECT k.id, false, k.cancel_requested
      FROM pgtaskd.tasks AS k
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
    UPDATE pgtaskd.tasks AS t
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
CREATE FUNCTION pgtaskd.rescue(max_tasks bigint, owner text)
RETURNS TABLE (task_id bigint, task_attempt int, task_previous_owner text, task_status text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT k.id, k.attempt, k.claim_token, k.lease_owner
          FROM pgtaskd.tasks AS k
         WHERE k.status = 'RUNNING' AND k.lease_expires_at < now()
           AND k.lease_owner IS DISTINCT FROM rescue.owner
           -- A result is parked for this claim (version 28).
           AND NOT EXISTS (SELECT 1 FROM pgtaskd.parked_results AS p
                            WHERE p.task_id = k.id AND p.claim_token = k.claim_token)
         ORDER BY k.lease_expires_at
         LIMIT rescue.max_tasks
           FOR UPDATE SKIP LOCKED
    ), rescued AS (
        UPDATE pgtaskd.tasks AS t
           SET status = CASE
                   WHEN t.cancel_requested THEN 'CANCELED'
                   WHEN t.attempt < t.max_attempts THEN 'QUEUED'
                   ELSE 'FAILED'
               END,
               error = CASE
                   WHEN NOT t.cancel_requested AND t.attempt >= t.max_attempts
                   THEN format('lease lost after %s attempts (last held by %s)',
                               t.attempt, t.lease_owner)
               END,
               -- The n-th lost lease waits (n-1)^2 seconds, at most ten minutes.
               run_at = CASE
                   WHEN NOT t.cancel_requested AND t.attempt < t.max_attempts
                   THEN now() + least(power(t.attempt - 1, 2), 600) * interval '1 second'
                   ELSE t.run_at
               END,
               finished_at = CASE
                   WHEN t.cancel_requested OR t.attempt >= t.max_attempts THEN now()
               END,
               lease_owner = NULL,
               lease_expires_at = NULL
          FROM expired
         WHERE t.id = expired.id
           AND t.status = 'RUNNING'
           AND t.claim_token IS NOT DISTINCT FROM expired.claim_token
           AND t.lease_expires_at < now()
        RETURNING t.id, expired.attempt, expired.lease_owner, t.status
    ), notified AS (
        SELECT pgtaskd.notify_done(array_agg(r.id)) AS sent
          FROM rescued AS r WHERE r.status <> 'QUEUED'
    )
    SELECT r.id, r.attempt, r.lease_owner, r.status
      FROM rescued AS r CROSS JOIN notified;
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
     WHERE EXISTS (SELECT 1 FROM pgtaskd.tasks AS k
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
-- instance `owner`), through `pgtaskd.finish`: fenced on the parked token, rows someone else
-- holds skipped (written by a later call). Then drop every parked result whose claim is
-- over. One row per result written: the task and the status written.
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
              JOIN pgtaskd.tasks AS k ON k.id = p.task_id AND k.claim_token = p.claim_token
             WHERE coalesce(k.status, '') = 'RUNNING' AND k.lease_expires_at < now()
               AND k.lease_owner IS DISTINCT FROM write_parked.owner
             ORDER BY p.parked_at
             LIMIT write_parked.max_tasks) AS d;
    IF due_ids IS NOT NULL THEN
        RETURN QUERY
        SELECT f.task_id, f.written
          FROM pgtaskd.finish(due_tokens, due_ids, due_statuses, due_words, due_bytes,
                              due_runes, due_errors, due_outputs, due_retry_in, false) AS f
         WHERE f.written IS NOT NULL;
    END IF;
    DELETE FROM pgtaskd.parked_results AS p
     WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.tasks AS k
                        WHERE k.id = p.task_id AND k.claim_token = p.claim_token
                          AND coalesce(k.status, '') = 'RUNNING');
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
BEGIN
    RETURN QUERY
    WITH unlocked AS MATERIALIZED (
        SELECT k.id FROM pgtaskd.tasks AS k
         WHERE NOT release.wait AND k.id = release.id
           FOR UPDATE NOWAIT
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           SET status = CASE WHEN t.cancel_requested THEN 'CANCELED' ELSE 'QUEUED' END,
               attempt = CASE WHEN t.cancel_requested THEN t.attempt ELSE t.attempt - 1 END,
               started_at = CASE WHEN t.cancel_requested THEN t.started_at END,
               finished_at = CASE WHEN t.cancel_requested THEN now() END,
               lease_owner = NULL,
               lease_expires_at = NULL
         WHERE t.id = release.id AND coalesce(t.status, '') = 'RUNNING'
           AND t.claim_token = release.token
           AND (release.wait OR t.id IN (SELECT u.id FROM unlocked AS u))
        RETURNING t.id, t.status
    ), notified AS (
        -- A release that ends the task (CANCELED) tells the waiters, in the same transaction.
        SELECT pgtaskd.notify_done(array_agg(d.id)) AS sent
          FROM done AS d WHERE d.status = 'CANCELED'
    )
    SELECT (SELECT d.status FROM done AS d),
           (SELECT k.status FROM pgtaskd.tasks AS k WHERE k.id = release.id)
      FROM notified;
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
        SELECT k.status, k.attempt, k.claim_token FROM pgtaskd.tasks AS k
         WHERE k.id = claim_state.id
           FOR SHARE;
    ELSE
        RETURN QUERY
        SELECT k.status, k.attempt, k.claim_token FROM pgtaskd.tasks AS k
         WHERE k.id = claim_state.id
           FOR SHARE NOWAIT;
    END IF;
END
$$;

-- Retention's batch: delete up to `max_rows` finished rows older than the window, oldest
-- first, from where the previous batch ended ("Vacuum").
CREATE FUNCTION pgtaskd.prune(
    older_than_ms float8,
    max_rows      bigint,
    from_finished timestamptz
) RETURNS TABLE (deleted bigint, last_finished timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgtaskd.tasks AS t
         WHERE t.id = ANY (ARRAY(
                SELECT k.id
                  FROM pgtaskd.tasks AS k
                 WHERE k.finished_at < now() - prune.older_than_ms * interval '1 millisecond'
                   AND k.finished_at >= coalesce(prune.from_finished, '-infinity')
                   AND k.status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
                 ORDER BY k.finished_at
                 LIMIT prune.max_rows
                   FOR UPDATE SKIP LOCKED
               ))
           -- Found by primary key (see version 4), re-checked: still finished.
           AND coalesce(t.status, '') IN ('SUCCEEDED', 'FAILED', 'CANCELED')
        RETURNING t.finished_at
    )
    SELECT count(*), max(gone.finished_at) FROM gone;
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

-- A FAILED or CANCELED task back to QUEUED, as if new ("States").
CREATE FUNCTION pgtaskd.retry(task_id bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    previous text;
BEGIN
    SELECT t.status INTO previous FROM pgtaskd.tasks AS t WHERE t.id = retry.task_id FOR UPDATE;
    IF previous IS NULL OR previous NOT IN ('FAILED', 'CANCELED') THEN
        RETURN previous;
    END IF;
    UPDATE pgtaskd.tasks AS t
       SET status = 'QUEUED',
           attempt = 0,
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
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'pgtaskd.retry_failed: max_rows must be at least 1, not %', max_rows
            USING ERRCODE = '22023';
    END IF;
    WITH batch AS (
        SELECT t.id
          FROM pgtaskd.tasks AS t
         WHERE t.queue = retry_failed.queue
           AND t.status = 'FAILED'
           AND t.id > coalesce(retry_failed.after_id, 0)
         ORDER BY t.id
         LIMIT retry_failed.max_rows
           FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE pgtaskd.tasks AS t
           SET status = 'QUEUED',
               attempt = 0,
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

-- One row: the table's bloat and the oldest xmin horizon holding back its vacuum, with its
-- owner's rights and never a query's text ("Vacuum health").
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
    SELECT c.oid, c.reltoastrelid FROM pg_class AS c WHERE c.oid = 'pgtaskd.tasks'::regclass
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
    'pgtaskd: bloat of pgtaskd.tasks and the oldest xmin horizon holding back its vacuum; no query text';

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
END
$$;

-- What `pgtaskd run` and the one-shot commands need; no DDL, no vacuum.
CREATE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
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
END
$$;

-- An operator reads, pauses, resumes, retries and cancels; inserts and claims nothing.
CREATE FUNCTION pgtaskd.grant_operator(role_name name) RETURNS void
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
END
$$;

-- ---------------------------------------------------------------------------------------
-- Privileges: EXECUTE on every function but the insert trigger's and `pgtaskd.notify` (which
-- does what `pg_notify` does) is revoked from PUBLIC (roles get what they need from the grant
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

REVOKE ALL ON SEQUENCE pgtaskd.claim_tokens FROM PUBLIC;
GRANT SELECT ON SEQUENCE pgtaskd.idle_until TO PUBLIC;

COMMIT;
