//! Per-queue figures for `pgtaskd stats` (and `/metrics`, the dashboard's JSON), in one
//! statement whose every part is bounded by an index, never a count of all finished rows:
//!
//! - QUEUED, due now and the age of the oldest due task: the partial index of QUEUED rows
//!   (`tasks_claim_idx`), so the cost follows the backlog;
//! - RUNNING: the partial index of RUNNING rows (`tasks_lease_idx`);
//! - WAITING (a parent has not ended, schema 37): the partial index of WAITING rows
//!   (`tasks_waiting_idx`);
//! - finished in the last minute and hour, by status: a range of `tasks_finished_idx` (on
//!   `finished_at`) reaching one hour back, so the cost follows the last hour's throughput;
//! - paused: `pgtaskd.paused_queues`;
//! - the settings: `pgtaskd.queue_settings` (docs/limits.md), one row per limited queue;
//! - served: whether a live daemon of `pgtaskd.daemons` lists the queue (`queue::daemons`); a
//!   queue with due tasks that none serves is unserved: its tasks wait until one does;
//! - the daemons connected: the sessions of `pg_stat_activity` named `pgtaskd/<instance>`
//!   (every daemon session carries its instance id; the one-shot commands are `pgtaskd/cli`).
//!
//! [`backlog`] is the part `/metrics` reads at every scrape: the WAITING, QUEUED and RUNNING
//! figures, the pauses and whether a daemon serves each, without the finished rows.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::settings::{limits_columns, Limits};
use crate::db::DbError;

/// Tasks that ended in a window, by how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Finished {
    pub succeeded: i64,
    pub failed: i64,
    pub canceled: i64,
}

/// The figures of one queue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueStats {
    pub queue: String,
    pub paused: bool,
    pub paused_at: Option<DateTime<Utc>>,
    /// WAITING tasks: a parent of each has not ended.
    pub waiting: i64,
    /// QUEUED tasks, due or not.
    pub queued: i64,
    /// QUEUED tasks whose `run_at` has come.
    pub due: i64,
    /// Seconds the oldest due task has waited since it became due; `None` when none is due.
    pub oldest_due_age_s: Option<f64>,
    pub running: i64,
    /// A live daemon (`pgtaskd daemons`) serves the queue.
    pub served: bool,
    /// Due tasks, and no live daemon serves the queue: they wait until one does.
    pub unserved: bool,
    pub finished_last_minute: Finished,
    pub finished_last_hour: Finished,
    /// Its limits and defaults (`pgtaskd queue show`); each null when unset.
    pub settings: Limits,
}

/// One daemon connected to the database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Daemon {
    /// Its instance id (`host:pid:random`), as it logs it.
    pub instance: String,
    /// Its sessions: the pool's open connections and the LISTEN connection.
    pub sessions: i64,
}

/// What `pgtaskd stats` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Every queue with a WAITING, QUEUED or RUNNING task, a task finished in the last hour, a
    /// pause, or settings.
    pub queues: Vec<QueueStats>,
    pub daemons: Vec<Daemon>,
}

/// The part of the statistics statements that reads the partial indexes of QUEUED and
/// RUNNING rows, per queue: the CTEs `queued` (queued, due, oldest_due), `running` and
/// `waiting`. Counts that need only the state read `pgtaskd.task_state` itself (schema 36):
/// through the view, each row would also read its task row.
macro_rules! queued_and_running {
    () => {
        "
WITH queued AS (
    SELECT queue,
           count(*) AS queued,
           count(*) FILTER (WHERE run_at <= now()) AS due,
           min(greatest(created_at, run_at)) FILTER (WHERE run_at <= now()) AS oldest_due
      FROM pgtaskd.task_view
     WHERE status = 'QUEUED'
     GROUP BY queue
), running AS (
    SELECT queue, count(*) AS running
      FROM pgtaskd.task_state
     WHERE status = 'RUNNING'
     GROUP BY queue
), waiting AS (
    SELECT queue, count(*) AS waiting
      FROM pgtaskd.task_state
     WHERE status = 'WAITING'
     GROUP BY queue
)"
    };
}

/// The column `served` of the statistics statements: a live daemon lists the queue `n.queue`.
macro_rules! served {
    () => {
        concat!(
            "EXISTS (SELECT 1 FROM pgtaskd.daemons AS d WHERE n.queue = ANY (d.queues) AND ",
            crate::queue::daemons::live!(),
            ") AS served"
        )
    };
}

const QUEUES: &str = concat!(
    queued_and_running!(),
    ", finished AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'SUCCEEDED' AND finished_at >= now() - interval '1 minute') AS s_m,
           count(*) FILTER (WHERE status = 'FAILED' AND finished_at >= now() - interval '1 minute') AS f_m,
           count(*) FILTER (WHERE status = 'CANCELED' AND finished_at >= now() - interval '1 minute') AS c_m,
           count(*) FILTER (WHERE status = 'SUCCEEDED') AS s_h,
           count(*) FILTER (WHERE status = 'FAILED') AS f_h,
           count(*) FILTER (WHERE status = 'CANCELED') AS c_h
      FROM pgtaskd.task_state
     WHERE finished_at >= now() - interval '1 hour'
     GROUP BY queue
), names AS (
    SELECT queue FROM queued
    UNION SELECT queue FROM running
    UNION SELECT queue FROM waiting
    UNION SELECT queue FROM finished
    UNION SELECT queue FROM pgtaskd.paused_queues
    UNION SELECT queue FROM pgtaskd.queue_settings
)
SELECT n.queue,
       p.paused_at,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(q.queued, 0) AS queued,
       coalesce(q.due, 0) AS due,
       extract(epoch FROM now() - q.oldest_due)::float8 AS oldest_due_age_s,
       coalesce(r.running, 0) AS running,
       coalesce(f.s_m, 0) AS s_m, coalesce(f.f_m, 0) AS f_m, coalesce(f.c_m, 0) AS c_m,
       coalesce(f.s_h, 0) AS s_h, coalesce(f.f_h, 0) AS f_h, coalesce(f.c_h, 0) AS c_h,
       ", limits_columns!("s"), ",
       ", served!(), "
  FROM names AS n
  LEFT JOIN queued AS q USING (queue)
  LEFT JOIN running AS r USING (queue)
  LEFT JOIN waiting AS w USING (queue)
  LEFT JOIN finished AS f USING (queue)
  LEFT JOIN pgtaskd.paused_queues AS p USING (queue)
  LEFT JOIN pgtaskd.queue_settings AS s USING (queue)
 ORDER BY n.queue"
);

