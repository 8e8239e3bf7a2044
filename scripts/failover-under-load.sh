#!/usr/bin/env bash
# The failover under load, as an operator meets it: a primary and a synchronous standby copied
# after `synchronous_standby_names` was set (so the promoted standby keeps it), two daemons
# (concurrency 4, lease 5s, poll 1s) on a host list, 20,000 small tasks, the primary stopped
# with `pg_ctl -m immediate` once 3,000 have SUCCEEDED, the standby promoted. Prints the time
# from the promotion to the last task SUCCEEDED. Needs root (the clusters run as postgres) and
# PostgreSQL's server binaries. Usage: scripts/failover-under-load.sh [BIN]
set -u
bin=$(realpath "${1:-target/release/pgtaskd}")
pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)
dir=$(mktemp -d /tmp/pgtaskd-failover.XXXX)
chown postgres "$dir"
p1=$((20000 + RANDOM % 10000)); p2=$((p1 + 1))
as_pg() { runuser -u postgres -- "$@"; }
sql() { psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -qtAc "$2"; }
cleanup() {
  kill -TERM "${daemons[@]}" 2>/dev/null; wait 2>/dev/null
  as_pg "$pgbin/pg_ctl" -D "$dir/s" -m immediate stop >/dev/null 2>&1
  as_pg "$pgbin/pg_ctl" -D "$dir/p" -m immediate stop >/dev/null 2>&1
  rm -rf "$dir"
}
daemons=()
trap cleanup EXIT
as_pg "$pgbin/initdb" -D "$dir/p" -U postgres -A trust >/dev/null
cat >>"$dir/p/postgresql.conf" <<CONF
port = $p1
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 4
wal_keep_size = 256MB
CONF
echo "host replication all 127.0.0.1/32 trust" >>"$dir/p/pg_hba.conf"
as_pg "$pgbin/pg_ctl" -D "$dir/p" -l "$dir/p.log" -w start >/dev/null
sql "$p1" "ALTER SYSTEM SET synchronous_standby_names = '*'" >/dev/null
sql "$p1" "SELECT pg_reload_conf()" >/dev/null
as_pg "$pgbin/pg_basebackup" -h 127.0.0.1 -p "$p1" -U postgres -D "$dir/s" -R -X stream --checkpoint=fast >/dev/null
sed -i "s/^port = $p1/port = $p2/" "$dir/s/postgresql.conf"
as_pg "$pgbin/pg_ctl" -D "$dir/s" -l "$dir/s.log" -w start >/dev/null
export PGTASKD_DATABASE_URL="postgresql://postgres@127.0.0.1:$p1,127.0.0.1:$p2/postgres?target_session_attrs=read-write&connect_timeout=2"
"$bin" migrate >/dev/null
sql "$p1" "INSERT INTO pgtaskd.tasks (payload)
           SELECT 'task number ' || g || ' has a few words' FROM generate_series(1, 20000) g"
printf '[worker]\nconcurrency = 4\npoll_interval = "1s"\nlease = "5s"\n' >"$dir/pgtaskd.toml"
for i in 1 2; do
  RUST_LOG=pgtaskd=info "$bin" run --config "$dir/pgtaskd.toml" >"$dir/daemon$i.log" 2>&1 &
  daemons+=($!)
done
until [ "$(sql "$p1" "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'")" -ge 3000 ]; do :; done
as_pg "$pgbin/pg_ctl" -D "$dir/p" -m immediate stop >/dev/null
as_pg "$pgbin/pg_ctl" -D "$dir/s" -w promote >/dev/null
start=$(date +%s.%N)
for _ in $(seq 1 240); do
  counts=$(sql "$p2" "SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'), count(*) FILTER (WHERE status = 'QUEUED'),
                             count(*) FILTER (WHERE status = 'RUNNING') FROM pgtaskd.task_view")
  [ "${counts%%|*}" = 20000 ] && break
  sleep 0.2
done
echo "after $(echo "$(date +%s.%N) - $start" | bc) s: succeeded|queued|running = $counts"
