-- pgtaskd schema, version 1: the task table, its indexes, the enqueue trigger and functions.
-- Applied by `pgtaskd migrate` inside one transaction under an advisory lock.

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

    CONSTRAINT tasks_status_check
        CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELED')),
    CONSTRAINT tasks_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT tasks_attempt_check CHECK (attempt >= 0),
    -- "Results with status" (docs/design.md): results only on SUCCEEDED rows, an error exactly on FAILED rows.
    CONSTRAINT tasks_results_only_when_succeeded
        CHECK (status = 'SUCCEEDED' OR (words = 0 AND bytes = 0 AND runes = 0)),
    CONSTRAINT tasks_error_only_when_failed
        CHECK ((status = 'FAILED') = (error IS NOT NULL)),
    -- A lease exists exactly while the task runs.
    CONSTRAINT tasks_lease_only_when_running
        CHECK ((status = 'RUNNING') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);

COMMENT ON TABLE pgtaskd.tasks IS
    'pgtaskd task queue: INSERT (payload) to enqueue; pgtaskd.cancel(id) to cancel';

-- Claims read only QUEUED rows, in (priority DESC, id) order per queue: a partial index keeps
-- their cost independent of how many finished rows the table holds.
CREATE INDEX tasks_claim_idx ON pgtaskd.tasks (queue, priority DESC, id)
    WHERE status = 'QUEUED';

-- The rescuer looks for RUNNING rows whose lease expired.
CREATE INDEX tasks_lease_idx ON pgtaskd.tasks (lease_expires_at)
    WHERE status = 'RUNNING';

-- Retention prunes finished rows by age.
CREATE INDEX tasks_finished_idx ON pgtaskd.tasks (finished_at)
    WHERE finished_at IS NOT NULL;

-- One NOTIFY per INSERT or COPY statement, sent at commit (none on rollback). PostgreSQL also
-- folds identical notifications of one transaction into one.
-- Sites that would rather poll: ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify;
CREATE FUNCTION pgtaskd.notify_tasks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgtaskd_tasks', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_notify
    AFTER INSERT ON pgtaskd.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd.notify_tasks();

-- Claim: QUEUED -> RUNNING for up to max_tasks tasks of the given queues whose run_at has
-- come, highest priority first, then oldest; one winner per task (SKIP LOCKED, re-checked by
-- the outer UPDATE). Each queue is read through its own ordered scan of tasks_claim_idx.
-- The function's planner settings keep that plan whatever the statistics say: a queue table
-- swings from empty to full faster than ANALYZE follows, and statistics taken while it was
-- empty would otherwise make every claim of the next burst read and sort all its QUEUED rows.
CREATE FUNCTION pgtaskd.claim(queues text[], max_tasks bigint, owner text, lease_ms float8)
RETURNS TABLE (task_id bigint, task_attempt int, task_payload text, waited_s float8)
LANGUAGE sql
SET enable_seqscan = off
SET enable_sort = off
SET enable_bitmapscan = off
-- The disabled plans' cost penalty would otherwise trigger JIT compilation on every call.
SET jit = off
AS $$
    WITH picked AS MATERIALIZED (
        SELECT c.id
          FROM unnest(claim.queues) AS q(name)
         CROSS JOIN LATERAL (
                SELECT k.id, k.priority
                  FROM pgtaskd.tasks AS k
                 WHERE k.status = 'QUEUED'
                   AND k.queue = q.name
                   AND k.run_at <= now()
                 ORDER BY k.priority DESC, k.id
                 LIMIT claim.max_tasks
                   FOR UPDATE SKIP LOCKED
               ) AS c
         ORDER BY c.priority DESC, c.id
         LIMIT claim.max_tasks
    )
    UPDATE pgtaskd.tasks AS t
       SET status = 'RUNNING',
           attempt = t.attempt + 1,
           lease_owner = claim.owner,
           lease_expires_at = now() + claim.lease_ms * interval '1 millisecond',
           started_at = now()
     WHERE t.id = ANY (ARRAY(SELECT picked.id FROM picked))
       -- The re-check, written so that it cannot steer the row lookup to a partial index
       -- (stale statistics make those look tiny): the rows are found by primary key.
       AND coalesce(t.status, '') = 'QUEUED'
    RETURNING t.id, t.attempt, t.payload,
              extract(epoch FROM now() - greatest(t.created_at, t.run_at))::float8
$$;

-- Enqueue as a function: the same as an INSERT, returning the new id.
CREATE FUNCTION pgtaskd.enqueue(
    payload      text,
    queue        text        DEFAULT 'default',
    priority     int         DEFAULT 0,
    run_at       timestamptz DEFAULT now(),
    max_attempts int         DEFAULT 3
) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts)
    VALUES (enqueue.payload, enqueue.queue, enqueue.priority::smallint, enqueue.run_at,
            enqueue.max_attempts)
    RETURNING id
$$;

-- Cancel: QUEUED becomes CANCELED at once; RUNNING gets cancel_requested and a NOTIFY
-- pgtaskd_cancel carrying the id (the daemon running it commits CANCELED once its analyzer
-- has returned); a terminal task is left as it is. request_cancel reports the status before
-- and after the request (both null when there is no such task); cancel returns the latter.
CREATE FUNCTION pgtaskd.request_cancel(task_id bigint, OUT previous text, OUT current text)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgtaskd.tasks SET status = 'CANCELED', finished_at = now()
     WHERE id = task_id AND status = 'QUEUED'
    RETURNING 'QUEUED', status INTO previous, current;
    IF FOUND THEN
        RETURN;
    END IF;

    UPDATE pgtaskd.tasks SET cancel_requested = true
     WHERE id = task_id AND status = 'RUNNING'
    RETURNING 'RUNNING', status INTO previous, current;
    IF FOUND THEN
        PERFORM pg_notify('pgtaskd_cancel', task_id::text);
        RETURN;
    END IF;

    SELECT status, status INTO previous, current FROM pgtaskd.tasks WHERE id = task_id;
END
$$;

CREATE FUNCTION pgtaskd.cancel(task_id bigint) RETURNS text
LANGUAGE sql AS $$
    SELECT current FROM pgtaskd.request_cancel(task_id)
$$;