const DAEMONS: &str = "
SELECT substr(application_name, 9) AS instance, count(*) AS sessions
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name LIKE 'pgtaskd/%'
   AND application_name <> 'pgtaskd/cli'
 GROUP BY application_name
 ORDER BY application_name";

/// The figures of one queue that `/metrics` shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    pub queue: String,
    pub paused: bool,
    pub waiting: i64,
    pub queued: i64,
    pub due: i64,
    pub oldest_due_age_s: Option<f64>,
    pub running: i64,
    /// A live daemon serves the queue.
    pub served: bool,
}

impl Backlog {
    /// Due tasks, and no live daemon serves the queue.
    pub fn unserved(&self) -> bool {
        self.due > 0 && !self.served
    }
}

const BACKLOG: &str = concat!(
    queued_and_running!(),
    ", names AS (
    SELECT queue FROM queued
    UNION SELECT queue FROM running
    UNION SELECT queue FROM waiting
    UNION SELECT queue FROM pgtaskd.paused_queues
)
SELECT n.queue,
       p.queue IS NOT NULL AS paused,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(q.queued, 0) AS queued,
       coalesce(q.due, 0) AS due,
       extract(epoch FROM now() - q.oldest_due)::float8 AS oldest_due_age_s,
       coalesce(r.running, 0) AS running,
       ",
    served!(),
    "
  FROM names AS n
  LEFT JOIN queued AS q USING (queue)
  LEFT JOIN running AS r USING (queue)
  LEFT JOIN waiting AS w USING (queue)
  LEFT JOIN pgtaskd.paused_queues AS p USING (queue)
 ORDER BY n.queue"
);

/// Every queue with a WAITING, QUEUED or RUNNING task or a pause: its backlog, from the
/// partial indexes only.
///
/// # Errors
///
/// Database failures.
pub async fn backlog(client: &Client) -> Result<Vec<Backlog>, DbError> {
    let rows = client.query_typed(BACKLOG, &[]).await?;
    Ok(rows
        .iter()
        .map(|row| Backlog {
            queue: row.get("queue"),
            paused: row.get("paused"),
            waiting: row.get("waiting"),
            queued: row.get("queued"),
            due: row.get("due"),
            oldest_due_age_s: row.get("oldest_due_age_s"),
            running: row.get("running"),
            served: row.get("served"),
        })
        .collect())
}

/// Read every queue's figures and the daemons connected.
///
/// # Errors
///
/// Database failures.
pub async fn stats(client: &Client) -> Result<Stats, DbError> {
    let rows = client.query_typed(QUEUES, &[]).await?;
    let queues = rows
        .iter()
        .map(|row| {
            let paused_at: Option<DateTime<Utc>> = row.get("paused_at");
            let due: i64 = row.get("due");
            let served: bool = row.get("served");
            QueueStats {
                queue: row.get("queue"),
                paused: paused_at.is_some(),
                paused_at,
                waiting: row.get("waiting"),
                queued: row.get("queued"),
                due,
                oldest_due_age_s: row.get("oldest_due_age_s"),
                running: row.get("running"),
                served,
                unserved: due > 0 && !served,
                finished_last_minute: Finished {
                    succeeded: row.get("s_m"),
                    failed: row.get("f_m"),
                    canceled: row.get("c_m"),
                },
                finished_last_hour: Finished {
                    succeeded: row.get("s_h"),
                    failed: row.get("f_h"),
                    canceled: row.get("c_h"),
                },
                settings: Limits::from_row(row),
            }
        })
        .collect();
    let rows = client.query_typed(DAEMONS, &[]).await?;
    let daemons = rows
        .iter()
        .map(|row| Daemon {
            instance: row.get("instance"),
            sessions: row.get("sessions"),
        })
        .collect();
    Ok(Stats { queues, daemons })
}

const FINISHED_PER_MINUTE: &str = "
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'SUCCEEDED') AS succeeded,
       count(*) FILTER (WHERE status = 'FAILED') AS failed,
       count(*) FILTER (WHERE status = 'CANCELED') AS canceled
  FROM pgtaskd.task_state
 WHERE finished_at >= $1
 GROUP BY 1";

/// The tasks finished in each minute since `since`, by how they ended; minutes without any
/// are left out. One range of `tasks_finished_idx`: the cost follows those minutes'
/// throughput, never the table's size.
///
/// # Errors
///
/// Database failures.
pub async fn finished_per_minute(
    client: &Client,
    since: DateTime<Utc>,
) -> Result<Vec<(DateTime<Utc>, Finished)>, DbError> {
    let rows = client
        .query_typed(FINISHED_PER_MINUTE, &[(&since, Type::TIMESTAMPTZ)])
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            (
                row.get("minute"),
                Finished {
                    succeeded: row.get("succeeded"),
                    failed: row.get("failed"),
                    canceled: row.get("canceled"),
                },
            )
        })
        .collect())
}
