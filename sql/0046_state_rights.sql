-- pgtaskd schema, version 46: no role but the owner deletes state rows, and only a daemon's
-- role updates them (docs/upgrading.md, "Schema 46").
--
-- Schema 36 gave every role that could update or delete task rows the same right on their
-- state rows, so that roles granted before it kept working. That was wider than the grant
-- functions of 0.2.0 give: a role granted by `grant_daemon` before 0.2.0 kept `DELETE` on
-- `pgtaskd.task_state`, and could delete a task's state row and leave its task row, a task
-- the view no longer shows and no daemon claims; a role given `UPDATE` on the task table by
-- hand could write any task's state. Retention deletes state rows through `pgtaskd.prune`, and
-- a task's deletion through its trigger, both with the owner's rights: no other role needs
-- `DELETE` on them. `UPDATE` stays with the roles that may claim (a daemon's), as
-- `grant_daemon` gives it.
--
-- Locks: the privilege changes of `pgtaskd.task_state` only.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

DO $$
DECLARE
    g record;
    grantee text;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.privilege_type
          FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.oid OPERATOR(pg_catalog.=) 'pgtaskd.task_state'::pg_catalog.regclass
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['UPDATE', 'DELETE'])
    LOOP
        -- A daemon's role keeps UPDATE: its heartbeats and progress write the state rows.
        CONTINUE WHEN g.privilege_type OPERATOR(pg_catalog.=) 'UPDATE'
            AND g.grantee OPERATOR(pg_catalog.<>) 0
            AND pg_catalog.has_function_privilege(g.grantee,
                    'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint)',
                    'EXECUTE');
        grantee := CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                        ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END;
        EXECUTE pg_catalog.format('REVOKE %s ON pgtaskd.task_state FROM %s', g.privilege_type, grantee);
    END LOOP;
END
$$;
