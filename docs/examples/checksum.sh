#!/bin/sh
# A pgtaskd `exec` handler in shell: the payload (any bytes) arrives on stdin; the answer,
# written to stdout, is {"bytes": N, "sha256": "..."}. What goes to stderr is for people:
# its last 4 KiB become the task's error if the attempt fails.
#
#   exit 0    done: stdout is the task's output (valid UTF-8, at most max_output bytes)
#   exit 65   the payload is bad (here: empty): the task FAILS at once, no retry
#   other     the attempt failed: retried after the queue's backoff while attempts remain
#
# [queues.checksums]
# handler = "exec"
# command = ["/usr/local/lib/pgtaskd/checksum.sh"]
set -eu

echo "task $PGTASKD_TASK_ID, attempt $PGTASKD_ATTEMPT, queue $PGTASKD_QUEUE" >&2

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
# A timeout or a cancel sends SIGTERM: end now, through the EXIT trap's clean-up.
trap 'exit 143' TERM

cat > "$tmp"
bytes=$(wc -c < "$tmp" | tr -d ' ')
if [ "$bytes" -eq 0 ]; then
    echo "the payload is empty: nothing to checksum" >&2
    exit 65
fi
sha256=$(sha256sum < "$tmp" | cut -d ' ' -f 1)
printf '{"bytes": %s, "sha256": "%s"}\n' "$bytes" "$sha256"
