-- pgtaskd schema, version 15: every SECURITY DEFINER function of the idle flags runs with a
-- fixed search_path.
--
-- Schema 14's flag triggers and `idle_flags_until` ran with their owner's rights and named
-- every function, operator and relation they used instead of setting a search_path (as the
-- insert trigger's function does, schema 10). But `take_idle_turn` declared a variable of
-- type `text`, and type names are looked up in the caller's temporary schema first: any role
-- that could write a flag (a daemon's role) could create a domain `pg_temp.text` whose CHECK
-- calls a function of its own, and have it run with the owner's rights at its next flag
-- write. These three functions run only when a flag is written, a few times a second at
-- most, so a SET clause costs nothing that matters; with `pg_catalog` before `pg_temp`, no
-- name in them can be taken over. The insert trigger's function (`notify_tasks`, on every
-- producer's statement) keeps naming everything: it declares no variable and names no type.
ALTER FUNCTION pgtaskd.take_idle_turn() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgtaskd.set_idle_until() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgtaskd.idle_flags_until() SET search_path = pg_catalog, pg_temp;
