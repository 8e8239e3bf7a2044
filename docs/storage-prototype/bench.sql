-- One drain of the storage prototype (docs/storage.md, "The prototype"), for one layout:
-- insert :tasks tasks of 1 KiB in statements of :per_stmt rows, claim them all in batches of
-- :batch, finish them all in batches of :batch, each statement its own transaction; WAL
-- (pg_current_wal_insert_lsn) and time of each phase; then the dead tuples the layout's tables
-- hold (pgstattuple). Run by run.sh after schema.sql, with or without a snapshot held open by
-- another session; psql variables: layout (today|proposed), hold (0|1), tasks, per_stmt, batch.
\set ON_ERROR_STOP on
SET client_min_messages = warning;

CREATE UNLOGGED TABLE IF NOT EXISTS public.results (
    layout text, hold int, metric text, value numeric, at timestamptz DEFAULT now());

-- The bench's own bookkeeping: a temporary table writes no WAL.
CREATE TEMP TABLE claimed (n bigserial, id bigint, token bigint);

CREATE OR REPLACE PROCEDURE pg_temp.bench_insert(layout text, tasks int, per_stmt int)
LANGUAGE plpgsql AS $$
DECLARE
    i int := 0;
BEGIN
    WHILE i < tasks LOOP
        EXECUTE format('INSERT INTO %I.tasks (payload, queue, priority, run_at, max_attempts, '
                       'idempotency_key) '
                       'SELECT repeat(md5(g::text), 32), ''default'', 0, now(), 3, NULL '
                       'FROM generate_series($1 + 1, $1 + $2) AS g', layout)
            USING i, per_stmt;
        COMMIT;
        i := i + per_stmt;
    END LOOP;
END
$$;

CREATE OR REPLACE PROCEDURE pg_temp.bench_claim(layout text, batch int)
LANGUAGE plpgsql AS $$
DECLARE
    got bigint;
BEGIN
    LOOP
        EXECUTE format('INSERT INTO pg_temp.claimed (id, token) '
                       'SELECT c.task_id, c.task_token FROM %I.claim($1, ''bench'') AS c '
                       'WHERE c.task_payload IS NOT NULL', layout)
            USING batch;
        GET DIAGNOSTICS got = ROW_COUNT;
        COMMIT;
        EXIT WHEN got = 0;
    END LOOP;
END
$$;

CREATE OR REPLACE PROCEDURE pg_temp.bench_finish(layout text, batch int)
LANGUAGE plpgsql AS $$
DECLARE
    lo bigint := 0;
    hi bigint;
    ids bigint[];
    tokens bigint[];
    written bigint;
BEGIN
    SELECT max(n) INTO hi FROM pg_temp.claimed;
    WHILE lo < hi LOOP
        SELECT array_agg(c.id ORDER BY c.n), array_agg(c.token ORDER BY c.n) INTO ids, tokens
          FROM pg_temp.claimed AS c WHERE c.n > lo AND c.n <= lo + batch;
        EXECUTE format('SELECT count(*) FROM %I.finish($1, $2)', layout)
            INTO written USING ids, tokens;
        IF written <> cardinality(ids) THEN
            RAISE EXCEPTION 'finish wrote % of % tasks', written, cardinality(ids);
        END IF;
        IF layout = 'proposed' THEN
            PERFORM proposed.sweep(ARRAY(SELECT DISTINCT t / 1024 FROM unnest(tokens) AS t));
        END IF;
        COMMIT;
        lo := lo + batch;
    END LOOP;
END
$$;

