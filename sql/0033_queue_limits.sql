-- pgtaskd schema, version 33: limits that hold across every daemon, and per-queue defaults
-- (docs/limits.md).
--
-- `pgtaskd.queue_settings` holds, per queue, the most tasks RUNNING at once (`max_running`),
-- the most RUNNING at once per `concurrency_key` (`max_running_per_key`; a new column of
-- `pgtaskd.tasks` producers may set), the most starts in any window of `rate_period`
-- (`rate_limit`), and the defaults of tasks that do not set their own: `max_attempts` and how
-- long finished tasks are kept (`retain`). Every daemon reads them at each claim: no restart.
--
-- The decision is made inside the claim, never counted in one transaction and claimed in
-- another: a claim that reads a limited queue first takes a transaction-scoped advisory lock
-- of that queue (`pg_try_advisory_xact_lock(1885828196, hashtext(queue))`), then, in the
-- statements after it (each with a snapshot taken after the previous holder committed), counts
-- the queue's RUNNING tasks, per key where asked, and its starts in the rate window, and
-- claims at most what is left. A claim that finds the lock held passes over the queue and
-- asks to be called again shortly; queues without settings are claimed exactly as before, and
-- never wait for a limited queue's lock. A task holds its slot while RUNNING: a rescue frees it
-- only once it took the claim back, a release (shutdown) frees it, a failover keeps it (the
-- state is in the database). The finish, the release and the rescue of a task of a queue with
-- a running limit send `NOTIFY pgtaskd_tasks`, so that the daemons waiting for a slot claim at
-- once.
--
-- `max_attempts` of `pgtaskd.tasks` loses its default: a task inserted without one follows its
-- queue's setting (read when an attempt ends), else 3; the view shows the value in force.
--
-- Daemons of schema 32 must be stopped: the claim answers a new row (when to call again).

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
    CONSTRAINT queue_settings_retain CHECK (retain >= interval '1 second')
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

-- The producer's key of a task for `max_running_per_key` (a tenant, a customer): at most 256
-- bytes; tasks without one are limited by `max_running` only.
ALTER TABLE pgtaskd.tasks ADD COLUMN concurrency_key text;
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_concurrency_key_length
        CHECK (pg_catalog.octet_length(concurrency_key) OPERATOR(pg_catalog.<=) 256) NOT VALID;
COMMENT ON COLUMN pgtaskd.tasks.concurrency_key IS
    'The key max_running_per_key of the queue counts by (a tenant, a customer); at most 256 bytes.';

ALTER TABLE pgtaskd.tasks ALTER COLUMN max_attempts DROP NOT NULL,
                          ALTER COLUMN max_attempts DROP DEFAULT;
COMMENT ON COLUMN pgtaskd.tasks.max_attempts IS
    'Attempts before the task fails; unset: the queue''s max_attempts (pgtaskd.queue_settings), else 3.';

-- The attempts a task of `queue` has when it sets none.
CREATE FUNCTION pgtaskd.queue_max_attempts(queue text) RETURNS int
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT s.max_attempts FROM pgtaskd.queue_settings AS s
                      WHERE s.queue OPERATOR(pg_catalog.=) queue_max_attempts.queue), 3)
$$;

-- The view shows the attempts in force and the key, after its columns of version 32.
CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT t.id, t.queue, t.payload, t.status, t.priority, t.run_at, t.attempt,
       coalesce(t.max_attempts, pgtaskd.queue_max_attempts(t.queue)) AS max_attempts,
       t.cancel_requested, t.words, t.bytes, t.runes, t.error, t.lease_owner,
       t.lease_expires_at, t.created_at, t.started_at, t.finished_at, t.idempotency_key,
       t.claim_token, t.output, t.traceparent,
       coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || t.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       t.runs, t.errors, t.snoozes, t.concurrency_key
  FROM pgtaskd.tasks AS t;

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

