-- The producers' contract on the proposed layout, shown statement by statement (docs/storage.md,
-- "Keeping the contract"); run by run.sh after schema.sql, in a fresh load. Each \echo says what
-- the next answer must be; run.sh stops at the first error (ON_ERROR_STOP).
\set ON_ERROR_STOP on
SET client_min_messages = warning;

\echo '-- an INSERT returns its id; the task reads QUEUED through the view'
INSERT INTO proposed.tasks (payload, queue, priority, run_at, max_attempts, idempotency_key,
                            traceparent)
VALUES ('one two three', 'default', 0, now(), 3, 'key-1',
        '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')
RETURNING id AS first_id \gset
SELECT id, status, words, bytes, runes, output, error FROM proposed.task_view WHERE id = :first_id;

\echo '-- INSERT ... ON CONFLICT on the idempotency key: no second row (INSERT 0 0)'
INSERT INTO proposed.tasks (payload, idempotency_key) VALUES ('again', 'key-1')
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;

\echo '-- COPY into the table: three tasks, three ready rows'
COPY proposed.tasks (payload, queue) FROM stdin;
four	default
five	default
six	default
\.
SELECT count(*) AS ready_rows FROM proposed.ready;

\echo '-- a multi-row INSERT ... SELECT in a transaction that rolls back leaves nothing'
BEGIN;
INSERT INTO proposed.tasks (payload) SELECT 'x' || g FROM generate_series(1, 100) AS g;
ROLLBACK;
SELECT count(*) AS tasks, (SELECT count(*) FROM proposed.ready) AS ready FROM proposed.tasks;

\echo '-- claim two: RUNNING with a lease and a token each'
CREATE TEMP TABLE c AS SELECT * FROM proposed.claim(2, 'checker');
SELECT task_id, task_token, task_attempt FROM c ORDER BY task_id;
SELECT id, status, attempt, lease_owner, claim_token FROM proposed.task_view
 WHERE id IN (SELECT task_id FROM c) ORDER BY id;

\echo '-- cancel: the second claimed task gets a request (RUNNING), a QUEUED one ends CANCELED'
SELECT proposed.cancel((SELECT max(task_id) FROM c)) AS running_cancel,
       proposed.cancel((SELECT max(id) FROM proposed.tasks)) AS queued_cancel;

\echo '-- finish both: SUCCEEDED with counts, and CANCELED (its cancel was requested)'
SELECT * FROM proposed.finish(ARRAY(SELECT task_id FROM c ORDER BY task_id),
                              ARRAY(SELECT task_token FROM c ORDER BY task_id));
SELECT id, status, words, bytes, runes, output, error, cancel_requested, claim_token
  FROM proposed.task_view ORDER BY id;

\echo '-- a second finish of the same tokens writes nothing (fenced)'
SELECT count(*) AS written_again
  FROM proposed.finish(ARRAY(SELECT task_id FROM c ORDER BY task_id),
                       ARRAY(SELECT task_token FROM c ORDER BY task_id));
SELECT proposed.sweep(ARRAY(SELECT DISTINCT task_token / 1024 FROM c)) AS claims_swept;

\echo '-- reading one task by id touches a few buffers (after the 20,000-task drain too: run.sh)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT status, words, bytes, runes, output, error FROM proposed.task_view WHERE id = :first_id;

\echo '-- why pgtaskd.tasks stays a table: through a view, COPY works but ON CONFLICT does not'
CREATE TEMP VIEW v AS SELECT id, queue, payload, idempotency_key FROM proposed.tasks;
CREATE FUNCTION pg_temp.v_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO proposed.tasks (queue, payload, idempotency_key)
    VALUES (coalesce(NEW.queue, 'default'), NEW.payload, NEW.idempotency_key)
    RETURNING id INTO NEW.id;
    RETURN NEW;
END
$$;
CREATE TRIGGER v_insert INSTEAD OF INSERT ON v FOR EACH ROW EXECUTE FUNCTION pg_temp.v_insert();
COPY v (payload) FROM stdin;
through the view
\.
\set ON_ERROR_STOP off
INSERT INTO v (payload, idempotency_key) VALUES ('again', 'key-1')
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
\set ON_ERROR_STOP on

\echo '-- and the other way round: a view with no trigger (automatically updatable, the state'
\echo '-- columns read through subqueries) takes ON CONFLICT and RETURNING, but refuses COPY'
CREATE TEMP VIEW u AS
SELECT t.id, t.queue, t.payload, t.idempotency_key,
       (SELECT v.status FROM proposed.task_view AS v WHERE v.id = t.id) AS status
  FROM proposed.tasks AS t;
INSERT INTO u (payload, idempotency_key) VALUES ('through u', 'key-u') RETURNING status;
INSERT INTO u (payload, idempotency_key) VALUES ('again', 'key-u')
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
\set ON_ERROR_STOP off
COPY u (payload) FROM stdin;
refused
\.
\set ON_ERROR_STOP on
\echo '-- checks done'
