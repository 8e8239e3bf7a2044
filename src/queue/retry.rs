//! Retrying a FAILED or CANCELED task through `pgtaskd.retry(id)`: back to QUEUED as if new
//! (`attempt` 0, no error, no results, no cancel request, due now), and the daemons woken; a
//! task with parents waits again, and `pgtaskd.retry_with_dependents(id)` brings back the
//! tasks its end canceled too. Called by `pgtaskd retry` and `POST /tasks/{id}/retry`.
//!
//! The FAILED tasks of a whole queue go back the same way through
//! `pgtaskd.retry_failed(queue, max_rows, after_id)` (schema 22), a batch per statement, each
//! starting above the last one's highest id: called by
//! `pgtaskd retry --queue Q --failed` and `POST /queues/{queue}/retry-failed`.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::task::{status_column, TaskStatus};
use crate::db::DbError;

/// What a retry found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryOutcome {
    /// The task was FAILED or CANCELED (`was`) and was put back: it is `now` QUEUED, or, for
    /// a task with parents, WAITING again (or CANCELED again by its policy). With dependents,
    /// `dependents` are the tasks brought back with it, each waiting again.
    Requeued {
        was: TaskStatus,
        now: TaskStatus,
        dependents: Vec<i64>,
    },
    /// The task is WAITING, QUEUED, RUNNING or SUCCEEDED; nothing changed.
    Refused(TaskStatus),
    /// There is no such task.
    NotFound,
}

/// Put task `id` back to QUEUED when it FAILED or was CANCELED (`pgtaskd.retry`), and with
/// `with_dependents` every task its end canceled (a dependent under `on_dep_failure`
/// 'cancel', docs/dependencies.md), and theirs (`pgtaskd.retry_with_dependents`); then read
/// the status the retry left. Called by `pgtaskd retry` and `POST /tasks/{id}/retry`.
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on the function.
pub async fn retry(
    client: &Client,
    id: i64,
    with_dependents: bool,
) -> Result<RetryOutcome, DbError> {
    let (previous, dependents): (Option<String>, Vec<i64>) = if with_dependents {
        let rows = client
            .query_typed(
                "SELECT retried_id, previous FROM pgtaskd.retry_with_dependents($1)",
                &[(&id, Type::INT8)],
            )
            .await?;
        let previous = rows.first().and_then(|row| row.get(1));
        (
            previous,
            rows.iter().skip(1).map(|row| row.get(0)).collect(),
        )
    } else {
        let row = client
            .query_typed_one("SELECT pgtaskd.retry($1)", &[(&id, Type::INT8)])
            .await?;
        (row.get(0), Vec::new())
    };
    Ok(match previous.as_deref().map(status_column) {
        None => RetryOutcome::NotFound,
        Some(was @ (TaskStatus::Failed | TaskStatus::Canceled)) => {
            let now = client
                .query_typed_opt(
                    "SELECT status FROM pgtaskd.task_view WHERE id = $1",
                    &[(&id, Type::INT8)],
                )
                .await?
                .map_or(TaskStatus::Queued, |row| status_column(row.get(0)));
            RetryOutcome::Requeued {
                was,
                now,
                dependents,
            }
        }
        Some(status) => RetryOutcome::Refused(status),
    })
}

/// The FAILED tasks of one queue a call of `pgtaskd.retry_failed` retries at most: one
/// statement's work, so that a million failed rows never make one giant transaction.
pub const RETRY_FAILED_BATCH: i32 = 10_000;

/// One batch of [`retry_failed`]: how many FAILED tasks it put back to QUEUED, and the
/// highest id among them (the `after` of the next batch; `after` itself when none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetriedBatch {
    pub retried: i64,
    pub last_id: i64,
}

/// Put at most `max_rows` FAILED tasks of `queue` with an id over `after`, lowest first, back
/// to QUEUED as [`retry`] does, in one statement (`pgtaskd.retry_failed`). The caller calls it
/// again with the batch's `last_id` as `after` until a batch retries none, each call its own
/// transaction; rows another transaction holds locked are skipped (a later pass from 0 finds
/// them).
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on the function.
pub async fn retry_failed(
    client: &Client,
    queue: &str,
    max_rows: i32,
    after: i64,
) -> Result<RetriedBatch, DbError> {
    let row = client
        .query_typed_one(
            "SELECT retried, last_id FROM pgtaskd.retry_failed($1, $2, $3)",
            &[
                (&queue, Type::TEXT),
                (&max_rows, Type::INT4),
                (&after, Type::INT8),
            ],
        )
        .await?;
    Ok(RetriedBatch {
        retried: row.get(0),
        last_id: row.get(1),
    })
}

/// How many tasks of `queue` with an id over `above` are FAILED (read from
/// `tasks_list_queue_idx` of `pgtaskd.task_state`: through the view, each would also read its
/// task row).
///
/// # Errors
///
/// Database failures.
pub async fn failed_count(client: &Client, queue: &str, above: i64) -> Result<i64, DbError> {
    let row = client
        .query_typed_one(
            "SELECT count(*) FROM pgtaskd.task_state WHERE queue = $1 AND status = 'FAILED' AND id > $2",
            &[(&queue, Type::TEXT), (&above, Type::INT8)],
        )
        .await?;
    Ok(row.get(0))
}

/// Whether `queue` is known: it holds a task, of any status, or is paused. Each status is
/// looked up through an index that leads with the queue (finished rows, QUEUED ones) or
/// holds few rows (RUNNING and WAITING ones).
///
/// # Errors
///
/// Database failures.
pub async fn queue_known(client: &Client, queue: &str) -> Result<bool, DbError> {
    let row = client
        .query_typed_one(
            "SELECT EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 \
                             AND status IN ('SUCCEEDED', 'FAILED', 'CANCELED')) \
                 OR EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 AND status = 'QUEUED') \
                 OR EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 AND status = 'RUNNING') \
                 OR EXISTS (SELECT 1 FROM pgtaskd.task_view WHERE queue = $1 AND status = 'WAITING') \
                 OR EXISTS (SELECT 1 FROM pgtaskd.paused_queues WHERE queue = $1)",
            &[(&queue, Type::TEXT)],
        )
        .await?;
    Ok(row.get(0))
}
