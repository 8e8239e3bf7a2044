#!/usr/bin/env bash
# What a drain leaves behind (docs/storage.md, "Built: the state in a row of its own"): WAL
# bytes per task of the producer's INSERT and of the drain, and dead heap bytes per finished
# task of pgtaskd.tasks and pgtaskd.task_state (pgstattuple, before any vacuum after the
# drain could run past a held snapshot), for 20,000 tasks of 1 KiB drained by a real daemon
# at concurrency 8, with or without a REPEATABLE READ snapshot held through the drain.
#
#   scripts/drain-dead-bytes.sh [BINARY [DATABASE [hold|nohold]]]
#       defaults: target/release/pgtaskd, pgtaskd_dead_bytes, hold
#
# Drops and creates DATABASE on the server of PGHOST/PGPORT/PGUSER (default
# 127.0.0.1:5432, postgres), migrates it with BINARY (a binary of an earlier release measures
# its own layout), and needs the pgstattuple extension (PostgreSQL's contrib).
#
# With WAL_BY_RECORD=1 it also prints where the drain's WAL went, from pg_walinspect
# (contrib too): per record type and relation, records and bytes per task, full-page images
# apart. Records without a block (commits) are counted under "-"; the server's other
# databases are left out.
set -euo pipefail
bin=${1:-target/release/pgtaskd}
db=${2:-pgtaskd_dead_bytes}
hold=${3:-hold}
n=20000
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
psql_q() { psql -q -v ON_ERROR_STOP=1 "$@"; }
psql_q -d postgres -c "DROP DATABASE IF EXISTS $db" 2>/dev/null
psql_q -d postgres -c "CREATE DATABASE $db"
export PGTASKD_DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$db"
"$bin" migrate >/dev/null
psql_q -d "$db" -c "CREATE EXTENSION pgstattuple" -c "CREATE EXTENSION pg_walinspect" >/dev/null
lsn() { psql_q -d "$db" -Atc "SELECT pg_current_wal_lsn()"; }
w0=$(lsn)
psql_q -d "$db" -c "INSERT INTO pgtaskd.tasks (payload)
    SELECT substr(repeat(md5(n::text) || ' ', 40), 1, 1024) FROM generate_series(1, $n) AS n"
w1=$(lsn)
psql_q -d "$db" -c "VACUUM ANALYZE" -c "CHECKPOINT"
holder=""
if [ "$hold" = hold ]; then
    psql_q -d "$db" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
        -c "SELECT count(*) FROM pgtaskd.tasks" -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
    holder=$!
    sleep 1
fi
w2=$(lsn)
config=$(mktemp)
trap 'rm -f "$config"' EXIT
printf '[worker]\nconcurrency = 8\n[log]\nlevel = "warn"\n' >"$config"
"$bin" run --config "$config" >/dev/null 2>&1 &
daemon=$!
until [ "$(psql_q -d "$db" -Atc "SELECT count(*) FROM pgtaskd.task_view WHERE status <> 'SUCCEEDED'")" = 0 ]; do
    sleep 0.2
done
kill -TERM "$daemon"
wait "$daemon" || true
w3=$(lsn)
dead=$(psql_q -d "$db" -Atc "SELECT sum((pgstattuple(c.oid)).dead_tuple_len) FROM pg_class AS c
    WHERE c.relnamespace = 'pgtaskd'::regnamespace AND c.relname IN ('tasks', 'task_state')
      AND c.relkind = 'r'")
if [ -n "$holder" ]; then
    psql_q -d "$db" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE datname = '$db' AND pid <> pg_backend_pid()" >/dev/null
    wait "$holder" 2>/dev/null || true
fi
psql_q -d "$db" -Atc "SELECT format('snapshot %s: INSERT WAL %s bytes/task, drain WAL %s bytes/task, (insert + drain) / insert %sx, dead heap %s bytes/finished task',
    '$hold', round(pg_wal_lsn_diff('$w1', '$w0') / $n), round(pg_wal_lsn_diff('$w3', '$w2') / $n),
    round((pg_wal_lsn_diff('$w1', '$w0') + pg_wal_lsn_diff('$w3', '$w2')) / pg_wal_lsn_diff('$w1', '$w0'), 2),
    round($dead::numeric / $n))"
if [ "${WAL_BY_RECORD:-0}" = 1 ]; then
    psql_q -d "$db" -Atc "WITH r AS (
            SELECT w.resource_manager || '/' || w.record_type AS record,
                   coalesce((SELECT c.relname FROM pg_class AS c
                              WHERE c.relfilenode = substring(w.block_ref FROM 'rel [0-9]+/[0-9]+/([0-9]+)')::oid
                              LIMIT 1), '-') AS relation,
                   substring(w.block_ref FROM 'rel [0-9]+/([0-9]+)/')::oid AS db,
                   w.record_length, w.fpi_length
              FROM pg_get_wal_records_info('$w2', '$w3') AS w)
        SELECT format('drain WAL by record: %s on %s: %s records (%s a task), %s bytes a task, of which full-page images %s',
                      r.record, r.relation, count(*), round(count(*)::numeric / $n, 2),
                      round(sum(r.record_length)::numeric / $n), round(sum(r.fpi_length)::numeric / $n))
          FROM r
         WHERE r.db IS NULL OR r.db = (SELECT oid FROM pg_database WHERE datname = current_database())
         GROUP BY r.record, r.relation
        HAVING sum(r.record_length) >= $n
         ORDER BY sum(r.record_length) DESC"
fi
