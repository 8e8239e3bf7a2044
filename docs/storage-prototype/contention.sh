#!/usr/bin/env bash
# Contention on claims rows (docs/storage.md, "Contention on claims rows"): a backlog of
# BACKLOG tasks of 1 KiB claimed in claims of PER_CLAIM tasks, then finished by CLIENTS
# pgbench sessions at once, each taking the BATCH oldest pending tokens that no other session
# holds, so that neighbouring batches share the claims between them (contention.sql), in
# today's layout and the proposed one. Prints the tasks finished, tasks per second, the
# finish transaction's p50 and p99, and how many of the sessions were waiting for a lock on
# average (pg_stat_activity sampled every 50 ms: in the proposed layout, a finish waiting for
# another's claims row). Same database and settings as run.sh; needs pgbench.
#
#   docs/storage-prototype/contention.sh
#   CLIENTS=8 BACKLOG=100000 PER_CLAIM=16 BATCH=50 docs/storage-prototype/contention.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
db="${DB:-pgtaskd_storage_proto}"
clients="${CLIENTS:-2 8}"
backlog="${BACKLOG:-100000}"
per_claim="${PER_CLAIM:-16}"
batch="${BATCH:-50}"

psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
q() { psql -X -q -d "$db" -v ON_ERROR_STOP=1 "$@"; }

script="$(mktemp)"
trap 'rm -f "$script"' EXIT
printf 'CALL public.finish_next(:layout, %s);\n' "$batch" >"$script"

printf '%-9s %7s %9s %10s %13s %13s %13s\n' layout clients tasks tasks/s "finish p50 ms" "finish p99 ms" "waiting, avg"
for c in $clients; do
    for layout in today proposed; do
        q -f "$here/schema.sql"
        q -c "SET client_min_messages = warning; DROP TABLE IF EXISTS public.pending, public.finished" -f "$here/contention.sql"
        for _ in $(seq 1 $((backlog / 10000))); do
            q -c "INSERT INTO $layout.tasks (payload) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 10000) AS g"
        done
        q -c "VACUUM ANALYZE" -c "CALL public.claim_all('$layout', $per_claim)"
        # Sample the lock waits of the finishers while they run: a session waiting for a
        # transactionid or tuple lock is one finish waiting for another's claims row.
        waits=0
        samples=0
        pgbench -n -c "$c" -j 2 -t $((backlog / batch / c + 1)) -D layout="'$layout'" -f "$script" "$db" >/dev/null &
        bench=$!
        while kill -0 "$bench" 2>/dev/null; do
            w=$(q -At -c "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            waits=$((waits + w))
            samples=$((samples + 1))
            sleep 0.05
        done
        wait "$bench"
        q -At -F ' ' -c "
SELECT '$layout', $c, sum(n),
       round(sum(n) / extract(epoch FROM max(started + seconds * interval '1 s') - min(started))),
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) * 1000)::numeric, 1),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) * 1000)::numeric, 1),
       round($waits::numeric / greatest($samples, 1), 2)
  FROM public.finished WHERE n > 0" | xargs printf '%-9s %7s %9s %10s %13s %13s %13s\n'
    done
done

[ "${KEEP_DB:-0}" = 1 ] || psql -X -q -d postgres -c "DROP DATABASE $db"
