-- pgtaskd schema, version 48: a member of a batch may not wait for anything that waits for
-- the batch's callback (docs/dependencies.md, "Batches"; docs/upgrading.md, "Schema 48").
--
-- Version 39 refused a member that depends on its batch's callback itself, but not one that
-- depends on a task that depends on the callback, nor a member of one batch depending on
-- another batch's callback while a member of that batch depends on the first's: each such
-- loop left every task in it WAITING for ever, and `pgtaskd.check_deps()` reported nothing.
-- The member's insert now walks from the callback to what waits for it (other tasks'
-- parents, and the callbacks of the open batches whose members are reached) and refuses a
-- parent found there.
--
-- Locks: only the function's replacement.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

CREATE OR REPLACE FUNCTION pgtaskd.tasks_batch_check() RETURNS trigger
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
