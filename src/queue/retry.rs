//! Retrying a FAILED or CANCELED task through `pgtaskd.retry(id)`: back to QUEUED as if new
//! (`attempt` 0, no error, no results, no cancel request, due now), and the daemons woken.
//! Called by `pgtaskd retry`.
//!
//! The FAILED tasks of a whole queue go back the same way through
//! `pgtaskd.retry_failed(queue, max_rows)` (schema 22), a batch per statement: called by
//! `pgtaskd retry --queue Q --failed` and `POST /queues/{queue}/retry-failed`.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::task::{status_column, TaskStatus};
use crate::db::DbError;

/// What a retry found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOutcome {
    /// The task was FAILED or CANCELED (the status it had) and is QUEUED again.
    Requeued(TaskStatus),
    /// The task is QUEUED, RUNNING or SUCCEEDED; nothing changed.
    Refused(TaskStatus),
    /// There is no such task.
    NotFound,
}

/// Put task `id` back to QUEUED when it FAILED or was CANCELED.
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on the function.
pub async fn retry(client: &Client, id: i64) -> Result<RetryOutcome, DbError> {
    let row = client
        .query_typed_one("SELECT pgtaskd.retry($1)", &[(&id, Type::INT8)])
        .await?;
    let previous: Option<&str> = row.get(0);
    Ok(match previous.map(status_column) {
        None => RetryOutcome::NotFound,
        Some(status @ (TaskStatus::Failed | TaskStatus::Canceled)) => {
            RetryOutcome::Requeued(status)
        }
        Some(status) => RetryOutcome::Refused(status),
    })
}

/// The FAILED tasks of one queue a call of `pgtaskd.retry_failed` retries at most: one
/// statement's work, so that a million failed rows never make one giant transaction.
pub const RETRY_FAILED_BATCH: i32 = 10_000;

/// Put at most `max_rows` FAILED tasks of `queue`, oldest first, back to QUEUED as [`retry`]
/// does, in one statement (`pgtaskd.retry_failed`); how many it retried. The caller calls it
/// again until it returns 0, each call its own transaction; rows another transaction holds
/// locked are left for a later call.
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on the function.
pub async fn retry_failed(client: &Client, queue: &str, max_rows: i32) -> Result<i64, DbError> {
    let row = client
        .query_typed_one(
            "SELECT pgtaskd.retry_failed($1, $2)",
            &[(&queue, Type::TEXT), (&max_rows, Type::INT4)],
        )
        .await?;
    Ok(row.get(0))
}

/// How many tasks of `queue` are FAILED (read from `tasks_list_queue_idx`).
///
/// # Errors
///
/// Database failures.
pub async fn failed_count(client: &Client, queue: &str) -> Result<i64, DbError> {
    let row = client
        .query_typed_one(
            "SELECT count(*) FROM pgtaskd.tasks WHERE queue = $1 AND status = 'FAILED'",
            &[(&queue, Type::TEXT)],
        )
        .await?;
    Ok(row.get(0))
}

/// Whether `queue` is known: it holds a task, of any status, or is paused. Each status is
/// looked up through an index that leads with the queue (finished rows, QUEUED ones) or
/// holds few rows (RUNNING ones).
///
/// # Errors
///
/// Database failures.
pub async fn queue_known(client: &Client, queue: &str) -> Result<bool, DbError> {
    let row = client
        .query_typed_one(
            "SELECT EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 \
                             AND status IN ('SUCCEEDED', 'FAILED', 'CANCELED')) \
                 OR EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'QUEUED') \
                 OR EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'RUNNING') \
                 OR EXISTS (SELECT 1 FROM pgtaskd.paused_queues WHERE queue = $1)",
            &[(&queue, Type::TEXT)],
        )
        .await?;
    Ok(row.get(0))
}
