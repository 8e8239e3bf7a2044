//! Every statement `pgtaskd bench` sends, in one place: what the bench reads and writes of
//! the database (the task table, the idle flags, the server's statistics and clock) is all
//! here, as consts, grouped by the module that sends them. `LISTEN` and `NOTIFY` name their
//! channels, so [`listen`] and [`notify`] build them. Depends on nothing.

// The task table (`table.rs`).

/// Insert the texts `$2` into queue `$1`, one task each (also the soak's producer).
pub(super) const INSERT_MANY: &str =
    "INSERT INTO pgtaskd.tasks (queue, payload) SELECT $1, unnest($2::text[])";
/// Every row of queue `$1`.
pub(super) const DELETE_ROWS: &str = "DELETE FROM pgtaskd.tasks WHERE queue = $1";
/// docs/benchmark.md asks for it before each run; a role that does not own the table gets a
/// warning and nothing is done.
pub(super) const VACUUM: &str = "VACUUM (ANALYZE) pgtaskd.tasks, pgtaskd.task_state";
/// Whether queue `$1` has a QUEUED or RUNNING task: two `EXISTS` on the partial indexes.
pub(super) const BUSY: &str =
    "SELECT EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 AND status = 'QUEUED')
         OR EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 AND status = 'RUNNING')";
/// The tasks of queue `$1` a handler answered: SUCCEEDED with an output.
pub(super) const HANDLER_SUCCEEDED: &str = "SELECT count(*) FROM pgtaskd.task_view \
     WHERE queue = $1 AND status = 'SUCCEEDED' AND output IS NOT NULL";

/// The SUCCEEDED tasks of queue `$1`.
pub(super) const SUCCEEDED: &str =
    "SELECT count(*) FROM pgtaskd.task_view WHERE queue = $1 AND status = 'SUCCEEDED'";
/// The last finish of queue `$1`.
pub(super) const LAST_FINISH: &str =
    "SELECT max(finished_at) FROM pgtaskd.task_view WHERE queue = $1";
/// The server's WAL position, in bytes from the start.
pub(super) const WAL_POSITION: &str = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8";

// One run (`run.rs`).

/// The words, bytes and runes of queue `$1`'s tasks, and how many SUCCEEDED.
pub(super) const TOTALS: &str =
    "SELECT coalesce(sum(words), 0)::int8, coalesce(sum(bytes), 0)::int8,
            coalesce(sum(runes), 0)::int8, count(*) FILTER (WHERE status = 'SUCCEEDED')
       FROM pgtaskd.task_view WHERE queue = $1";

// Timing one task at a time (`timing.rs`, `producers.rs`).

/// Insert one task, text `$2`, into queue `$1`.
pub(super) const INSERT_ONE: &str = "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ($1, $2)";
/// [`INSERT_ONE`], returning the task's id.
pub(super) const INSERT_ONE_RETURNING_ID: &str =
    "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ($1, $2) RETURNING id";
/// Flag instance `$1` idle for `$2` seconds, as a daemon does, so that inserts notify.
pub(super) const FLAG_IDLE: &str = "INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
     VALUES ($1, now() + $2 * interval '1 second')
     ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at";
/// Remove instance `$1`'s idle flag.
/// Set the bench queue's limits (docs/limits.md).
pub(super) const SET_QUEUE: &str = "SELECT pgtaskd.set_queue($1, $2::text::jsonb)";

pub(super) const UNFLAG_IDLE: &str = "DELETE FROM pgtaskd.idle_daemons WHERE instance = $1";

/// `LISTEN` on each of `channels`, in one batch.
pub(super) fn listen(channels: &[&str]) -> String {
    let listens: Vec<String> = channels.iter().map(|c| format!("LISTEN {c};")).collect();
    listens.concat()
}

/// `NOTIFY` `channel`, with no payload.
pub(super) fn notify(channel: &str) -> String {
    format!("NOTIFY {channel}")
}

// Producers mode (`producers.rs`).

pub(super) const DISABLE_NOTIFY_TRIGGER: &str =
    "ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify";
pub(super) const ENABLE_NOTIFY_TRIGGER: &str =
    "ALTER TABLE pgtaskd.tasks ENABLE TRIGGER tasks_notify";

