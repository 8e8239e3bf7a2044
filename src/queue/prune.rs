//! Retention: delete finished rows older than a configured age, in bounded batches, so that a
//! busy table does not grow forever. Off unless `retention.finished_after` is set.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

/// The rows are picked once, into an array, and then deleted by primary key: written as
/// `WHERE id IN (SELECT ...)`, the planner may turn the pick into a semi-join, and with
/// statistics taken while the table was empty (a vacuum of an emptied queue, with autovacuum
/// off or before its next analyze) it chose to walk the whole primary key and run the locking
/// pick once per row: over 10 minutes for one batch of a 400,000-row table, cancelled by the
/// statement timeout at every retention tick while the table grew (the claim's re-check is
/// written the same way for the same reason).
const PRUNE: &str = "
DELETE FROM pgtaskd.tasks
 WHERE id = ANY (ARRAY(
    SELECT id
      FROM pgtaskd.tasks
     WHERE finished_at < now() - $1 * interval '1 millisecond'
       AND status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
     ORDER BY finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
 ))
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

/// Whether this session's role may vacuum the table: its owner (or a member of the owner's
/// role, a superuser included) or the database's owner. Anyone else's `VACUUM` would only warn.
const MAY_VACUUM: &str = "
SELECT pg_has_role(c.relowner, 'USAGE')
    OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE')
  FROM pg_class c
 WHERE c.oid = 'pgtaskd.tasks'::regclass";

/// Whether this session may [`vacuum`] the table.
///
/// # Errors
///
/// Database failures.
pub async fn may_vacuum(client: &Client) -> Result<bool, DbError> {
    Ok(client.query_one(MAY_VACUUM, &[]).await?.get(0))
}

/// Whether autovacuum leaves the table alone: off in the server (`autovacuum`, or
/// `track_counts`, without which it has nothing to go by) or for the table
/// (`autovacuum_enabled = false`).
const AUTOVACUUM_OFF: &str = "
SELECT NOT current_setting('autovacuum')::bool
    OR NOT current_setting('track_counts')::bool
    OR coalesce((SELECT NOT o.option_value::bool
                   FROM pg_options_to_table(c.reloptions) AS o
                  WHERE o.option_name = 'autovacuum_enabled'), false)
  FROM pg_class AS c
 WHERE c.oid = 'pgtaskd.tasks'::regclass";

/// Whether autovacuum will never vacuum the table.
///
/// # Errors
///
/// Database failures.
pub async fn autovacuum_off(client: &Client) -> Result<bool, DbError> {
    Ok(client.query_one(AUTOVACUUM_OFF, &[]).await?.get(0))
}

/// Vacuum the table (and its TOAST table), so that the rows pruned and the row versions the
/// claims and finishes left behind become free space. `SKIP_LOCKED`: when another vacuum
/// (another daemon's, autovacuum's) holds the table, this one does nothing.
///
/// # Errors
///
/// Database failures, a statement timeout among them.
pub async fn vacuum(client: &Client) -> Result<(), DbError> {
    client
        .batch_execute("VACUUM (SKIP_LOCKED) pgtaskd.tasks")
        .await?;
    Ok(())
}
