#!/usr/bin/env bash
# The storage prototype's figures (docs/storage.md, "The prototype"): today's task table
# (schema 19), the proposed layout and the simpler rowstate step, side by side, in a throwaway database.
#
#   docs/storage-prototype/run.sh            # on 127.0.0.1:5432 (trust auth), user postgres
#   PGUSER=root docs/storage-prototype/run.sh
#   TASKS=20000 BATCH=100 ROUNDS=5 docs/storage-prototype/run.sh
#
# It creates the database pgtaskd_storage_proto (dropped first if it exists, and at the end
# unless KEEP_DB=1; DB=... to name another), and for each layout, without and then with a
# snapshot held open by another session (BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;
# kept open through the drain), loads
# schema.sql, drains TASKS tasks of 1 KiB (bench.sql: insert in statements of 100 rows, claim
# and finish in batches of BATCH), ends the hold, vacuums (vacuum.sql); then times a
# 10,000-row INSERT ... SELECT in both layouts (insert_time.sql) and runs the contract checks
# (checks.sql), and lists the newest FAILED tasks (lists.sql). Needs psql and the pgstattuple extension (postgresql-contrib). WAL is read
# with pg_current_wal_insert_lsn(), which counts the whole server's: run it on a server with
# nothing else writing, or read the figures as upper bounds.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
db="${DB:-pgtaskd_storage_proto}"
tasks="${TASKS:-20000}"
batch="${BATCH:-100}"
rounds="${ROUNDS:-5}"

psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
q() { psql -X -q -d "$db" -v ON_ERROR_STOP=1 "$@"; }

holder_dir=""
start_hold() {
    holder_dir="$(mktemp -d)"
    mkfifo "$holder_dir/in"
    psql -X -q -d "$db" -v ON_ERROR_STOP=1 <"$holder_dir/in" >"$holder_dir/out" 2>&1 &
    holder_pid=$!
    exec 3>"$holder_dir/in"
    echo "SET application_name = 'storage-proto-hold'; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;" >&3
    for _ in $(seq 1 100); do
        if [ "$(q -At -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'storage-proto-hold' AND backend_xmin IS NOT NULL")" = 1 ]; then
            return
        fi
        sleep 0.1
    done
    echo "the snapshot holder did not start: $(cat "$holder_dir/out")" >&2
    exit 1
}
end_hold() {
    echo "COMMIT;" >&3
    exec 3>&-
    wait "$holder_pid"
    rm -rf "$holder_dir"
}

q -f "$here/schema.sql"
q -c "CREATE UNLOGGED TABLE public.results (layout text, hold int, metric text, value numeric, at timestamptz DEFAULT now())"
for hold in 0 1; do
    for layout in today proposed rowstate; do
        q -f "$here/schema.sql"
        [ "$hold" = 1 ] && start_hold
        q -v layout="$layout" -v hold="$hold" -v tasks="$tasks" -v per_stmt=100 -v batch="$batch" \
          -f "$here/bench.sql" >/dev/null
        [ "$hold" = 1 ] && end_hold
        q -v layout="$layout" -v hold="$hold" -f "$here/vacuum.sql"
    done
done

q -f "$here/schema.sql"
q -v rounds="$rounds" -f "$here/insert_time.sql" >/dev/null

echo "== figures (per task where it says so; hold = a snapshot held through the drain)"
q -P pager=off -c "
SELECT metric,
       round(max(value) FILTER (WHERE layout = 'today' AND hold = 0), 3) AS today,
       round(max(value) FILTER (WHERE layout = 'proposed' AND hold = 0), 3) AS proposed,
       round(max(value) FILTER (WHERE layout = 'today' AND hold = 1), 3) AS today_hold,
       round(max(value) FILTER (WHERE layout = 'proposed' AND hold = 1), 3) AS proposed_hold,
       round(max(value) FILTER (WHERE layout = 'rowstate' AND hold = 0), 3) AS rowstate,
       round(max(value) FILTER (WHERE layout = 'rowstate' AND hold = 1), 3) AS rowstate_hold
  FROM results GROUP BY metric
 ORDER BY min(at), metric"
