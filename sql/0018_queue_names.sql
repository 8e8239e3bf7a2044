-- pgtaskd schema, version 18: a queue name is 1 to 128 bytes.
--
-- `pgtaskd.pause_queue` and `resume_queue` send the name as a NOTIFY payload, which must be
-- shorter than 8,000 bytes: pausing a longer name failed inside the function. The
-- idempotency index holds the name beside the key, and an index entry must fit a third of a
-- page. 128 bytes leaves room for both, and is what the CLI, the HTTP API and the
-- configuration check before any statement (`queue::enqueue::check_queue_name`); these
-- constraints hold the same rule for every other writer (INSERT, `pgtaskd.enqueue`,
-- `pgtaskd.pause_queue`). A name the table refuses fails with SQLSTATE 23514, naming the
-- constraint.
--
-- Existing names are not changed, and no row is refused behind the operator's back: the
-- migration first reads both tables (a plain read: producers, daemons and vacuum go on) and,
-- if any task or paused queue has a name outside the rule, fails with how many, changing
-- nothing. Rename them (`UPDATE pgtaskd.tasks SET queue = 'short' WHERE queue = '...'`, the
-- same in `pgtaskd.paused_queues`) or delete them, then migrate again.
--
-- The table's constraint is added NOT VALID: that takes `pgtaskd.tasks`'s ACCESS EXCLUSIVE
-- lock only for a change of the catalog, waited for at most 10 s (less when the session's
-- `lock_timeout` is shorter), as schema 14's. A VALIDATE here would scan every row under that
-- lock, since the migrations run in one transaction; the read above did the scan without it.
-- Every row written from now on is checked. A row with a longer name committed by an older
-- producer between that read and the lock is not (its later updates would fail);
-- `ALTER TABLE pgtaskd.tasks VALIDATE CONSTRAINT tasks_queue_name` finds any such row, and
-- marks the constraint validated when there is none, while writers go on. `paused_queues` is
-- small: its constraint is validated at once.
DO $$
DECLARE
    tasks  bigint;
    paused bigint;
BEGIN
    SELECT pg_catalog.count(*) INTO tasks FROM pgtaskd.tasks AS t
     WHERE pg_catalog.octet_length(t.queue) NOT BETWEEN 1 AND 128;
    SELECT pg_catalog.count(*) INTO paused FROM pgtaskd.paused_queues AS p
     WHERE pg_catalog.octet_length(p.queue) NOT BETWEEN 1 AND 128;
    IF tasks OPERATOR(pg_catalog.>) 0 OR paused OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION 'pgtaskd schema 18 limits queue names to 1 to 128 bytes, and % tasks '
                        'and % paused queues have a name outside that', tasks, paused
            USING ERRCODE = 'check_violation',
                  HINT = 'rename them (UPDATE pgtaskd.tasks SET queue = ... WHERE queue = ...) '
                         'or delete them, then run pgtaskd migrate again; nothing was changed';
    END IF;
END
$$;

DO $$
DECLARE
    waits interval := pg_catalog.current_setting('lock_timeout')::interval;
BEGIN
    PERFORM pg_catalog.set_config('pgtaskd.lock_timeout_before_16',
                                  pg_catalog.current_setting('lock_timeout'), true);
    IF waits OPERATOR(pg_catalog.=) interval '0'
       OR waits OPERATOR(pg_catalog.>) interval '10 seconds' THEN
        PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    END IF;
END
$$;

ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_queue_name
        CHECK (pg_catalog.octet_length(queue) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(queue) OPERATOR(pg_catalog.<=) 128) NOT VALID;

ALTER TABLE pgtaskd.paused_queues
    ADD CONSTRAINT paused_queues_queue_name
        CHECK (pg_catalog.octet_length(queue) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(queue) OPERATOR(pg_catalog.<=) 128);

SELECT pg_catalog.set_config('lock_timeout',
                             pg_catalog.current_setting('pgtaskd.lock_timeout_before_16'), true);
