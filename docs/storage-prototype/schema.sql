-- The storage prototype's two layouts, side by side, in a throwaway database (docs/storage.md,
-- "The prototype"). NEVER load this into a database pgtaskd serves: it creates the schemas
-- `today` and `proposed`, not `pgtaskd`.
--
-- `today`    : the task table of schema 19 (columns, constraints, indexes as sql/schema.sql
--              has them), with its claim, finish, cancel and read as plain statements shaped
--              like pgtaskd.claim, pgtaskd.finish and pgtaskd.request_cancel.
-- `rowstate` : a simpler step (docs/storage.md, "A simpler step: the state in a row of its
--              own"): the same immutable task row, and its state (today's other columns) in
--              one narrow row per task, `task_state`, updated by the claim and the finish as
--              today's table is.
-- `proposed` : the layout of docs/storage.md: an immutable task row (`tasks`, still the
--              producers' INSERT and COPY target), a narrow `ready` table filled by a statement
--              trigger, one `claims` row per claim batch, appended `outcomes`, a few
--              `cancel_requests`, and the view `task_view` with every column of today's table.
--
-- Autovacuum is off on every table of both layouts so that the dead tuples a run leaves are
-- counted before anything removes them (run.sh vacuums explicitly, and times it).
-- Parameters of the bench procedures: see bench.sql.

SET client_min_messages = warning;
DROP SCHEMA IF EXISTS today CASCADE;
DROP SCHEMA IF EXISTS proposed CASCADE;
DROP SCHEMA IF EXISTS rowstate CASCADE;
CREATE EXTENSION IF NOT EXISTS pgstattuple;

-- The insert trigger's WHEN condition of schema 14, identical in both layouts: the hint is 0
-- (no daemon idle), so the trigger function never runs; its cost is the condition's.
DROP SEQUENCE IF EXISTS public.idle_until;
CREATE UNLOGGED SEQUENCE public.idle_until AS bigint MINVALUE 0 START 0;
CREATE OR REPLACE FUNCTION public.notify_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgtaskd_tasks', '');
    RETURN NULL;
END
$$;

-- =======================================================================================
-- today: schema 19's table
-- =======================================================================================
CREATE SCHEMA today;
CREATE SEQUENCE today.claim_tokens AS bigint;

CREATE TABLE today.tasks (
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
    idempotency_key  text,
    claim_token      bigint,
    output           text,
    traceparent      text,
    CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELED')),
    CHECK (max_attempts >= 1),
    CHECK (attempt >= 0),
    CHECK (status = 'SUCCEEDED' OR (words = 0 AND bytes = 0 AND runes = 0)),
    CHECK ((status = 'RUNNING') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK (status <> 'CANCELED' OR cancel_requested),
    CHECK (octet_length(queue) >= 1 AND octet_length(queue) <= 128),
    CHECK ((status <> 'FAILED' OR error IS NOT NULL)
           AND (error IS NULL OR status = ANY (ARRAY['FAILED', 'QUEUED', 'RUNNING']))),
    CHECK (status = 'SUCCEEDED' OR output IS NULL),
    CHECK (octet_length(traceparent) <= 512)
) WITH (autovacuum_enabled = false, vacuum_truncate = false);

CREATE INDEX tasks_claim_idx ON today.tasks (queue, priority DESC, id) WHERE status = 'QUEUED';
CREATE INDEX tasks_lease_idx ON today.tasks (lease_expires_at) WHERE status = 'RUNNING';
CREATE INDEX tasks_finished_idx ON today.tasks (finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX tasks_idempotency_key_idx ON today.tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TRIGGER tasks_notify AFTER INSERT ON today.tasks FOR EACH STATEMENT
    WHEN (pg_sequence_last_value('public.idle_until'::regclass)::float8
          > date_part('epoch', now()) * 1000::float8)
    EXECUTE FUNCTION public.notify_tasks();

-- The claim's statement, as pgtaskd.claim writes it (one queue, no position, no byte budget).
CREATE FUNCTION today.claim(max_tasks int, owner text)
RETURNS TABLE (task_id bigint, task_token bigint, task_attempt int, task_payload text)
LANGUAGE sql
-- As pgtaskd.claim and pgtaskd.finish: plans that stay index scans under empty-table statistics.
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    UPDATE today.tasks AS t
       SET status = 'RUNNING', attempt = t.attempt + 1,
           claim_token = nextval('today.claim_tokens'),
           lease_owner = claim.owner, lease_expires_at = now() + interval '30 s',
           started_at = now()
     WHERE t.id = ANY (ARRAY(SELECT k.id FROM today.tasks AS k
                              WHERE k.status = 'QUEUED' AND k.queue = 'default'
                                AND k.run_at <= now()
                              ORDER BY k.priority DESC, k.id
                              LIMIT claim.max_tasks
                                FOR UPDATE SKIP LOCKED))
       AND coalesce(t.status, '') = 'QUEUED'
    RETURNING t.id, t.claim_token, t.attempt, t.payload
$$;

-- The finish's statement, as pgtaskd.finish writes it for SUCCEEDED outcomes.
CREATE FUNCTION today.finish(ids bigint[], tokens bigint[])
RETURNS TABLE (task_id bigint, written text)
LANGUAGE sql
-- As pgtaskd.claim and pgtaskd.finish: plans that stay index scans under empty-table statistics.
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    UPDATE today.tasks AS t
       SET status = CASE WHEN t.cancel_requested THEN 'CANCELED' ELSE 'SUCCEEDED' END,
           words = CASE WHEN t.cancel_requested THEN 0 ELSE 150 END,
           bytes = CASE WHEN t.cancel_requested THEN 0 ELSE octet_length(t.payload) END,
           runes = CASE WHEN t.cancel_requested THEN 0 ELSE length(t.payload) END,
           lease_owner = NULL, lease_expires_at = NULL, finished_at = now()
      FROM unnest(finish.ids, finish.tokens) AS f(id, token)
     WHERE t.id = ANY (ARRAY(SELECT k.id FROM today.tasks AS k
                              WHERE k.id = ANY (finish.ids) ORDER BY k.id
                                FOR UPDATE SKIP LOCKED))
       AND t.id = f.id
       AND coalesce(t.status, '') = 'RUNNING'
       AND t.claim_token = f.token
    RETURNING t.id, t.status
$$;

-- =======================================================================================
-- proposed: docs/storage.md, "The layout"
-- =======================================================================================
CREATE SCHEMA proposed;

-- The task as the producer wrote it; never updated. Still the INSERT, COPY and ON CONFLICT
-- target, with the same column names, defaults and identity.
CREATE TABLE proposed.tasks (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    payload          text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    max_attempts     int         NOT NULL DEFAULT 3,
    created_at       timestamptz NOT NULL DEFAULT now(),
    idempotency_key  text,
    traceparent      text,
    CHECK (max_attempts >= 1),
    CHECK (octet_length(queue) >= 1 AND octet_length(queue) <= 128),
    CHECK (octet_length(traceparent) <= 512)
) WITH (autovacuum_enabled = false);

CREATE UNIQUE INDEX tasks_idempotency_key_idx ON proposed.tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- A task that may be claimed: one narrow row, no primary key (found through its claim-order
-- key, which the task row gives: queue, priority, id; unique, so that a task is never ready
-- twice). `attempt`: claims so far; `error`: the
-- last failed attempt's, for a task put back to wait for its retry.
CREATE TABLE proposed.ready (
    queue    text        NOT NULL,
    priority smallint    NOT NULL,
    id       bigint      NOT NULL,
    run_at   timestamptz NOT NULL,
    attempt  int         NOT NULL DEFAULT 0,
    error    text
) WITH (autovacuum_enabled = false, vacuum_truncate = true);

CREATE UNIQUE INDEX ready_claim_idx ON proposed.ready (queue, priority DESC, id);

-- One row per claim statement: the claimed ids and their attempts; the k-th task's claim token
-- is claim * 1024 + k (a claim takes at most 1,000). `ended`: the k of every token that has
-- ended (finished, released, rescued): the fence. Every write that ends a token locks this
-- row and appends to `ended`, so one of them wins. The heartbeat extends the batch's lease.
-- Neither column is indexed: both updates are HOT. `span` covers the ids (its GiST index, one
-- entry per claim, finds a running task's row by id). The sweeper deletes the row once every
-- token has ended.
CREATE SEQUENCE proposed.claims_seq AS bigint;
CREATE TABLE proposed.claims (
    claim            bigint      PRIMARY KEY,
    owner            text        NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    started_at       timestamptz NOT NULL DEFAULT now(),
    span             int8range   NOT NULL,
    ids              bigint[]    NOT NULL,
    attempts         int[]       NOT NULL,
    ended            int[]       NOT NULL DEFAULT '{}'
) WITH (autovacuum_enabled = false, fillfactor = 50);

CREATE INDEX claims_span_idx ON proposed.claims USING gist (span);

-- How claims ended, appended: one row per finish statement (or release, rescue, cancel), the
-- outcomes as parallel arrays; `span` covers its ids, and its GiST index (one entry per row)
-- finds the rows that may hold a given id. Never updated; retention drops whole partitions.
CREATE TABLE proposed.outcomes (
    span        int8range   NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    ids         bigint[]    NOT NULL,
    tokens      bigint[]    NOT NULL,
    statuses    text[]      NOT NULL,
    attempts    int[]       NOT NULL,
    words       bigint[]    NOT NULL,
    bytes       bigint[]    NOT NULL,
    runes       bigint[]    NOT NULL,
    errors      text[]      NOT NULL,
    outputs     text[]      NOT NULL,
    started_at  timestamptz[] NOT NULL
) WITH (autovacuum_enabled = false);

CREATE INDEX outcomes_span_idx ON proposed.outcomes USING gist (span);

CREATE TABLE proposed.cancel_requests (
    id           bigint      PRIMARY KEY,
    requested_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_enabled = false);

-- The producer's statement, whatever its size (INSERT, INSERT ... SELECT, COPY), puts its rows
-- in `ready` with one INSERT ... SELECT over its transition table.
CREATE FUNCTION proposed.tasks_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO proposed.ready (queue, priority, id, run_at)
    SELECT n.queue, n.priority, n.id, n.run_at FROM new_tasks AS n;
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_ready AFTER INSERT ON proposed.tasks
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION proposed.tasks_ready();

CREATE TRIGGER tasks_notify AFTER INSERT ON proposed.tasks FOR EACH STATEMENT
    WHEN (pg_sequence_last_value('public.idle_until'::regclass)::float8
          > date_part('epoch', now()) * 1000::float8)
    EXECUTE FUNCTION public.notify_tasks();

-- Claim: delete the picked `ready` rows (one winner: FOR UPDATE SKIP LOCKED, then the delete
-- finds each row still there or nothing), append one `claims` row, read the payloads by key.
CREATE FUNCTION proposed.claim(max_tasks int, owner text)
RETURNS TABLE (task_id bigint, task_token bigint, task_attempt int, task_payload text)
LANGUAGE sql
-- As pgtaskd.claim and pgtaskd.finish: plans that stay index scans under empty-table statistics.
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    WITH taken AS (
        DELETE FROM proposed.ready AS r
         WHERE r.ctid = ANY (ARRAY(SELECT k.ctid FROM proposed.ready AS k
                                    WHERE k.queue = 'default' AND k.run_at <= now()
                                    ORDER BY k.priority DESC, k.id
                                    LIMIT claim.max_tasks
                                      FOR UPDATE SKIP LOCKED))
        RETURNING r.id, r.priority, r.attempt + 1 AS attempt
    ), ordered AS (
        SELECT t.id, t.attempt, row_number() OVER (ORDER BY t.priority DESC, t.id) AS k
          FROM taken AS t
    ), batch AS (
        INSERT INTO proposed.claims (claim, owner, lease_expires_at, span, ids, attempts)
        SELECT nextval('proposed.claims_seq'), claim.owner, now() + interval '30 s',
               int8range(min(o.id), max(o.id), '[]'),
               array_agg(o.id ORDER BY o.k), array_agg(o.attempt ORDER BY o.k)
          FROM ordered AS o
        HAVING count(*) > 0
        RETURNING claims.claim
    )
    SELECT o.id, b.claim * 1024 + o.k, o.attempt, t.payload
      FROM ordered AS o
     CROSS JOIN batch AS b
      JOIN proposed.tasks AS t ON t.id = o.id
     ORDER BY o.k
$$;

-- Finish: lock the claims rows of the batch's tokens (in claim order), keep the tokens not yet
-- ended, mark them ended, append one outcomes row for all of them. A token already ended (a
-- second finish, a finish after a rescue) or whose claims row is gone writes nothing. A
-- recorded cancel request makes the outcome CANCELED.
CREATE FUNCTION proposed.finish(ids bigint[], tokens bigint[])
RETURNS TABLE (task_id bigint, written text)
LANGUAGE sql
-- As pgtaskd.claim and pgtaskd.finish: plans that stay index scans under empty-table statistics.
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    WITH locked AS MATERIALIZED (
        SELECT c.claim, c.ids, c.attempts, c.ended, c.started_at
          FROM proposed.claims AS c
         WHERE c.claim = ANY (ARRAY(SELECT DISTINCT t / 1024 FROM unnest(finish.tokens) AS t))
         ORDER BY c.claim
           FOR UPDATE
    ), input AS MATERIALIZED (
        SELECT f.id, f.token, l.claim, (f.token % 1024)::int AS k,
               l.attempts[(f.token % 1024)::int] AS attempt, l.started_at,
               EXISTS (SELECT 1 FROM proposed.cancel_requests AS q WHERE q.id = f.id) AS canceled
          FROM unnest(finish.ids, finish.tokens) AS f(id, token)
          JOIN locked AS l ON l.claim = f.token / 1024
                          AND l.ids[(f.token % 1024)::int] = f.id
                          AND NOT ((f.token % 1024)::int = ANY (l.ended))
    ), closed AS (
        UPDATE proposed.claims AS c
           SET ended = c.ended || ARRAY(SELECT i.k FROM input AS i WHERE i.claim = c.claim)
         WHERE c.claim = ANY (ARRAY(SELECT DISTINCT i.claim FROM input AS i))
        RETURNING c.claim
    ), rows AS MATERIALIZED (
        SELECT i.*, CASE WHEN i.canceled THEN 'CANCELED' ELSE 'SUCCEEDED' END AS status,
               octet_length(t.payload)::bigint AS size, length(t.payload)::bigint AS chars
          FROM input AS i JOIN proposed.tasks AS t ON t.id = i.id
    ), appended AS (
        INSERT INTO proposed.outcomes (span, ids, tokens, statuses, attempts, words, bytes,
                                       runes, errors, outputs, started_at)
        SELECT int8range(min(r.id), max(r.id), '[]'),
               array_agg(r.id ORDER BY r.id), array_agg(r.token ORDER BY r.id),
               array_agg(r.status ORDER BY r.id), array_agg(r.attempt ORDER BY r.id),
               array_agg(CASE WHEN r.canceled THEN 0 ELSE 150 END ORDER BY r.id),
               array_agg(CASE WHEN r.canceled THEN 0 ELSE r.size END ORDER BY r.id),
               array_agg(CASE WHEN r.canceled THEN 0 ELSE r.chars END ORDER BY r.id),
               array_agg(NULL::text ORDER BY r.id), array_agg(NULL::text ORDER BY r.id),
               array_agg(r.started_at ORDER BY r.id)
          FROM rows AS r
        HAVING count(*) > 0
        RETURNING 1
    )
    -- `closed` and `appended` run whether read or not (data-modifying CTEs).
    SELECT r.id, r.status FROM rows AS r
$$;

-- The sweeper: drop the given claims rows once every token has ended (the completer knows the
-- claims its batch touched; a daemon would also sweep every few seconds).
CREATE FUNCTION proposed.sweep(claim_ids bigint[]) RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM proposed.claims AS c
         WHERE c.claim = ANY (sweep.claim_ids)
           AND cardinality(c.ended) = cardinality(c.ids)
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;

-- The heartbeat: one HOT update per claim batch still open.
CREATE FUNCTION proposed.heartbeat(owner text) RETURNS bigint LANGUAGE sql AS $$
    WITH beat AS (
        UPDATE proposed.claims AS c SET lease_expires_at = now() + interval '30 s'
         WHERE c.owner = heartbeat.owner
        RETURNING 1
    )
    SELECT count(*) FROM beat
$$;

-- Cancel: a QUEUED task's ready row goes (found by its claim-order key) and a CANCELED outcome
-- is appended under a token of its own (a claim number no claims row has, so later than every
-- earlier outcome of the task); a RUNNING task gets a request row.
CREATE FUNCTION proposed.cancel(task_id bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    gone proposed.ready;
BEGIN
    DELETE FROM proposed.ready AS r
     USING proposed.tasks AS t
     WHERE t.id = cancel.task_id
       AND r.queue = t.queue AND r.priority = t.priority AND r.id = t.id
    RETURNING r.* INTO gone;
    IF FOUND THEN
        INSERT INTO proposed.outcomes (span, ids, tokens, statuses, attempts, words, bytes,
                                       runes, errors, outputs, started_at)
        VALUES (int8range(task_id, task_id, '[]'), ARRAY[task_id],
                ARRAY[nextval('proposed.claims_seq') * 1024], ARRAY['CANCELED'],
                ARRAY[gone.attempt], '{0}', '{0}', '{0}', '{NULL}', '{NULL}', '{NULL}');
        RETURN 'CANCELED';
    END IF;
    INSERT INTO proposed.cancel_requests (id) VALUES (task_id) ON CONFLICT DO NOTHING;
    RETURN (SELECT v.status FROM proposed.task_view AS v WHERE v.id = task_id);
END
$$;

-- Every column of today's pgtaskd.tasks, derived: RUNNING while a live claim holds a token
-- not yet ended; QUEUED while a ready row exists; else the latest outcome's status.
CREATE VIEW proposed.task_view AS
SELECT t.id, t.queue, t.payload,
       CASE WHEN run.token IS NOT NULL THEN 'RUNNING'
            WHEN r.id IS NOT NULL THEN 'QUEUED'
            ELSE o.status END AS status,
       t.priority,
       coalesce(r.run_at, t.run_at) AS run_at,
       coalesce(run.attempt, r.attempt, o.attempt, 0) AS attempt,
       t.max_attempts,
       (q.id IS NOT NULL OR coalesce(o.status = 'CANCELED', false)) AS cancel_requested,
       CASE WHEN run.token IS NULL AND r.id IS NULL THEN coalesce(o.words, 0) ELSE 0 END AS words,
       CASE WHEN run.token IS NULL AND r.id IS NULL THEN coalesce(o.bytes, 0) ELSE 0 END AS bytes,
       CASE WHEN run.token IS NULL AND r.id IS NULL THEN coalesce(o.runes, 0) ELSE 0 END AS runes,
       CASE WHEN run.token IS NOT NULL OR r.id IS NOT NULL THEN r.error ELSE o.error END AS error,
       run.owner AS lease_owner,
       run.lease_expires_at,
       t.created_at,
       coalesce(run.started_at, CASE WHEN r.id IS NULL THEN o.started_at END) AS started_at,
       CASE WHEN run.token IS NULL AND r.id IS NULL THEN o.finished_at END AS finished_at,
       t.idempotency_key,
       coalesce(run.token, o.token) AS claim_token,
       CASE WHEN run.token IS NULL AND r.id IS NULL THEN o.output END AS output,
       t.traceparent
  FROM proposed.tasks AS t
  LEFT JOIN LATERAL (
        SELECT u.token, u.status, u.attempt, u.words, u.bytes, u.runes, u.error, u.output,
               u.started_at, x.finished_at
          FROM proposed.outcomes AS x,
               unnest(x.ids, x.tokens, x.statuses, x.attempts, x.words, x.bytes, x.runes,
                      x.errors, x.outputs, x.started_at)
                   AS u(id, token, status, attempt, words, bytes, runes, error, output, started_at)
         WHERE x.span @> t.id AND u.id = t.id
         ORDER BY u.token DESC LIMIT 1) AS o ON true
  LEFT JOIN LATERAL (
        SELECT y.* FROM proposed.ready AS y
         WHERE y.queue = t.queue AND y.priority = t.priority AND y.id = t.id LIMIT 1) AS r ON true
  LEFT JOIN LATERAL (
        SELECT c.owner, c.lease_expires_at, c.started_at, c.claim * 1024 + u.k AS token,
               c.attempts[u.k] AS attempt
          FROM proposed.claims AS c, unnest(c.ids) WITH ORDINALITY AS u(id, k)
         WHERE c.span @> t.id AND u.id = t.id AND NOT (u.k::int = ANY (c.ended))
         LIMIT 1) AS run ON true
  LEFT JOIN proposed.cancel_requests AS q ON q.id = t.id;

-- =======================================================================================
-- rowstate: docs/storage.md, "A simpler step: the state in a row of its own"
-- =======================================================================================
CREATE SCHEMA rowstate;
CREATE SEQUENCE rowstate.claim_tokens AS bigint;

-- The task as the producer wrote it; never updated (as proposed.tasks).
CREATE TABLE rowstate.tasks (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    payload          text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    max_attempts     int         NOT NULL DEFAULT 3,
    created_at       timestamptz NOT NULL DEFAULT now(),
    idempotency_key  text,
    traceparent      text,
    CHECK (max_attempts >= 1),
    CHECK (octet_length(queue) >= 1 AND octet_length(queue) <= 128),
    CHECK (octet_length(traceparent) <= 512)
) WITH (autovacuum_enabled = false);

CREATE UNIQUE INDEX tasks_idempotency_key_idx ON rowstate.tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Its state: today's columns but the payload and the producer's, one row per task, updated
-- in place by every move as today's row is (about 110 bytes against 1,150). The partial
-- indexes are today's, on this table.
CREATE TABLE rowstate.task_state (
    id               bigint      PRIMARY KEY,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL,
    status           text        NOT NULL DEFAULT 'QUEUED',
    run_at           timestamptz NOT NULL,
    attempt          int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL,
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
    output           text
) WITH (autovacuum_enabled = false);

CREATE INDEX task_state_claim_idx ON rowstate.task_state (queue, priority DESC, id)
    WHERE status = 'QUEUED';
CREATE INDEX task_state_lease_idx ON rowstate.task_state (lease_expires_at)
    WHERE status = 'RUNNING';
CREATE INDEX task_state_finished_idx ON rowstate.task_state (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE FUNCTION rowstate.tasks_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rowstate.task_state (id, queue, priority, run_at, max_attempts)
    SELECT n.id, n.queue, n.priority, n.run_at, n.max_attempts FROM new_tasks AS n;
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_state AFTER INSERT ON rowstate.tasks
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION rowstate.tasks_state();

CREATE TRIGGER tasks_notify AFTER INSERT ON rowstate.tasks FOR EACH STATEMENT
    WHEN (pg_sequence_last_value('public.idle_until'::regclass)::float8
          > date_part('epoch', now()) * 1000::float8)
    EXECUTE FUNCTION public.notify_tasks();

-- The claim: today's statement on the state rows; the payloads read by primary key.
CREATE FUNCTION rowstate.claim(max_tasks int, owner text)
RETURNS TABLE (task_id bigint, task_token bigint, task_attempt int, task_payload text)
LANGUAGE sql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    WITH claimed AS (
        UPDATE rowstate.task_state AS s
           SET status = 'RUNNING', attempt = s.attempt + 1,
               claim_token = nextval('rowstate.claim_tokens'),
               lease_owner = claim.owner, lease_expires_at = now() + interval '30 s',
               started_at = now()
         WHERE s.id = ANY (ARRAY(SELECT k.id FROM rowstate.task_state AS k
                                  WHERE k.status = 'QUEUED' AND k.queue = 'default'
                                    AND k.run_at <= now()
                                  ORDER BY k.priority DESC, k.id
                                  LIMIT claim.max_tasks
                                    FOR UPDATE SKIP LOCKED))
           AND coalesce(s.status, '') = 'QUEUED'
        RETURNING s.id, s.claim_token, s.attempt
    )
    SELECT c.id, c.claim_token, c.attempt, t.payload
      FROM claimed AS c JOIN rowstate.tasks AS t ON t.id = c.id
$$;

-- The finish: today's statement on the state rows; the counts need the payload's length.
CREATE FUNCTION rowstate.finish(ids bigint[], tokens bigint[])
RETURNS TABLE (task_id bigint, written text)
LANGUAGE sql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    UPDATE rowstate.task_state AS s
       SET status = CASE WHEN s.cancel_requested THEN 'CANCELED' ELSE 'SUCCEEDED' END,
           words = CASE WHEN s.cancel_requested THEN 0 ELSE 150 END,
           bytes = CASE WHEN s.cancel_requested THEN 0 ELSE octet_length(t.payload) END,
           runes = CASE WHEN s.cancel_requested THEN 0 ELSE length(t.payload) END,
           lease_owner = NULL, lease_expires_at = NULL, finished_at = now()
      FROM unnest(finish.ids, finish.tokens) AS f(id, token), rowstate.tasks AS t
     WHERE s.id = ANY (ARRAY(SELECT k.id FROM rowstate.task_state AS k
                              WHERE k.id = ANY (finish.ids) ORDER BY k.id
                                FOR UPDATE SKIP LOCKED))
       AND s.id = f.id AND t.id = f.id
       AND coalesce(s.status, '') = 'RUNNING'
       AND s.claim_token = f.token
    RETURNING s.id, s.status
$$;