q -P pager=off -At -c "
SELECT format('WAL per task over the INSERT''s alone: today %s, proposed %s (over today''s INSERT: %s); with the hold: today %s, proposed %s',
       round(max(value) FILTER (WHERE layout = 'today' AND hold = 0 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'today' AND hold = 0 AND metric = 'wal_insert_per_task'), 2),
       round(max(value) FILTER (WHERE layout = 'proposed' AND hold = 0 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'proposed' AND hold = 0 AND metric = 'wal_insert_per_task'), 2),
       round(max(value) FILTER (WHERE layout = 'proposed' AND hold = 0 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'today' AND hold = 0 AND metric = 'wal_insert_per_task'), 2),
       round(max(value) FILTER (WHERE layout = 'today' AND hold = 1 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'today' AND hold = 1 AND metric = 'wal_insert_per_task'), 2),
       round(max(value) FILTER (WHERE layout = 'proposed' AND hold = 1 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'proposed' AND hold = 1 AND metric = 'wal_insert_per_task'), 2))
  FROM results"
q -P pager=off -At -c "
SELECT format('rowstate: WAL per task over its INSERT''s %s, over today''s INSERT %s; with the hold %s',
       round(max(value) FILTER (WHERE layout = 'rowstate' AND hold = 0 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'rowstate' AND hold = 0 AND metric = 'wal_insert_per_task'), 2),
       round(max(value) FILTER (WHERE layout = 'rowstate' AND hold = 0 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'today' AND hold = 0 AND metric = 'wal_insert_per_task'), 2),
       round(max(value) FILTER (WHERE layout = 'rowstate' AND hold = 1 AND metric = 'wal_total_per_task')
           / max(value) FILTER (WHERE layout = 'rowstate' AND hold = 1 AND metric = 'wal_insert_per_task'), 2))
  FROM results"

echo "== where the WAL went (bytes per task by record type, no hold; pg_walinspect)"
q -P pager=off -c "
SELECT phase, record_type,
       max(bytes_per_task) FILTER (WHERE layout = 'today') AS today,
       max(bytes_per_task) FILTER (WHERE layout = 'proposed') AS proposed,
       max(bytes_per_task) FILTER (WHERE layout = 'rowstate') AS rowstate
  FROM results_wal WHERE hold = 0
 GROUP BY phase, record_type
HAVING coalesce(max(bytes_per_task), 0) >= 1
 ORDER BY min(CASE phase WHEN 'insert' THEN 1 WHEN 'claim' THEN 2 ELSE 3 END),
          coalesce(max(bytes_per_task) FILTER (WHERE layout = 'today'), 0)
          + coalesce(max(bytes_per_task) FILTER (WHERE layout = 'proposed'), 0) DESC" 2>/dev/null \
  || echo "(pg_walinspect not available)"

echo "== contract checks (proposed layout)"
q -f "$here/schema.sql"
q -P pager=off -f "$here/checks.sql"

echo "== reading one task by id after a 20,000-task drain (proposed layout)"
q -f "$here/schema.sql"
q -v layout=proposed -v hold=-1 -v tasks="$tasks" -v per_stmt=100 -v batch="$batch" -f "$here/bench.sql" >/dev/null
q -c "DELETE FROM results WHERE hold = -1"
q -P pager=off -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON)
SELECT status, words, bytes, runes, output, error FROM proposed.task_view WHERE id = $((tasks / 2))" \
  | grep -E 'Execution Time|^ +Buffers' | sed -n '1p;$p'

echo "== the newest 50 FAILED of 20,000 finished tasks, 1% FAILED (lists.sql)"
q -f "$here/schema.sql"
for layout in today proposed; do
    q -v layout="$layout" -v hold=-1 -v tasks="$tasks" -v per_stmt=100 -v batch="$batch" -f "$here/bench.sql" >/dev/null
done
q -c "DELETE FROM results WHERE hold = -1"
q -P pager=off -f "$here/lists.sql" | grep -E '^--|Execution Time|_same|^ [tf] '

[ "${KEEP_DB:-0}" = 1 ] || psql -X -q -d postgres -c "DROP DATABASE $db"
