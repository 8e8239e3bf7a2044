-- pgtaskd schema, version 47: a task's `created_at` is a time every reader can use
-- (docs/upgrading.md, "Schema 47").
--
-- The handler's task key holds `created_at` in microseconds since 1970 (a bigint), the claim
-- computes how long a task waited from it, and the daemon reads it as a date. A producer
-- whose role may write the column (the owner, or a role granted INSERT on the whole table)
-- could insert 'infinity', '-infinity' or a time past the bigint's range: every claim of that
-- queue then failed ("cannot subtract infinite timestamps"), so one row stopped the queue,
-- and every read of the task through the view failed. Such a row is now refused at its
-- insert; rows already written get the migration's time.
--
-- Locks: ACCESS EXCLUSIVE on `pgtaskd.tasks` for the constraint (NOT VALID: no row is read
-- for it), then one scan of the table for the rows to mend.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

-- Between the oldest time PostgreSQL takes and the year 262142, where the daemon's dates end
-- (and well before the task key's microseconds leave a bigint).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_created_at_range
        CHECK (created_at OPERATOR(pg_catalog.>) '-infinity'::pg_catalog.timestamptz
               AND created_at OPERATOR(pg_catalog.<) '262142-01-01 00:00:00+00'::pg_catalog.timestamptz) NOT VALID;

UPDATE pgtaskd.tasks
   SET created_at = pg_catalog.now()
 WHERE NOT (created_at OPERATOR(pg_catalog.>) '-infinity'::pg_catalog.timestamptz
            AND created_at OPERATOR(pg_catalog.<) '262142-01-01 00:00:00+00'::pg_catalog.timestamptz);
