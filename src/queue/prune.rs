//! Retention: delete finished rows older than a configured age, in bounded batches, so that a
//! busy table does not grow forever. Off unless `retention.finished_after` is set.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

const PRUNE: &str = "
DELETE FROM pgtaskd.tasks
 WHERE id IN (
    SELECT id
      FROM pgtaskd.tasks
     WHERE finished_at < now() - $1 * interval '1 millisecond'
       AND status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
     ORDER BY finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
 )
   AND status IN ('SUCCEEDED', 'FAILED', 'CANCELED')";

/// Delete up to `limit` rows that finished more than `older_than` ago; returns how many.
///
/// # Errors
///
/// Database failures; nothing was deleted.
pub async fn prune(client: &Client, older_than: Duration, limit: i64) -> Result<u64, DbError> {
    let older_ms = older_than.as_millis() as f64;
    let deleted = client
        .execute_typed(PRUNE, &[(&older_ms, Type::FLOAT8), (&limit, Type::INT8)])
        .await?;
    Ok(deleted)
}
