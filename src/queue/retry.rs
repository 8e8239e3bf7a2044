//! Retrying a FAILED or CANCELED task through `pgtaskd.retry(id)`: back to QUEUED as if new
//! (`attempt` 0, no error, no results, no cancel request, due now), and the daemons woken.
//! Called by `pgtaskd retry`.

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
