-- pgtaskd schema, version 25: claim tokens that a failover cannot hand out twice.
--
-- A claim's token came from the sequence `pgtaskd.claim_tokens` alone. A standby promoted
-- after the old primary's last WAL records were lost (asynchronous replication, or a
-- standby that had fallen behind) has the sequence where that WAL left it, behind the
-- values the old primary gave out: the new primary gave the same tokens again, to claims of
-- the same task ids, while the daemons that held the lost claims still ran them. A finish
-- of such a lost claim then matched the new claim's token and wrote over it (its result
-- recorded, the new claim's run stopped as "lease lost"), and a handler that skips work by
-- `PGTASKD_CLAIM` or `Idempotency-Key` saw a token it had already seen.
--
-- The token now carries the server's timeline, the number each promotion raises (read from
-- the name of the WAL segment being written): `(timeline - 1) % 65536` in the bits above the
-- 47th, the sequence's value below. A cluster never promoted has timeline 1 and the tokens
-- it always had; after a promotion every token is above every token of the timelines before
-- it, so none given before the failover, lost or not, is given again (docs/design.md, "One
-- claim, one token"). The sequence's 47 bits last 140 trillion claims; 65,536 promotions
-- wrap the timeline's bits.
--
-- The same holds without a failover where commits are not flushed (`synchronous_commit =
-- off`, on the server, the database or the role): a crash could lose a claim the daemon had
-- been answered, and the sequence's last values with it, and the same task would be claimed
-- again under the same token. A claim's commit is now always flushed locally before its
-- answer (`off` becomes `local` for its transaction; any other setting is kept, `local`
-- included, which the daemon uses while its server waits for a synchronous standby that is
-- not connected); a claim is one commit per batch of up to 500 tasks.
--
-- Only `pgtaskd.claim` changes, its signature kept: a daemon of schema 24 may run while it
-- is applied (its claims from then on take tokens of the new form), and stops at the schema
-- check when restarted, as after every migration.

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

