#!/usr/bin/env bash
# How long the migration to schema 36 holds pgtaskd.tasks's lock (docs/upgrading.md, "Schema
# 36"): a database at schema 35 with FINISHED SUCCEEDED tasks and QUEUED queued ones, 1 KiB
# each, then sql/0036_task_state.sql applied in one transaction, as `pgtaskd migrate` does;
# the time printed is that transaction's, the lock's.
#
#   scripts/migration-lock.sh [FINISHED [QUEUED [DATABASE]]]
#       defaults: 1000000 100000 pgtaskd_migration_lock
#
# Run from the repository's root, on the server of PGHOST/PGPORT/PGUSER (default
# 127.0.0.1:5432, postgres): drops and creates DATABASE.
set -euo pipefail
finished=${1:-1000000}
queued=${2:-100000}
db=${3:-pgtaskd_migration_lock}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
psql_q() { psql -q -v ON_ERROR_STOP=1 "$@"; }
psql_q -d postgres -c "DROP DATABASE IF EXISTS $db" 2>/dev/null
psql_q -d postgres -c "CREATE DATABASE $db"
{
    echo "CREATE SCHEMA pgtaskd;"
    for file in sql/00*.sql; do
        case $file in *0036_*) break ;; esac
        echo "BEGIN;"; cat "$file"; echo "COMMIT;"
    done
} | psql_q -d "$db" >/dev/null
psql_q -d "$db" -c "ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify" \
    -c "INSERT INTO pgtaskd.tasks (payload, status, attempt, words, bytes, runes, started_at,
            finished_at, claim_token)
        SELECT repeat('x', 1000) || n, 'SUCCEEDED', 1, 1, 1001, 1001, now(), now(), n
          FROM generate_series(1, $finished) AS n" \
    -c "INSERT INTO pgtaskd.tasks (payload) SELECT repeat('y', 1000) || n FROM generate_series(1, $queued) AS n" \
    -c "ALTER TABLE pgtaskd.tasks ENABLE TRIGGER tasks_notify" \
    -c "VACUUM ANALYZE pgtaskd.tasks" -c "CHECKPOINT"
size=$(psql_q -d "$db" -Atc "SELECT pg_size_pretty(pg_total_relation_size('pgtaskd.tasks'))")
start=$(date +%s.%N)
{ echo "BEGIN;"; cat sql/0036_task_state.sql; echo "COMMIT;"; } | psql_q -d "$db" >/dev/null
end=$(date +%s.%N)
echo "$finished finished and $queued queued tasks ($size): the migration held the lock $(echo "$end - $start" | bc) s"
