//! The lease heartbeat: extend the leases of the tasks this instance runs, and read their
//! `cancel_requested` in the same statement (the fallback for a lost cancel notification).

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

/// A running task whose lease was extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extended {
    pub id: i64,
    pub cancel_requested: bool,
}

const HEARTBEAT: &str = "
UPDATE pgtaskd.tasks
   SET lease_expires_at = now() + $3 * interval '1 millisecond'
 WHERE id = ANY($2) AND status = 'RUNNING' AND lease_owner = $1
RETURNING id, cancel_requested";

/// Extend by `lease` the leases that `owner` still holds among `ids`. A task missing from the
/// result is no longer this instance's: its lease was taken over or it was finished.
///
/// # Errors
///
/// Database failures; nothing was extended.
pub async fn heartbeat(
    client: &Client,
    owner: &str,
    ids: &[i64],
    lease: Duration,
) -> Result<Vec<Extended>, DbError> {
    let lease_ms = lease.as_millis() as f64;
    let rows = client
        .query_typed(
            HEARTBEAT,
            &[
                (&owner, Type::TEXT),
                (&ids, Type::INT8_ARRAY),
                (&lease_ms, Type::FLOAT8),
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Extended {
            id: row.get(0),
            cancel_requested: row.get(1),
        })
        .collect())
}
