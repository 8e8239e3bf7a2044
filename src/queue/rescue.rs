//! The rescuer's statement: RUNNING tasks whose lease expired go back to QUEUED (with a
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

const RESCUE: &str = "
WITH expired AS MATERIALIZED (
    SELECT id, attempt, claim_token, lease_owner
      FROM pgtaskd.tasks
     WHERE status = 'RUNNING' AND lease_expires_at < now()
       AND lease_owner IS DISTINCT FROM $2
     ORDER BY lease_expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), rescued AS (
UPDATE pgtaskd.tasks AS t
   SET status = CASE
           WHEN t.cancel_requested THEN 'CANCELED'
           WHEN t.attempt < t.max_attempts THEN 'QUEUED'
           ELSE 'FAILED'
       END,
       error = CASE
           WHEN NOT t.cancel_requested AND t.attempt >= t.max_attempts
           THEN format('lease lost after %s attempts (last held by %s)', t.attempt, t.lease_owner)
       END,
       -- The n-th lost lease waits (n-1)^2 seconds, at most ten minutes, before the next try.
       run_at = CASE
           WHEN NOT t.cancel_requested AND t.attempt < t.max_attempts
           THEN now() + least(power(t.attempt - 1, 2), 600) * interval '1 second'
           ELSE t.run_at
       END,
       finished_at = CASE
           WHEN t.cancel_requested OR t.attempt >= t.max_attempts THEN now()
       END,
       lease_owner = NULL,
       lease_expires_at = NULL
  FROM expired
 WHERE t.id = expired.id
   AND t.status = 'RUNNING'
   AND t.claim_token IS NOT DISTINCT FROM expired.claim_token
   AND t.lease_expires_at < now()
RETURNING t.id, expired.attempt, expired.lease_owner, t.status
), notified AS (
    -- The tasks this ended (FAILED, CANCELED) are announced in the same transaction.
    SELECT pgtaskd.notify_done(array_agg(id)) AS sent FROM rescued WHERE status <> 'QUEUED'
)
SELECT rescued.id, rescued.attempt, rescued.lease_owner, rescued.status
  FROM rescued CROSS JOIN notified";

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

/// Wake every daemon: used after tasks were put back to QUEUED.
///
/// # Errors
///
/// Database failures.
pub async fn notify_tasks(client: &Client) -> Result<(), DbError> {
    client
        .batch_execute(&format!("NOTIFY {}", crate::db::listen::TASKS_CHANNEL))
        .await?;
    Ok(())
}