// Ceiling mode (`ceiling.rs`).

/// The ids and texts of queue `$1`, whose counts are computed before the clock starts.
pub(super) const PAYLOADS: &str = "SELECT id, payload FROM pgtaskd.tasks WHERE queue = $1";
/// The session's server backend.
pub(super) const BACKEND_PID: &str = "SELECT pg_backend_pid()";

// The daemon under test (`daemon.rs`): its sessions, by `application_name` pattern `$1`.

/// How many of its sessions are its listener, in place.
pub(super) const DAEMON_LISTENING: &str = "SELECT count(*) FROM pg_stat_activity
      WHERE application_name LIKE $1 AND query LIKE 'LISTEN%'";
/// The server backends of its sessions.
pub(super) const DAEMON_BACKENDS: &str =
    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1";

// Soak mode (`soak/`).

/// The database's clock.
pub(super) const CLOCK: &str = "SELECT clock_timestamp()";
/// The bench's sessions carry the daemon's deadlines; the soak lifts the statement timeout.
pub(super) const NO_STATEMENT_TIMEOUT: &str = "SET statement_timeout = 0";
/// ... and, for the held snapshot, the idle-in-transaction timeout.
pub(super) const NO_IDLE_IN_TRANSACTION_TIMEOUT: &str =
    "SET idle_in_transaction_session_timeout = 0";
/// [`BUSY`], and the database's clock.
pub(super) const BUSY_AND_NOW: &str =
    "SELECT EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 AND status = 'QUEUED')
         OR EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 AND status = 'RUNNING'),
            now()";
/// The QUEUED tasks of queue `$1` (the held snapshot's read).
pub(super) const QUEUED: &str =
    "SELECT count(*) FROM pgtaskd.task_view WHERE queue = $1 AND status = 'QUEUED'";
/// One sample: the clock; the QUEUED tasks at priority 0 of queue `$1` from id `$2` on, and
/// the oldest of them (from the state rows alone); the dead tuples of the task and state
/// tables, the autovacuums of the state table, and the sizes of both together (schema 36).
pub(super) const SAMPLE: &str = "SELECT clock_timestamp(), b.n, b.oldest, t.dead, t.autovacuums,
            t.heap, t.toast, t.indexes
       FROM (SELECT count(*) AS n, min(id) AS oldest FROM pgtaskd.task_state
              WHERE queue = $1 AND priority = 0 AND id >= $2 AND status = 'QUEUED') AS b,
            (SELECT sum(coalesce(s.n_dead_tup, 0))::bigint AS dead,
                    coalesce(max(s.autovacuum_count) FILTER (WHERE c.relname = 'task_state'), 0)
                        AS autovacuums,
                    sum(pg_table_size(c.oid))::bigint AS heap,
                    sum(coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0))::bigint
                        AS toast,
                    sum(pg_indexes_size(c.oid))::bigint AS indexes
               FROM pg_class AS c LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
              WHERE c.oid IN ('pgtaskd.tasks'::regclass, 'pgtaskd.task_state'::regclass)) AS t";
/// The rows of queue `$1` that finished in `[$3, $4)` (`$4` NULL: from `$3` on): the second
/// of the run (from `$2`) of the finish, the latency in ms, whether it SUCCEEDED, the counts.
pub(super) const FINISHED: &str = "SELECT extract(epoch FROM finished_at - $2)::float8,
            (extract(epoch FROM finished_at - created_at) * 1000)::float8,
            status = 'SUCCEEDED', words, bytes, runes
       FROM pgtaskd.task_view
      WHERE queue = $1 AND finished_at >= $3
        AND ($4::timestamptz IS NULL OR finished_at < $4)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_and_notify_name_their_channels_in_one_batch() {
        assert_eq!(
            listen(&["pgtaskd_tasks", "pgtaskd_bench_marker"]),
            "LISTEN pgtaskd_tasks;LISTEN pgtaskd_bench_marker;"
        );
        assert_eq!(
            notify("pgtaskd_bench_marker"),
            "NOTIFY pgtaskd_bench_marker"
        );
    }
}
