#!/usr/bin/env bash
# Dependencies measured (docs/dependencies.md, "Figures"; docs/performance.md): a real daemon
# of BINARY drains, at concurrency 8 with a poll interval of 60 s (so that only the wake of
# each release moves a task along):
#   chain   a chain of 1,000 analyzer tasks: its whole time, and each hop from the parent's
#           end (its finish's transaction) to the child's claim, p50 and p99;
#   fanin   10,000 parents of one child, against 10,000 tasks with no edges (tasks/s each);
#   fanout  the finish of one parent of 10,000 children (the statement's time, in psql).
#
#   scripts/deps-bench.sh [BINARY [DATABASE]]
#       defaults: target/release/pgtaskd, pgtaskd_deps_bench
#
# Drops and creates DATABASE on the server of PGHOST/PGPORT/PGUSER (default
# 127.0.0.1:5432, postgres).
set -euo pipefail
bin=${1:-target/release/pgtaskd}
db=${2:-pgtaskd_deps_bench}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
psql_q() { psql -q -v ON_ERROR_STOP=1 "$@"; }
export PGTASKD_DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$db"
config=$(mktemp)
trap 'rm -f "$config"; [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null || true' EXIT
printf '[worker]\nconcurrency = 8\npoll_interval = "60s"\n[log]\nlevel = "warn"\n' >"$config"

fresh() {
    psql_q -d postgres -c "DROP DATABASE IF EXISTS $db" 2>/dev/null
    psql_q -d postgres -c "CREATE DATABASE $db"
    "$bin" migrate >/dev/null
}
start() {
    "$bin" run --config "$config" >/dev/null 2>&1 &
    daemon=$!
    until [ "$(psql_q -d "$db" -Atc "SELECT count(*) FROM pgtaskd.idle_daemons")" -ge 1 ]; do
        sleep 0.1
    done
}
stop() { kill -TERM "$daemon"; wait "$daemon" || true; daemon=""; }
drained() {
    until [ "$(psql_q -d "$db" -Atc "SELECT count(*) FROM pgtaskd.task_state WHERE status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED')")" = 0 ]; do
        sleep 0.05
    done
}

# chain: inserted in one statement, each task after the one before.
fresh
start
psql_q -d "$db" -c "INSERT INTO pgtaskd.tasks (payload, depends_on)
    SELECT 'hop ' || n, CASE WHEN n > 1 THEN ARRAY[n - 1] END FROM generate_series(1, 1000) AS n"
drained
stop
psql_q -d "$db" -Atc "
    WITH hops AS (
        SELECT extract(epoch FROM c.started_at - p.finished_at) * 1000 AS ms
          FROM pgtaskd.task_view AS c JOIN pgtaskd.task_view AS p ON p.id = c.depends_on[1])
    SELECT format('chain of 1,000: %s s from the first start to the last end; hop from the parent''s end to the child''s claim p50 %s ms, p99 %s ms',
                  (SELECT round(extract(epoch FROM max(finished_at) - min(started_at))::numeric, 2) FROM pgtaskd.task_view),
                  round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
                  round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2))
      FROM hops"

# fanin: the same drain with and without one child of all 10,000.
for shape in plain fanin; do
    fresh
    psql_q -d "$db" -c "INSERT INTO pgtaskd.tasks (payload) SELECT 'task ' || n FROM generate_series(1, 10000) AS n"
    if [ "$shape" = fanin ]; then
        psql_q -d "$db" -c "INSERT INTO pgtaskd.tasks (payload, depends_on)
            SELECT 'child', array_agg(n) FROM generate_series(1, 10000) AS n"
    fi
    psql_q -d "$db" -c "VACUUM ANALYZE" -c "CHECKPOINT"
    start
    psql_q -d "$db" -c "SELECT pgtaskd.notify('pgtaskd_tasks', '')" >/dev/null
    drained
    stop
    psql_q -d "$db" -Atc "
        SELECT format('%s: 10,000 parents drained at %s tasks/s; deadlocks %s',
                      '$shape',
                      round(10000 / extract(epoch FROM max(finished_at) - min(started_at))::numeric),
                      (SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()))
          FROM pgtaskd.task_view WHERE id <= 10000"
done

# fanout: one parent of 10,000 children, finished by hand.
fresh
psql_q -d "$db" -c "INSERT INTO pgtaskd.tasks (payload) VALUES ('parent')"
psql_q -d "$db" -c "INSERT INTO pgtaskd.tasks (payload, depends_on) SELECT 'child ' || n, ARRAY[1] FROM generate_series(1, 10000) AS n"
psql_q -d "$db" -c "VACUUM ANALYZE"
token=$(psql_q -d "$db" -Atc "SELECT task_claim FROM pgtaskd.claim(ARRAY['default'], 1, 'bench', 60000, 1000000, true, 1000000, NULL, NULL) WHERE task_id = 1")
ms=$(psql_q -d "$db" -At <<SQL | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1
\timing on
SELECT count(*) FROM pgtaskd.finish(ARRAY[$token::bigint], ARRAY[1::bigint], ARRAY['SUCCEEDED'], ARRAY[1::bigint], ARRAY[1::bigint], ARRAY[1::bigint], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::float8], true);
SQL
)
psql_q -d "$db" -Atc "SELECT format('fanout: the finish of one parent of 10,000 children: %s ms; children QUEUED %s', '$ms',
    (SELECT count(*) FROM pgtaskd.task_state WHERE status = 'QUEUED'))"
