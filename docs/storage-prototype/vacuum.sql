-- After a drain (bench.sql) and the end of any held snapshot: VACUUM the layout's tables, its
-- time, and the size the heaps and indexes are left at (docs/storage.md, "The prototype").
\set ON_ERROR_STOP on
SET client_min_messages = warning;
SELECT clock_timestamp() AS v0 \gset
SELECT format('VACUUM %I.%I', n.nspname, c.relname)
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
 WHERE n.nspname = :'layout' AND c.relkind = 'r' \gexec
SELECT clock_timestamp() AS v1 \gset
INSERT INTO public.results (layout, hold, metric, value)
SELECT :'layout', :hold, 'vacuum_s', extract(epoch FROM :'v1'::timestamptz - :'v0'::timestamptz)
UNION ALL
SELECT :'layout', :hold, 'dead_tuples_after_vacuum', sum(s.dead_tuple_count)
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL pgstattuple(c.oid) AS s
 WHERE n.nspname = :'layout' AND c.relkind = 'r'
UNION ALL
SELECT :'layout', :hold, 'hot_relation_bytes_after_vacuum',
       sum(pg_total_relation_size(c.oid))
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
 WHERE n.nspname = :'layout' AND c.relkind = 'r'
   AND (:'layout' = 'today'
        OR (:'layout' = 'proposed' AND c.relname IN ('ready', 'claims', 'cancel_requests'))
        OR (:'layout' = 'rowstate' AND c.relname = 'task_state'));
