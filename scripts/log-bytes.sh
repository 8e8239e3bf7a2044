#!/usr/bin/env bash
# Bytes and lines the daemon logs at the default level (info) for a drain of TASKS small tasks
# (100,000 by default), on a scratch database of the server that psql reaches (PGHOST, PGUSER,
# ...), dropped afterwards. Usage: scripts/log-bytes.sh [BIN] [TASKS]
set -euo pipefail
bin=${1:-target/release/pgtaskd}
tasks=${2:-100000}
db=pgtaskd_log_bytes_$$
log=$(mktemp)
createdb "$db"
trap 'dropdb --if-exists "$db"; rm -f "$log"' EXIT
export PGTASKD_DATABASE_URL="dbname=$db"
"$bin" migrate >/dev/null
psql -d "$db" -qc "INSERT INTO pgtaskd.tasks (payload)
                   SELECT 'task ' || g || ' with a few words of text' FROM generate_series(1, $tasks) g"
env -u RUST_LOG "$bin" run >"$log" 2>&1 &
daemon=$!
until [ "$(psql -d "$db" -tAc "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'")" = "$tasks" ]; do
  sleep 0.5
done
kill -TERM "$daemon"
wait "$daemon" || true
echo "log at info for a drain of $tasks tasks: $(wc -c <"$log") bytes, $(wc -l <"$log") lines"
