//! Pausing and resuming a queue through `pgtaskd.pause_queue(q)` and
//! `pgtaskd.resume_queue(q)`, so that SQL users, the CLI and the HTTP API share one rule:
//! the claim skips a queue of `pgtaskd.paused_queues`; a resume wakes the daemons with
//! `NOTIFY pgtaskd_tasks`. Called by `pgtaskd pause`/`resume` and `POST /queues/{q}/...`.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

/// Pause `queue`. Returns `false` when it was paused already (nothing changed).
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on the function.
pub async fn pause(client: &Client, queue: &str) -> Result<bool, DbError> {
    let row = client
        .query_typed_one("SELECT pgtaskd.pause_queue($1)", &[(&queue, Type::TEXT)])
        .await?;
    Ok(row.get(0))
}

/// Resume `queue`. Returns `false` when it was not paused (nothing changed).
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on the function.
pub async fn resume(client: &Client, queue: &str) -> Result<bool, DbError> {
    let row = client
        .query_typed_one("SELECT pgtaskd.resume_queue($1)", &[(&queue, Type::TEXT)])
        .await?;
    Ok(row.get(0))
}

/// When `queue` was paused, or `None` when it is not.
///
/// # Errors
///
/// Database failures.
pub async fn paused_since(client: &Client, queue: &str) -> Result<Option<DateTime<Utc>>, DbError> {
    let row = client
        .query_typed_opt(
            "SELECT paused_at FROM pgtaskd.paused_queues WHERE queue = $1",
            &[(&queue, Type::TEXT)],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}
