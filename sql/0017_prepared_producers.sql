-- pgtaskd schema, version 17: a producer that prepares its transaction (two-phase commit) can
-- enqueue.
--
-- PostgreSQL refuses `PREPARE TRANSACTION` in a transaction that has executed NOTIFY, and the
-- insert trigger notifies while some daemon is flagged idle (schemas 7 and 14): a producer's
-- `BEGIN; INSERT INTO pgtaskd.tasks ...; PREPARE TRANSACTION 'x'` failed whenever a daemon was
-- idle and succeeded when all were busy. The trigger cannot know at the INSERT that the
-- transaction will be prepared, so the producer says so: after
--
--     SET LOCAL pgtaskd.notify = off
--
-- in that transaction, the trigger's function never notifies, and PREPARE always succeeds.
-- The task is found by the daemons' poll tick (`worker.poll_interval`) after COMMIT PREPARED,
-- as when no daemon was idle. Without the setting, nothing changes: the insert notifies
-- exactly when the flags say a daemon is idle.
--
-- Only the function is replaced (same name, owner, rights and SECURITY DEFINER); the trigger,
-- its WHEN condition and its enabled state stay as schema 14 left them, so no lock on
-- `pgtaskd.tasks` is taken. Like schema 10's body, it names every object it uses and declares
-- no variable, so that the caller's search_path cannot reach into it.
CREATE OR REPLACE FUNCTION pgtaskd.notify_tasks() RETURNS trigger
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
