#!/usr/bin/env bash
# PgQ's half of scripts/pgq-side-by-side.sh: a steady producer, one consumer and the pgqd
# ticker on the database PGHOST/PGPORT/PGUSER/PGDATABASE name, run beside `pgtaskd bench
# --mode soak` (through bench-cluster.sh's PGTASKD_BENCH_BESIDE), so that both queues meet the
# same held snapshot on the same server at the same time. Prints, as `pgq:` lines, the
# consumed events per second, their latency (insert to consume) and the dead tuples and size
# of PgQ's tables every PGQ_REPORT seconds, then the same before, during and from 60 s after
# the hold.
#
#   PGQ_RATE       events inserted per second (default 800), by pgbench -R, 4 clients
#   PGQ_DURATION   seconds the producer runs (default 420)
#   PGQ_REPORT     seconds per period (default 30)
#
# PgQ runs as it ships: pgqd's default ticker period (1 s) and the queue's default tick
# thresholds, one consumer reading each batch's events with pgq.get_batch_events. A session
# counts as holding the snapshot while another client transaction of the database has been
# open for more than 2 s and waits idle in it (the bench's hold is the only one). Needs Debian's
# postgresql-15-pgq3 and pgqd packages, and pgbench (the postgresql package).
set -euo pipefail
rate=${PGQ_RATE:-800}
duration=${PGQ_DURATION:-420}
report=${PGQ_REPORT:-30}
psql=${PGPSQL:-psql}
pgbench=$(dirname "$(command -v "$psql")")/pgbench
[ -x "$pgbench" ] || pgbench=$(command -v pgbench || true)
[ -n "$pgbench" ] || { echo "pgq: no pgbench: apt-get install postgresql" >&2; exit 1; }
command -v pgqd >/dev/null || { echo "pgq: no pgqd: apt-get install pgqd" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/pgq-soak-XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
q() { "$psql" -qXAt -v ON_ERROR_STOP=1 "$@"; }

if ! q -c "CREATE EXTENSION IF NOT EXISTS pgq" 2>"$tmp/err"; then
  echo "pgq: no PgQ extension ($(cat "$tmp/err")): apt-get install postgresql-15-pgq3" >&2
  exit 1
fi
q -o /dev/null <<'SQL'
SELECT pgq.create_queue('bench');
SELECT pgq.register_consumer('bench', 'bench');
CREATE SCHEMA pgq_bench;
CREATE UNLOGGED TABLE pgq_bench.consumed (at timestamptz NOT NULL, ms float8 NOT NULL);
CREATE UNLOGGED TABLE pgq_bench.samples (
    at timestamptz NOT NULL, held boolean NOT NULL, dead bigint NOT NULL, bytes bigint NOT NULL);
CREATE TABLE pgq_bench.control (done boolean NOT NULL, stopped boolean NOT NULL);
INSERT INTO pgq_bench.control VALUES (false, false);

-- One consumer: each batch's events read, their latency kept, the batch finished, committed.
-- Ends 10 s after the producer's end without a batch (the last tick comes within 3 s).
CREATE PROCEDURE pgq_bench.consume() LANGUAGE plpgsql AS $$
DECLARE
    batch bigint;
    idle  timestamptz;
BEGIN
    LOOP
        batch := pgq.next_batch('bench', 'bench');
        IF batch IS NOT NULL THEN
            INSERT INTO pgq_bench.consumed (at, ms)
            SELECT clock_timestamp(), extract(epoch FROM clock_timestamp() - e.ev_time) * 1000
              FROM pgq.get_batch_events(batch) AS e;
            PERFORM pgq.finish_batch(batch);
            idle := NULL;
        ELSIF (SELECT c.done FROM pgq_bench.control AS c) THEN
            idle := coalesce(idle, clock_timestamp());
            EXIT WHEN clock_timestamp() - idle > interval '10 s';
        END IF;
        COMMIT;
        IF batch IS NULL THEN
            PERFORM pg_sleep(0.05);
            COMMIT;
        END IF;
    END LOOP;
END
$$;

-- Every second: whether a snapshot is held, and PgQ's tables' dead tuples and size.
CREATE PROCEDURE pgq_bench.sample() LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        INSERT INTO pgq_bench.samples (at, held, dead, bytes)
        SELECT clock_timestamp(),
               EXISTS (SELECT 1 FROM pg_stat_activity AS a
                        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                          AND a.backend_type = 'client backend'
                          AND a.state = 'idle in transaction'
                          AND a.xact_start < clock_timestamp() - interval '2 s'),
               (SELECT coalesce(sum(s.n_dead_tup), 0) FROM pg_stat_user_tables AS s
                 WHERE s.schemaname = 'pgq'),
               (SELECT coalesce(sum(pg_total_relation_size(s.relid)), 0)
                  FROM pg_stat_user_tables AS s WHERE s.schemaname = 'pgq');
        EXIT WHEN (SELECT c.stopped FROM pgq_bench.control AS c);
        COMMIT;
        PERFORM pg_sleep(1);
        COMMIT;
    END LOOP;
END
$$;
SQL

cat >"$tmp/pgqd.ini" <<EOF
[pgqd]
base_connstr = host=$PGHOST port=$PGPORT user=$PGUSER
initial_database = $PGDATABASE
database_list = $PGDATABASE
logfile = $tmp/pgqd.log
pidfile = $tmp/pgqd.pid
EOF
pgqd -q "$tmp/pgqd.ini" &
pids+=($!)
q -c "CALL pgq_bench.sample()" &
sampler=$!
pids+=($sampler)
q -c "CALL pgq_bench.consume()" &
consumer=$!
pids+=($consumer)

echo "SELECT pgq.insert_event('bench', 'task', repeat('pgq soak ', 12));" >"$tmp/insert.sql"
"$pgbench" -n -c 4 -j 2 -R "$rate" -T "$duration" -f "$tmp/insert.sql" >"$tmp/pgbench.out" 2>&1 \
  || { cat "$tmp/pgbench.out" >&2; exit 1; }
q -c "UPDATE pgq_bench.control SET done = true"
wait "$consumer"
q -c "UPDATE pgq_bench.control SET stopped = true"
wait "$sampler"
produced=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$tmp/pgbench.out")

q -v produced="$produced" -v report="$report" -v duration="$duration" <<'SQL'
\pset fieldsep ' '
WITH t AS (SELECT min(at) AS t0 FROM pgq_bench.samples)
SELECT 'pgq: produced ' || :produced || ', consumed ' || count(*)
       || ', lost ' || (:produced - count(*))
  FROM pgq_bench.consumed;
WITH t AS (SELECT min(at) AS t0 FROM pgq_bench.samples),
     c AS (SELECT floor(extract(epoch FROM c.at - t.t0) / :report)::int AS p, c.ms
             FROM pgq_bench.consumed AS c, t),
     s AS (SELECT floor(extract(epoch FROM s.at - t.t0) / :report)::int AS p, s.*
             FROM pgq_bench.samples AS s, t
            -- Whole periods while the producer ran.
            WHERE s.at < t.t0 + floor(:duration / :report) * :report * interval '1 s')
SELECT format('pgq: %5s s  %7s events/s  p50 %6s ms  p99 %6s ms  dead %7s  size %5s MB%s',
              s.p * :report, round(count(c.ms)::numeric / :report, 1),
              round(percentile_cont(0.5) WITHIN GROUP (ORDER BY c.ms)::numeric, 1),
              round(percentile_cont(0.99) WITHIN GROUP (ORDER BY c.ms)::numeric, 1),
              max(s.dead), round(max(s.bytes) / 1048576.0, 1),
              CASE WHEN bool_or(s.held) THEN '  (snapshot held)' ELSE '' END)
  FROM (SELECT p, max(dead) AS dead, max(bytes) AS bytes, bool_or(held) AS held
          FROM s GROUP BY p) AS s
  LEFT JOIN c USING (p)
 GROUP BY s.p ORDER BY s.p;
-- Before, during and from 60 s after the hold, while the producer ran.
WITH t AS (SELECT min(at) AS t0, min(at) + :duration * interval '1 s' AS t1
             FROM pgq_bench.samples),
     h AS (SELECT min(at) - interval '2 s' AS h0, max(at) AS h1
             FROM pgq_bench.samples WHERE held),
     phases AS (
         SELECT 'before the hold' AS phase, 1 AS n, t.t0 AS a, h.h0 AS b FROM t, h
         UNION ALL SELECT 'during the hold', 2, h.h0, h.h1 FROM h
         UNION ALL SELECT 'from 60 s after', 3, h.h1 + interval '60 s', t.t1 FROM t, h)
SELECT format('pgq: %-16s %7s events/s  p50 %6s ms  p99 %6s ms  dead tuples at its end %s',
              p.phase,
              round(count(c.ms) / nullif(extract(epoch FROM p.b - p.a), 0)::numeric, 1),
              round(percentile_cont(0.5) WITHIN GROUP (ORDER BY c.ms)::numeric, 1),
              round(percentile_cont(0.99) WITHIN GROUP (ORDER BY c.ms)::numeric, 1),
              (SELECT s.dead FROM pgq_bench.samples AS s WHERE s.at <= p.b
                ORDER BY s.at DESC LIMIT 1))
  FROM phases AS p
  LEFT JOIN pgq_bench.consumed AS c ON c.at >= p.a AND c.at < p.b
 WHERE p.a IS NOT NULL AND p.b > p.a
 GROUP BY p.phase, p.n, p.a, p.b ORDER BY p.n;
SQL
