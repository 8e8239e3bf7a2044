-- pgtaskd schema, version 27: room on each page for the row's next versions.
--
-- A task's row is written three times: the producer's insert, the claim and the finish. The
-- claim and the finish cannot be HOT updates (they change `status`, which the partial
-- indexes name), and version 8 concluded that free space on a page would therefore not help.
-- It does, for the WAL: PostgreSQL logs only the bytes that changed between the old version
-- and the new one when both are on the same page, and the changed bytes of a claim or a
-- finish are the state columns, about 150, not the payload before them. On a full page the
-- new version goes to another page and is logged whole, payload included: with 1 KiB texts,
-- 1,470 bytes of WAL per claim and 1,429 per finish, against 1,330 for the insert.
--
-- With `fillfactor = 50` an insert leaves half of each page free, where the claim's version
-- lands, and the finish's once the page is pruned (the insert's version is dead as soon as
-- the claim commits, unless a snapshot still sees it). Measured (docs/performance.md,
-- "Room for updates"): the WAL of a drain, claims and finishes of 20,000 tasks of 1 KiB at
-- C = 8, from about 3,210 to 1,090-1,360 bytes per task, and the drain faster. The cost is disk: pages
-- of finished rows kept by retention stay about half empty (inserts do not fill the room
-- left for updates).
--
-- Set only where the table has no fillfactor yet: an operator's own (`ALTER TABLE
-- pgtaskd.tasks SET (fillfactor = ...)`, or `RESET (fillfactor)` after this migration for the
-- default of 100) is kept, as every storage parameter of schema 8. It takes effect for pages
-- filled from now on; no row is rewritten. The lock is SHARE UPDATE EXCLUSIVE, which inserts,
-- claims and finishes do not wait for: daemons of schema 26 may run while it is applied, and
-- stop at the schema check when restarted, as after every migration.

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1
          FROM pg_catalog.pg_class AS c,
               pg_catalog.unnest(COALESCE(c.reloptions, '{}'::text[])) AS o(option)
         WHERE c.oid OPERATOR(pg_catalog.=) 'pgtaskd.tasks'::pg_catalog.regclass::pg_catalog.oid
           AND o.option OPERATOR(pg_catalog.~~) 'fillfactor=%'
    ) THEN
        ALTER TABLE pgtaskd.tasks SET (fillfactor = 50);
    END IF;
END
$$;
