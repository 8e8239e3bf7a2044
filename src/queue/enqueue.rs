//! Inserting a task, as the CLI and the HTTP API do. Producers may equally `INSERT` directly.

use tokio_postgres::Client;

use crate::db::DbError;

/// Insert a task with the table's defaults for everything but `payload` and `queue`; returns
/// its id. The insert trigger wakes the daemons at commit.
///
/// # Errors
///
/// Database failures.
pub async fn enqueue(client: &Client, queue: &str, payload: &str) -> Result<i64, DbError> {
    let row = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ($1, $2) RETURNING id",
            &[&queue, &payload],
        )
        .await?;
    Ok(row.get(0))
}
