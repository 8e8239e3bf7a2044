-- pgtaskd schema, version 29: a session can turn off every notification of pgtaskd's
-- functions, and the daemon does on a server whose commits wait for a missing standby.
--
-- A server that holds commits for a synchronous standby while none is connected (a promoted
-- standby that kept `synchronous_standby_names`, a primary whose standbys are gone) makes
-- every producer's commit wait. A producer's transaction that inserted a task sent `NOTIFY
-- pgtaskd_tasks` (the insert trigger), and a transaction that notified holds, from its commit
-- until its wait ends, the one lock every NOTIFY of the cluster takes at commit. The daemon's
-- sessions there commit locally (`synchronous_commit = local`, since version 15's sessions),
-- but each finish sends `NOTIFY pgtaskd_done` and so waited behind that producer, for as long
-- as the standby stayed away: no task finished.
--
-- `pgtaskd.notify(channel, payload)` is `pg_notify` unless the session or transaction set
-- `pgtaskd.notify = off`, the setting the insert trigger already honours ("Prepared
-- producers"); every function of pgtaskd that notified calls it instead. The daemon sets it,
-- with `synchronous_commit = local`, on the sessions it opens on such a server: waiters then
-- learn of ends by their polls, as when a notification is lost. Nothing else changes: daemons
-- of schema 28 may run while this is applied, and stop at the schema check when restarted.

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

CREATE OR REPLACE FUNCTION pgtaskd.notify_done(ids bigint[]) RETURNS void
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

CREATE OR REPLACE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
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

CREATE OR REPLACE FUNCTION pgtaskd.pause_queue(queue text) RETURNS boolean
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

CREATE OR REPLACE FUNCTION pgtaskd.resume_queue(queue text) RETURNS boolean
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

CREATE OR REPLACE FUNCTION pgtaskd.retry(task_id bigint) RETURNS text
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

CREATE OR REPLACE FUNCTION pgtaskd.retry_failed(
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
