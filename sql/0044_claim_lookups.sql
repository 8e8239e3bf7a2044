-- pgtaskd schema, version 44: the claim looks up task rows by their key whatever the
-- statistics say (docs/design.md, "Functions").
--
-- Since schema 36 the claim joins each candidate state row to its task row for the payload's
-- size. With statistics taken while the tables were empty (an autovacuum of a drained queue,
-- a VACUUM ANALYZE by hand), the planner costs both tables at one row and may join them by
-- walking the task table's primary key from its start for each candidate, filtering on the
-- id: a claim then reads every task row older than its candidates, so each claim of a
-- backlog of 20,000 took 420 ms and read 366,000 buffers, and a daemon drained 340 tasks a
-- second until the next ANALYZE. The claim now reads the task row through a lookup the
-- planner cannot turn into a walk (a LATERAL subquery with OFFSET 0, a correlated EXISTS),
-- before the pick and after the update, which no longer joins the task table; a claimed
-- task's parents are looked up the same way (a merge join over the whole state table could
-- be chosen before).
--
-- Locks: none but the function's replacement.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

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
