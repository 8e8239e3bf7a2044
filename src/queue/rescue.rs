//! The rescuer's function (`pgtaskd.rescue`): RUNNING tasks whose lease expired go back to QUEUED (with a
//! backoff on `run_at`) while attempts remain, else become FAILED; a task whose cancellation
//! was requested becomes CANCELED.
//!
//! Rows are picked with `FOR UPDATE SKIP LOCKED` and re-checked by the outer `UPDATE`
//! (still RUNNING, same claim token, lease still expired), so that concurrent rescuers in many
//! daemons never fight and a lease extended meanwhile is left alone. A rescuer never takes
//! back its own daemon's claims: that daemon knows which of them are live (docs/design.md,
//! "Settle before rescuing"). The tasks it ends
//! (FAILED, CANCELED) are announced with `NOTIFY pgtaskd_done` in the same statement.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::task::{status_column, TaskStatus};
use crate::db::DbError;

/// A task whose expired lease was taken back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescued {
    pub id: i64,
    /// The attempt whose lease expired.
    pub attempt: i32,
    /// The instance that held the lease.
    pub previous_owner: Option<String>,
    /// QUEUED, FAILED or CANCELED.
    pub status: TaskStatus,
}

/// `pgtaskd.rescue` (sql/0026_state_functions.sql).
const RESCUE: &str = "SELECT task_id, task_attempt, task_previous_owner, task_status \
     FROM pgtaskd.rescue($1, $2)";

/// Take back up to `limit` expired leases, other than those of instance `owner`.
///
/// # Errors
///
/// Database failures; nothing was changed.
pub async fn rescue(client: &Client, limit: i64, owner: &str) -> Result<Vec<Rescued>, DbError> {
    let rows = client
        .query_typed(RESCUE, &[(&limit, Type::INT8), (&owner, Type::TEXT)])
        .await?;
    Ok(rows
        .iter()
        .map(|row| Rescued {
            id: row.get(0),
            attempt: row.get(1),
            previous_owner: row.get(2),
            status: status_column(row.get(3)),
        })
        .collect())
}

/// Wake every daemon: used after tasks were put back to QUEUED. Through `pgtaskd.notify`, so
/// that a session that turned notifications off (`pgtaskd.notify = off`, docs/design.md "No
/// commit waits for a standby that is not there") sends none.
///
/// # Errors
///
/// Database failures.
pub async fn notify_tasks(client: &Client) -> Result<(), DbError> {
    client
        .batch_execute(&format!(
            "SELECT pgtaskd.notify('{}', '')",
            crate::db::listen::TASKS_CHANNEL
        ))
        .await?;
    Ok(())
}
