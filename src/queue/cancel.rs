//! Cancelling a task through `pgtaskd.request_cancel(id)` (what `pgtaskd.cancel(id)` calls), so that SQL users and the daemon's clients
//! share one implementation of the rule (WAITING or QUEUED -> CANCELED at once; RUNNING gets
//! `cancel_requested` and a `NOTIFY pgtaskd_cancel`; terminal stays as it is).

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::task::{status_column, TaskStatus};
use crate::db::DbError;

/// What a cancel request found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The task was WAITING or QUEUED and is now CANCELED; it will never be analyzed.
    Canceled,
    /// The task is RUNNING with `cancel_requested`; its daemon commits CANCELED once the
    /// analyzer has returned. Accepted, not done.
    Requested,
    /// The task had already finished; nothing changed.
    AlreadyFinished(TaskStatus),
    /// There is no such task.
    NotFound,
}

/// Request cancellation of task `id`.
///
/// # Errors
///
/// [`DbError::Unavailable`] when the database cannot be asked.
pub async fn cancel(client: &Client, id: i64) -> Result<CancelOutcome, DbError> {
    let row = client
        .query_typed_one(
            "SELECT previous, current FROM pgtaskd.request_cancel($1)",
            &[(&id, Type::INT8)],
        )
        .await?;
    let previous: Option<&str> = row.get(0);
    let current: Option<&str> = row.get(1);
    Ok(
        match (previous.map(status_column), current.map(status_column)) {
            (None, _) | (_, None) => CancelOutcome::NotFound,
            (Some(TaskStatus::Waiting | TaskStatus::Queued), Some(TaskStatus::Canceled)) => {
                CancelOutcome::Canceled
            }
            (Some(TaskStatus::Running), Some(TaskStatus::Running)) => CancelOutcome::Requested,
            (Some(_), Some(current)) => CancelOutcome::AlreadyFinished(current),
        },
    )
}

/// Of `ids`, the tasks that `owner` runs and whose cancellation was requested: what a cancel
/// notification claimed, confirmed by the row. Reads only.
///
/// # Errors
///
/// Database failures.
pub async fn cancel_requested(
    client: &Client,
    owner: &str,
    ids: &[i64],
) -> Result<Vec<i64>, DbError> {
    let rows = client
        .query_typed(
            "SELECT id FROM pgtaskd.task_state \
              WHERE id = ANY($1) AND status = 'RUNNING' AND lease_owner = $2 AND cancel_requested",
            &[(&ids, Type::INT8_ARRAY), (&owner, Type::TEXT)],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}
