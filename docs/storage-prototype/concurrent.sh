#!/usr/bin/env bash
# Concurrent drains of the storage prototype (docs/storage.md, "The prototype"): a backlog of
# BACKLOG tasks of 1 KiB, drained for at most SECONDS_RUN seconds by CLIENTS pgbench sessions,
# each repeating one cycle (concurrent.sql: claim BATCH tasks, commit, finish them, commit),
# in both layouts, without and with a snapshot held open from before the backlog was inserted.
# Each combination runs twice: claims always from the start of the queue, and claims after a
# position (POSITIONS=0 or 1 to run one of them only). Prints the tasks drained, tasks per second
# (first cycle's start to last cycle's end) and the cycle's p50 and p99. Same database and
# settings as run.sh (KEEP_DB=1 keeps the database); needs pgbench.
#
#   docs/storage-prototype/concurrent.sh
#   CLIENTS=8 SECONDS_RUN=15 BACKLOG=150000 BATCH=50 docs/storage-prototype/concurrent.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
db="${DB:-pgtaskd_storage_proto}"
clients="${CLIENTS:-8}"
seconds="${SECONDS_RUN:-15}"
backlog="${BACKLOG:-150000}"
positions="${POSITIONS:-0 1}"
batch="${BATCH:-50}"

psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
q() { psql -X -q -d "$db" -v ON_ERROR_STOP=1 "$@"; }

holder_pid=""
start_hold() {
    holder_dir="$(mktemp -d)"
    mkfifo "$holder_dir/in"
    psql -X -q -d "$db" <"$holder_dir/in" >"$holder_dir/out" 2>&1 &
    holder_pid=$!
    exec 3>"$holder_dir/in"
    echo "SET application_name = 'storage-proto-hold'; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;" >&3
    for _ in $(seq 1 100); do
        [ "$(q -At -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'storage-proto-hold' AND backend_xmin IS NOT NULL")" = 1 ] && return
        sleep 0.1
    done
    echo "the snapshot holder did not start" >&2
    exit 1
}
end_hold() {
    echo "COMMIT;" >&3
    exec 3>&-
    wait "$holder_pid"
    rm -rf "$holder_dir"
}

script="$(mktemp)"
trap 'rm -f "$script"' EXIT
printf 'CALL public.drain_cycle(:layout, %s, :positioned);\n' "$batch" >"$script"

printf '%-10s %-9s %-5s %9s %10s %12s %12s\n' claims layout hold tasks tasks/s "cycle p50 ms" "cycle p99 ms"
for positioned in $positions; do
for hold in 0 1; do
    for layout in today proposed; do
        q -f "$here/schema.sql"
        q -f "$here/concurrent.sql"
        q -c "SET client_min_messages = warning; DROP TABLE IF EXISTS public.drained; CREATE UNLOGGED TABLE public.drained (n bigint, started timestamptz, seconds float8)"
        [ "$hold" = 1 ] && start_hold
        for _ in $(seq 1 $((backlog / 10000))); do
            q -c "INSERT INTO $layout.tasks (payload) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 10000) AS g"
        done
        pgbench -n -c "$clients" -j 2 -T "$seconds" -D layout="'$layout'" -D positioned="$([ "$positioned" = 1 ] && echo true || echo false)" -f "$script" "$db" \
            >/dev/null
        [ "$hold" = 1 ] && end_hold
        # The rate over the cycles that claimed something, from the first start to the last end
        # (the backlog may run out before SECONDS); the cycle's time is claim + finish.
        q -At -F ' ' -c "
SELECT CASE WHEN $positioned = 1 THEN 'position' ELSE 'start' END, '$layout', $hold, sum(n),
       round(sum(n) / extract(epoch FROM max(started + seconds * interval '1 s') - min(started))),
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) * 1000)::numeric, 1),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) * 1000)::numeric, 1)
  FROM public.drained WHERE n > 0" | xargs printf '%-10s %-9s %-5s %9s %10s %12s %12s\n'
    done
done
done

[ "${KEEP_DB:-0}" = 1 ] || psql -X -q -d postgres -c "DROP DATABASE $db"
