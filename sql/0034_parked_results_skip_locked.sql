-- pgtaskd schema, version 34: parked results that cannot be written do not hold up the rest.
--
-- Version 28's `write_parked` picked the oldest parked results of expired leases, then let
-- `pgtaskd.finish` skip the rows someone else held locked. A producer's transaction holding
-- the rows of the oldest `max_tasks` parked results kept every later one from being written
-- at all, each rescue picking the same held rows again; and a result `finish` declined (a
-- parked CANCELED result whose cancel request is gone, say) stayed parked for ever, its claim
-- passed over by every rescue. Now the pick locks the rows it takes and skips those held
-- (`FOR UPDATE SKIP LOCKED` before the limit), and a parked result `finish` declines on a row
-- the pick holds is dropped, so that the claim is rescued like any other expired lease.
--
-- Daemons of schema 33 need not be stopped: the function keeps its signature and its rows.

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
              JOIN pgtaskd.tasks AS k ON k.id = p.task_id AND k.claim_token = p.claim_token
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
     WHERE NOT EXISTS (SELECT 1 FROM pgtaskd.tasks AS k
                        WHERE k.id = p.task_id AND k.claim_token = p.claim_token
                          AND coalesce(k.status, '') = 'RUNNING')
        OR (p.task_id, p.claim_token) IN (SELECT u.id, u.token
                                            FROM unnest(due_ids, due_tokens) AS u(id, token));
END
$$;
