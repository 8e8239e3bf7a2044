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
    -- Invariant 2: results only on SUCCEEDED rows, an error exactly on FAILED rows.
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
