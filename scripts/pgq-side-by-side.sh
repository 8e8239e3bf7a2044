#!/usr/bin/env bash
# PgQ and pgtaskd side by side in one run (docs/performance.md, "A held snapshot beside
# PgQ"): on one throwaway cluster (scripts/bench-cluster.sh), `pgtaskd bench --mode soak`
# at RATE tasks a second for DURATION, holding a REPEATABLE READ snapshot for HOLD in the
# middle, while scripts/pgq-soak.sh runs PgQ at the same rate on the same database, so that
# the one held snapshot meets both queues. The bench prints pgtaskd's figures, the `pgq:`
# lines PgQ's.
#
#   scripts/pgq-side-by-side.sh [RATE [DURATION [HOLD]]]     defaults: 800 7m 3m
#
# Needs a release build (cargo build --release), the server binaries and pgbench (Debian's
# postgresql package), and PgQ (postgresql-15-pgq3 and pgqd). As root, the server runs as
# the postgres user.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rate=${1:-800}
duration=${2:-7m}
hold=${3:-3m}
seconds() {
  case $1 in
    *m) echo $(( ${1%m} * 60 )) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
  esac
}
export PGQ_RATE=$rate PGQ_DURATION=$(seconds "$duration") PGQ_REPORT=30
PGTASKD_BENCH_BESIDE="$here/pgq-soak.sh" exec "$here/bench-cluster.sh" --mode soak \
  --rate "$rate" --duration "$duration" --hold-snapshot "$hold" --report-every 30s
