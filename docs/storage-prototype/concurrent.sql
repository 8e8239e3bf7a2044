-- One worker's cycle for concurrent.sh (docs/storage.md, "The prototype"): claim up to n tasks
-- in one transaction, finish them as SUCCEEDED in the next, as a daemon's claim loop and
-- completer do (without the analyzer between). Called by pgbench clients with CALL, outside
-- any transaction block, so that the procedure may commit.
--
-- With `positioned`, a session claims after the last task of its previous full claim, and
-- from the start at every 20th cycle and after a short claim: the claim after a position of
-- docs/design.md ("Claims after a position"), in its simplest form. The prototype's tasks all
-- have priority 0, so the position is an id.

-- The claims after a position of both layouts: the statements of today.claim and
-- proposed.claim with `id > after_id` in one priority.
CREATE OR REPLACE FUNCTION today.claim_after(max_tasks int, owner text, after_id bigint)
RETURNS TABLE (task_id bigint, task_token bigint, task_attempt int, task_payload text)
LANGUAGE sql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    UPDATE today.tasks AS t
       SET status = 'RUNNING', attempt = t.attempt + 1,
           claim_token = nextval('today.claim_tokens'),
           lease_owner = claim_after.owner, lease_expires_at = now() + interval '30 s',
           started_at = now()
     WHERE t.id = ANY (ARRAY(SELECT k.id FROM today.tasks AS k
                              WHERE k.status = 'QUEUED' AND k.queue = 'default'
                                AND k.priority = 0 AND k.id > claim_after.after_id
                                AND k.run_at <= now()
                              ORDER BY k.priority DESC, k.id
                              LIMIT claim_after.max_tasks
                                FOR UPDATE SKIP LOCKED))
       AND coalesce(t.status, '') = 'QUEUED'
    RETURNING t.id, t.claim_token, t.attempt, t.payload
$$;

CREATE OR REPLACE FUNCTION proposed.claim_after(max_tasks int, owner text, after_id bigint)
RETURNS TABLE (task_id bigint, task_token bigint, task_attempt int, task_payload text)
LANGUAGE sql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    WITH taken AS (
        DELETE FROM proposed.ready AS r
         WHERE r.ctid = ANY (ARRAY(SELECT k.ctid FROM proposed.ready AS k
                                    WHERE k.queue = 'default' AND k.priority = 0
                                      AND k.id > claim_after.after_id AND k.run_at <= now()
                                    ORDER BY k.priority DESC, k.id
                                    LIMIT claim_after.max_tasks
                                      FOR UPDATE SKIP LOCKED))
        RETURNING r.id, r.priority, r.attempt + 1 AS attempt
    ), ordered AS (
        SELECT t.id, t.attempt, row_number() OVER (ORDER BY t.priority DESC, t.id) AS k
          FROM taken AS t
    ), batch AS (
        INSERT INTO proposed.claims (claim, owner, lease_expires_at, span, ids, attempts)
        SELECT nextval('proposed.claims_seq'), claim_after.owner, now() + interval '30 s',
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

CREATE OR REPLACE PROCEDURE public.drain_cycle(layout text, n int, positioned boolean)
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    tokens bigint[];
    written bigint;
    t0 timestamptz := clock_timestamp();
    after bigint := coalesce(nullif(current_setting('proto.after', true), ''), '0')::bigint;
    cycle int := coalesce(nullif(current_setting('proto.cycle', true), ''), '0')::int + 1;
BEGIN
    IF NOT positioned OR cycle % 20 = 0 THEN
        after := 0;
    END IF;
    EXECUTE format('SELECT array_agg(c.task_id ORDER BY c.task_id), '
                   'array_agg(c.task_token ORDER BY c.task_id) '
                   'FROM %I.claim_after($1, ''pgbench'', $2) AS c '
                   'WHERE c.task_payload IS NOT NULL', layout)
        INTO ids, tokens USING n, after;
    COMMIT;
    PERFORM set_config('proto.cycle', cycle::text, false);
    PERFORM set_config('proto.after',
                       CASE WHEN coalesce(cardinality(ids), 0) < n THEN '0'
                            ELSE ids[cardinality(ids)]::text END, false);
    IF ids IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT count(*) FROM %I.finish($1, $2)', layout)
        INTO written USING ids, tokens;
    IF layout = 'proposed' THEN
        PERFORM proposed.sweep(ARRAY(SELECT DISTINCT t / 1024 FROM unnest(tokens) AS t));
    END IF;
    COMMIT;
    INSERT INTO public.drained (n, started, seconds)
    VALUES (written, t0, extract(epoch FROM clock_timestamp() - t0));
    COMMIT;
END
$$;
