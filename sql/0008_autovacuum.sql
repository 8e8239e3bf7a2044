-- pgtaskd schema, version 8: vacuum that keeps up with a busy queue.
--
-- Every task writes its row four times (the insert, the claim, the finish, retention's delete)
-- and no update can be HOT: the claim and the finish change `status`, `lease_expires_at` and
-- `finished_at`, which the partial indexes name. So each task leaves three dead row versions
-- and three dead entries in the primary key, and the table only stops growing if vacuum
-- reclaims them as fast as they come. With the server's defaults it does not: at 5,000
-- tasks/s the table grew without end (docs/design.md, "Vacuum"). Each value below is what
-- the soak bench (`pgtaskd bench --mode soak`, docs/benchmark.md) showed to matter.
--
-- These are storage parameters of this one table; an operator can change them with
-- `ALTER TABLE pgtaskd.tasks SET (...)` or `RESET (...)`, and a later `pgtaskd migrate` will not
-- undo that.

ALTER TABLE pgtaskd.tasks SET (
    -- Vacuum once 5,000 rows are dead, whatever the table's size: the default (50 plus 20% of
    -- the rows) waits longer the more rows the table keeps, so a table holding a long
    -- retention window, or a backlog, was vacuumed ever more rarely as it grew.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    -- Unthrottled: with the default cost limit (200 every 2 ms) a vacuum could not dirty pages
    -- as fast as the queue does, so each run took longer than the last while the table grew.
    -- The work is proportional to the queue's churn, which the queue does anyway.
    autovacuum_vacuum_cost_delay = 0,
    -- No truncation at the end of a vacuum: the pages at the end of a queue's table are the
    -- ones being inserted into, and truncating them takes an ACCESS EXCLUSIVE lock (replayed
    -- on standbys) for space that would be reused a moment later.
    vacuum_truncate = false
);
