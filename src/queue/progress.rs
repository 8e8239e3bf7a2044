//! Progress reports (schema 39, `src/progress/`): the batched, fenced write of each task's
//! latest, and the claim a report over HTTP names, checked.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;
use crate::queue::task::status_column;
use crate::queue::TaskStatus;

/// `pgtaskd.write_progress`: each row whose claim is `tokens[i]` and is RUNNING gets
/// `texts[i]` as its progress, rows another transaction holds passed over. The ids written.
///
/// # Errors
///
/// Database failures; a report the table refuses fails the whole statement.
pub async fn write_progress(
    client: &Client,
    ids: &[i64],
    tokens: &[i64],
    texts: &[&str],
) -> Result<Vec<i64>, DbError> {
    let rows = client
        .query_typed(
            "SELECT task_id FROM pgtaskd.write_progress($1, $2, $3::jsonb[])",
            &[
                (&ids, Type::INT8_ARRAY),
                (&tokens, Type::INT8_ARRAY),
                (&texts, Type::TEXT_ARRAY),
            ],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The status of task `id` and its current claim's token (`None` while it has none); `None`
/// for no such task.
///
/// # Errors
///
/// Database failures.
pub async fn claim_of(
    client: &Client,
    id: i64,
) -> Result<Option<(TaskStatus, Option<i64>)>, DbError> {
    let row = client
        .query_typed_opt(
            "SELECT status, claim_token FROM pgtaskd.task_view WHERE id = $1",
            &[(&id, Type::INT8)],
        )
        .await?;
    Ok(row.map(|row| (status_column(row.get(0)), row.get(1))))
}
