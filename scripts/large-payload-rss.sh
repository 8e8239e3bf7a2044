#!/usr/bin/env bash
# Peak RSS of one daemon draining large payloads: N payloads of SIZE_MIB MiB each, then SMALL
# small tasks behind them. Prints the daemon's peak RSS (VmHWM) next to the bound the design
# promises: 1.25 x (worker.max_inflight_bytes + the largest payload) + 50 MiB.
#
#   scripts/large-payload-rss.sh N SIZE_MIB [SMALL] [BUDGET]
#   e.g. scripts/large-payload-rss.sh 16 200 200 256MiB
#
# Needs a release build (cargo build --release) and a PostgreSQL reachable as psql would
# reach it (PG* variables); it creates and drops a database of its own.
set -euo pipefail
n=${1:?N}; size_mib=${2:?SIZE_MIB}; small=${3:-200}; budget=${4:-256MiB}
bin=${PGTASKD_BIN:-$(dirname "$0")/../target/release/pgtaskd}
db=pgtaskd_rss_$$
psql -qX -d postgres -c "CREATE DATABASE $db" >/dev/null
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null; rm -f "$config"' EXIT
url="dbname=$db"
[ -n "${PGHOST:-}" ] && url="$url host=$PGHOST"
PGTASKD_DATABASE_URL=$url "$bin" migrate >/dev/null
# 'abcd ' repeated compresses well in the table; the daemon still receives every byte.
words=$(( size_mib * 1024 * 1024 / 5 ))
psql -qX -d "$db" -c "INSERT INTO pgtaskd.tasks (payload) SELECT repeat('abcd ', $words) FROM generate_series(1, $n)" \
  -c "INSERT INTO pgtaskd.tasks (payload) SELECT 'small ' || i FROM generate_series(1, $small) i"
config=$(mktemp)
printf '[worker]\nconcurrency = 8\nmax_inflight_bytes = "%s"\n[log]\nlevel = "warn"\n' "$budget" > "$config"
start=$(date +%s.%N)
PGTASKD_DATABASE_URL=$url "$bin" run --config "$config" 2>/dev/null &
pid=$!
total=$(( n + small ))
held_small_max=0
while :; do
  done_n=$(psql -qXtA -d "$db" -c "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'")
  # Small tasks RUNNING while some large one is still QUEUED: held by a daemon that could not
  # start them yet. (Sizes come from octet_length, which does not load a large text.)
  held=$(psql -qXtA -d "$db" -c "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING' AND octet_length(payload) < 100
    AND EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE status = 'QUEUED' AND octet_length(payload) >= 100)")
  [ "$held" -gt "$held_small_max" ] && held_small_max=$held
  [ "$done_n" -ge "$total" ] && break
  kill -0 "$pid" || { echo "daemon died"; exit 1; }
  sleep 0.2
done
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
hwm_kib=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
kill -TERM "$pid"; wait "$pid" || true
budget_mib=$(psql -qXtA -d postgres -c "SELECT pg_size_bytes('${budget//iB/B}') / 1048576")
bound=$(echo "1.25 * ($budget_mib + $size_mib) + 50" | bc)
checked=$(psql -qXtA -d "$db" -c "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED' AND (octet_length(payload) < 100 OR words = $words)")
echo "payloads: $n x $size_mib MiB + $small small; budget $budget; drained in ${elapsed}s; counts checked on $checked of $total"
echo "peak RSS: $(( hwm_kib / 1024 )) MiB; bound 1.25 x (budget + largest) + 50 MiB = $bound MiB"
echo "most small tasks RUNNING while a large one waited: $held_small_max"