-- Where each phase's WAL went, record by record (pg_walinspect, PostgreSQL 15+): read right
-- after each phase, before a checkpoint may recycle the segments, up to the WAL flushed (the
-- phase's last commit is); a record that names a block
-- of another database's relation is another session's and is left out of this database's
-- figures (the server-wide LSN difference is kept too). Skipped when the extension cannot be
-- created.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_walinspect;
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'pg_walinspect: %', SQLERRM;
END
$$;
SELECT count(*) = 1 AS walinspect FROM pg_extension WHERE extname = 'pg_walinspect' \gset
CREATE TEMP TABLE walrec (phase text, record_type text, bytes bigint, ours boolean);

CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS l0, clock_timestamp() AS t0 \gset
CALL pg_temp.bench_insert(:'layout', :tasks, :per_stmt);
SELECT pg_current_wal_insert_lsn() AS l1, clock_timestamp() AS t1 \gset
\if :walinspect
\set ON_ERROR_STOP off
INSERT INTO pg_temp.walrec
SELECT 'insert', r.resource_manager || '/' || r.record_type, r.record_length,
       NOT EXISTS (SELECT 1 FROM regexp_matches(coalesce(r.block_ref, ''), 'rel \d+/(\d+)/', 'g') AS m
                    WHERE m[1]::oid <> (SELECT d.oid FROM pg_database AS d
                                         WHERE d.datname = current_database()))
  FROM pg_get_wal_records_info(:'l0', least(:'l1'::pg_lsn, pg_current_wal_flush_lsn())) AS r;
\set ON_ERROR_STOP on
\endif
CALL pg_temp.bench_claim(:'layout', :batch);
SELECT pg_current_wal_insert_lsn() AS l2, clock_timestamp() AS t2 \gset
\if :walinspect
\set ON_ERROR_STOP off
INSERT INTO pg_temp.walrec
SELECT 'claim', r.resource_manager || '/' || r.record_type, r.record_length,
       NOT EXISTS (SELECT 1 FROM regexp_matches(coalesce(r.block_ref, ''), 'rel \d+/(\d+)/', 'g') AS m
                    WHERE m[1]::oid <> (SELECT d.oid FROM pg_database AS d
                                         WHERE d.datname = current_database()))
  FROM pg_get_wal_records_info(:'l1', least(:'l2'::pg_lsn, pg_current_wal_flush_lsn())) AS r;
\set ON_ERROR_STOP on
\endif
CALL pg_temp.bench_finish(:'layout', :batch);
SELECT pg_current_wal_insert_lsn() AS l3, clock_timestamp() AS t3 \gset
\if :walinspect
\set ON_ERROR_STOP off
INSERT INTO pg_temp.walrec
SELECT 'finish', r.resource_manager || '/' || r.record_type, r.record_length,
       NOT EXISTS (SELECT 1 FROM regexp_matches(coalesce(r.block_ref, ''), 'rel \d+/(\d+)/', 'g') AS m
                    WHERE m[1]::oid <> (SELECT d.oid FROM pg_database AS d
                                         WHERE d.datname = current_database()))
  FROM pg_get_wal_records_info(:'l2', least(:'l3'::pg_lsn, pg_current_wal_flush_lsn())) AS r;
\set ON_ERROR_STOP on
\endif

SELECT count(*) AS finished FROM pg_temp.claimed \gset

-- Dead tuples left in the layout's heaps (TOAST included: none here, the payloads stay inline).
CREATE TEMP TABLE dead AS
SELECT c.relname, s.dead_tuple_count, s.dead_tuple_len, s.table_len
  FROM pg_class AS c
  JOIN pg_namespace AS n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL pgstattuple(c.oid) AS s
 WHERE n.nspname = :'layout' AND c.relkind = 'r';

-- WAL per phase: this database's records where pg_walinspect read them, else the server's
-- LSN difference.
CREATE TEMP TABLE phases AS
SELECT p.phase, pg_wal_lsn_diff(p.b, p.a) AS server_bytes,
       (SELECT sum(w.bytes) FROM pg_temp.walrec AS w WHERE w.phase = p.phase AND w.ours) AS own_bytes
  FROM (VALUES ('insert', :'l0'::pg_lsn, :'l1'::pg_lsn), ('claim', :'l1', :'l2'),
               ('finish', :'l2', :'l3')) AS p(phase, a, b);

INSERT INTO public.results (layout, hold, metric, value)
VALUES (:'layout', :hold, 'tasks', :finished),
       (:'layout', :hold, 'insert_s', extract(epoch FROM :'t1'::timestamptz - :'t0'::timestamptz)),
       (:'layout', :hold, 'claim_s', extract(epoch FROM :'t2'::timestamptz - :'t1'::timestamptz)),
       (:'layout', :hold, 'finish_s', extract(epoch FROM :'t3'::timestamptz - :'t2'::timestamptz));
INSERT INTO public.results (layout, hold, metric, value)
SELECT :'layout', :hold, 'wal_' || p.phase || '_per_task',
       coalesce(p.own_bytes, p.server_bytes) / :finished
  FROM pg_temp.phases AS p
UNION ALL
SELECT :'layout', :hold, 'wal_total_per_task',
       sum(coalesce(p.own_bytes, p.server_bytes)) / :finished
  FROM pg_temp.phases AS p
UNION ALL
SELECT :'layout', :hold, 'wal_total_per_task_server_wide', sum(p.server_bytes) / :finished
  FROM pg_temp.phases AS p;
INSERT INTO public.results (layout, hold, metric, value)
SELECT :'layout', :hold, 'dead_tuples', sum(dead_tuple_count) FROM dead
UNION ALL
SELECT :'layout', :hold, 'dead_bytes_per_task', sum(dead_tuple_len)::numeric / :finished FROM dead
UNION ALL
SELECT :'layout', :hold, 'heap_bytes', sum(table_len) FROM dead
UNION ALL
SELECT :'layout', :hold, 'relation_bytes_with_indexes',
       sum(pg_total_relation_size(format('%I.%I', :'layout', relname)::regclass)) FROM dead;

SELECT relname, dead_tuple_count, dead_tuple_len, table_len FROM dead ORDER BY relname;

-- Where this database's WAL went, by record type.
CREATE UNLOGGED TABLE IF NOT EXISTS public.results_wal (
    layout text, hold int, phase text, record_type text, records bigint, bytes_per_task numeric);
INSERT INTO public.results_wal
SELECT :'layout', :hold, w.phase, w.record_type, count(*), round(sum(w.bytes)::numeric / :finished, 1)
  FROM pg_temp.walrec AS w WHERE w.ours
 GROUP BY w.phase, w.record_type;
