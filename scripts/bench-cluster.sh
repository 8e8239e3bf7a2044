#!/usr/bin/env bash
# Run `pgtaskd bench` against a throwaway PostgreSQL cluster with the server's own defaults
# (autovacuum on, 128 MiB shared_buffers, synchronous commit), not against whatever server the
# environment names. The soak's figures depend on autovacuum above all: on a server that has it
# off, only the daemon's own vacuum cleans the table (docs/design.md, "Vacuum"), and the
# table's schema-8 parameters mean nothing.
#
#   scripts/bench-cluster.sh --mode soak --duration 10m --hold-snapshot 2m
#   scripts/bench-cluster.sh --mode soak --rate 5000 --duration 5m --report-every 30s
#   PGTASKD_BENCH_SETTINGS="-c autovacuum=off" scripts/bench-cluster.sh --mode soak ...
#
# Every argument goes to `pgtaskd bench`. The cluster is made with initdb in a fresh directory
# under ${TMPDIR:-/var/tmp} (a soak of 10 minutes writes a few GiB there), listens only on a
# Unix socket in that directory (mode 0700: no other local user can reach it; port number
# PGTASKD_BENCH_PORT, default 5499, names the socket), is migrated, and is stopped and
# removed when the bench ends, on Ctrl-C and on SIGTERM too. Extra server settings:
# PGTASKD_BENCH_SETTINGS, as postgres options ("-c name=value ..."). Needs the server
# binaries (initdb, pg_ctl, psql: Debian's postgresql package) and a release build (cargo
# build --release). As root, the server runs as the postgres user.
#
# PGTASKD_BENCH_BESIDE: a command run beside the bench, on the same cluster and database (its
# PGHOST, PGPORT, PGUSER and PGDATABASE set), started as the bench starts and waited for after
# it: a second workload under the same conditions, as scripts/pgq-side-by-side.sh runs PgQ.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${PGTASKD_BIN:-$here/../target/release/pgtaskd}
port=${PGTASKD_BENCH_PORT:-5499}
settings=${PGTASKD_BENCH_SETTINGS:-}
[ -x "$bin" ] || { echo "no $bin: run cargo build --release first" >&2; exit 1; }
if command -v initdb >/dev/null 2>&1; then
  pgbin=$(dirname "$(command -v initdb)")
else
  pgbin=$( (ls -d /usr/lib/postgresql/*/bin 2>/dev/null || true) | sort -V | tail -n 1)
fi
[ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] || { echo "no initdb: install PostgreSQL's server binaries (Debian: apt-get install postgresql)" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/var/tmp}/pgtaskd-bench-XXXXXX")
chmod 0700 "$dir"
as_server=()
if [ "$(id -u)" = 0 ]; then
  chown postgres "$dir"
  as_server=(runuser -u postgres --)
fi
bench_pid=
beside_pid=
cleanup() {
  for pid in "$bench_pid" "$beside_pid"; do
    if [ -n "$pid" ]; then
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  (cd / && "${as_server[@]}" "$pgbin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1) || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

(cd / && "${as_server[@]}" "$pgbin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >/dev/null)
(cd / && "${as_server[@]}" "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
  -o "-p $port -c listen_addresses='' -k '$dir' $settings" start >/dev/null)
url="host=$dir port=$port user=postgres dbname=postgres sslmode=disable"
unset PGTASKD_CONFIG PGTASKD_DATABASE_URL
psql=$pgbin/psql
[ -x "$psql" ] || psql=psql
"$psql" -qX "$url" -Atc "SELECT 'cluster: PostgreSQL ' || current_setting('server_version')
  || ', autovacuum ' || current_setting('autovacuum')
  || ', shared_buffers ' || current_setting('shared_buffers')
  || ', synchronous_commit ' || current_setting('synchronous_commit')" >&2
"$bin" migrate --database-url "$url" >/dev/null
# In the background, so that a signal to this script is handled at once (bash runs a trap
# only once its foreground command has returned), and the cleanup stops the bench first.
if [ -n "${PGTASKD_BENCH_BESIDE:-}" ]; then
  PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres PGPSQL=$psql \
    bash -c "$PGTASKD_BENCH_BESIDE" &
  beside_pid=$!
fi
"$bin" bench --database-url "$url" "$@" &
bench_pid=$!
status=0
wait "$bench_pid" || status=$?
bench_pid=
if [ -n "$beside_pid" ]; then
  wait "$beside_pid" || status=$?
  beside_pid=
fi
exit "$status"
