-- pgtaskd schema, version 10: the insert trigger without a SET clause.
--
-- Schema 7's trigger function pinned `search_path = pg_catalog, pg_temp`, as a SECURITY
-- DEFINER function should unless it names everything. Setting a parameter on every call is
-- not free: PostgreSQL saves and restores the setting around each call and recomputes the
-- search path both times. With 64 producers committing single-row INSERTs (no daemon, so no
-- notification at all), that cost a fifth of the commits per second: 8,760 against 9,630 for
-- this version and 10,450 with the trigger disabled (pgbench -M prepared, medians of 3
-- interleaved 10 s runs on a 2-core machine; a trigger function that does nothing reached
-- 9,580, so what remains is the price of having a PL/pgSQL trigger at all).
--
-- This version names every object it uses instead, so that the caller's search_path cannot
-- reach into it even though it runs with its owner's rights: the table by its schema, the
-- functions `pg_catalog.now()` and `pg_catalog.pg_notify`, and the comparison as
-- `OPERATOR(pg_catalog.>)` (operators are looked up through the search path too). It names no
-- type (the temporary schema, searched first by default, is searched for relations and types,
-- never for functions or operators). Its behaviour is schema 7's.
CREATE OR REPLACE FUNCTION pgtaskd.notify_tasks() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
BEGIN
    IF EXISTS (SELECT 1
                 FROM pgtaskd.idle_daemons AS d
                WHERE d.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) THEN
        PERFORM pg_catalog.pg_notify('pgtaskd_tasks', '');
    END IF;
    RETURN NULL;
END
$$;