-- The claim: queues without limits exactly as in version 30; each limited queue under its
-- lock, within what its limits leave. After the tasks (and the row of a task the byte budget
-- left out), a row with no task and no size whose `waited_s` says in how many seconds a
-- limited queue passed over may have room: its lock was held (soon), or its rate window is
-- full (when its oldest start leaves it). A queue at its running limit needs no such row: the
-- end of one of its tasks notifies.
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
              FROM pgtaskd.tasks AS k
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
                SELECT k.id FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED' AND k.queue = settings.queue AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT room
                   FOR UPDATE SKIP LOCKED);
        ELSE
            -- The first tasks in claim order (a bounded read) whose key has a slot left,
            -- counting the ones taken before it; tasks without a key are not counted by key.
            -- Then locked, skipping what another transaction holds.
            limited_ids := limited_ids || ARRAY(
                SELECT k.id FROM pgtaskd.tasks AS k
                 WHERE k.id = ANY (ARRAY(
                        SELECT r.id
                          FROM (SELECT w.id, w.priority, w.concurrency_key,
                                       row_number() OVER (PARTITION BY w.concurrency_key
                                                          ORDER BY w.priority DESC, w.id) AS nth
                                  FROM (SELECT q.id, q.priority, q.concurrency_key
                                          FROM pgtaskd.tasks AS q
                                         WHERE q.status = 'QUEUED' AND q.queue = settings.queue
                                           AND q.run_at <= now()
                                         ORDER BY q.priority DESC, q.id
                                         LIMIT 1000 + claim.max_tasks) AS w) AS r
                          LEFT JOIN (SELECT b.concurrency_key, count(*) AS n
                                       FROM pgtaskd.tasks AS b
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
          FROM unnest(open_queues) AS q(name)
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
        UNION ALL
        -- The limited queues' tasks, picked and locked above.
        SELECT k.id, k.priority, octet_length(k.payload)::bigint AS size
          FROM pgtaskd.tasks AS k
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
        UPDATE pgtaskd.tasks AS t
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
        RETURNING t.id, t.attempt, t.priority, t.claim_token, t.queue,
                  CASE WHEN octet_length(t.payload) > claim.max_payload THEN NULL
                       ELSE t.payload END AS payload,
                  octet_length(t.payload)::bigint AS size,
                  extract(epoch FROM now() - greatest(t.created_at, t.run_at))::float8 AS waited,
                  t.runs,
                  coalesce((SELECT s.id FROM pgtaskd.site AS s), 'nosite') || '-' || t.id || '-'
                      || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
                  t.idempotency_key, t.traceparent
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
           CASE WHEN d.id IS NULL THEN (SELECT c.status FROM pgtaskd.tasks AS c WHERE c.id = f.id) END,
           -- Skipped: not written, not held, and still this claim's.
           d.id IS NULL
             AND NOT (f.id = ANY (ARRAY(SELECT held.id FROM held)))
             AND EXISTS (SELECT 1 FROM pgtaskd.tasks AS c
                          WHERE c.id = f.id AND c.claim_token = f.token
                            AND coalesce(c.status, '') = 'RUNNING')
      FROM input AS f
      LEFT JOIN done AS d ON d.id = f.id
     CROSS JOIN notified
     CROSS JOIN freed;
END
$$;

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

CREATE OR REPLACE FUNCTION pgtaskd.release(id bigint, token bigint, wait boolean)
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
        RETURNING t.id, t.status, t.queue
    ), freed AS (
        SELECT pgtaskd.notify_freed(array_agg(d.queue)) AS sent FROM done AS d
    ), notified AS (
        -- A release that ends the task (CANCELED) tells the waiters, in the same transaction.
        SELECT pgtaskd.notify_done(array_agg(d.id)) AS sent
          FROM done AS d WHERE d.status = 'CANCELED'
    )
    SELECT (SELECT d.status FROM done AS d),
           (SELECT k.status FROM pgtaskd.tasks AS k WHERE k.id = release.id)
      FROM notified CROSS JOIN freed;
END
$$;

-- Retention keeps a queue's finished tasks for its own `retain`, others for the daemon's
-- `retention.finished_after`.
CREATE OR REPLACE FUNCTION pgtaskd.prune(
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
               ))
           -- Found by primary key (see version 4), re-checked: still finished.
           AND coalesce(t.status, '') IN ('SUCCEEDED', 'FAILED', 'CANCELED')
        RETURNING t.finished_at
    )
    SELECT count(*), max(gone.finished_at) FROM gone;
END
$$;

-- A task enqueued without `max_attempts` follows its queue's.
CREATE OR REPLACE FUNCTION pgtaskd.enqueue(
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

REVOKE ALL ON FUNCTION pgtaskd.set_queue(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtaskd.notify_freed(text[]) FROM PUBLIC;

-- The roles granted before: producers may set the key and read the settings; daemons count,
-- write starts and set; operators set.
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
        EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %s', grantee::regrole);
        IF has_column_privilege(grantee, 'pgtaskd.tasks'::regclass, 'payload', 'INSERT') THEN
            EXECUTE format('GRANT INSERT (concurrency_key) ON pgtaskd.tasks TO %s', grantee::regrole);
        END IF;
        IF kind IN ('daemon', 'operator') THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.set_queue(text, jsonb) TO %s',
                           grantee::regrole);
        END IF;
        IF kind = 'daemon' THEN
            EXECUTE format('GRANT SELECT, INSERT, DELETE ON pgtaskd.queue_starts TO %s',
                           grantee::regrole);
            EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.notify_freed(text[]) TO %s',
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

CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update rows; retention deletes
    -- finished ones; the CLI and the HTTP API insert like a producer, and steer queues like
    -- an operator; `/metrics` and `/readyz` read the vacuum health.
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO %I', role_name);
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
    -- Limits and defaults: read and set (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.set_queue(text, jsonb) TO %I', role_name);
END
$$;
