//! Parked results (`pgtaskd.park`, `pgtaskd.write_parked`, sql/0028_parked_results.sql): a
//! stopping daemon that cannot write a result because another transaction holds the task's row
//! parks it in `pgtaskd.parked_results`, an insert no row lock holds up; a rescuer writes it,
//! fenced on the same claim token, once the claim's lease has expired and the row is free,
//! and the rescue never gives such a claim back to run again (docs/design.md, "Parked
//! results").

use std::collections::HashSet;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::finish::{Columns, Finish};
use super::task::{status_column, TaskStatus};
use crate::db::DbError;

const PARK: &str = "SELECT task_id FROM pgtaskd.park($1, $2, $3, $4, $5, $6, $7, $8, $9)";

const WRITE_PARKED: &str = "SELECT task_id, task_status FROM pgtaskd.write_parked($1, $2)";

/// Park `finishes`, each for the claim it names, where that claim still holds its row
/// (RUNNING under its token). Returns the ids parked.
///
/// # Errors
///
/// Database failures; nothing was parked.
pub async fn park(client: &Client, finishes: &[Finish]) -> Result<HashSet<i64>, DbError> {
    let columns = Columns::of(finishes);
    let rows = client.query_typed(PARK, &columns.params()).await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// A parked result written by [`write_parked`]: the task and the status written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unparked {
    pub id: i64,
    pub status: TaskStatus,
}

/// Write up to `limit` parked results whose leases expired, other than instance `owner`'s,
/// and drop those whose claims are over.
///
/// # Errors
///
/// Database failures; nothing was written.
pub async fn write_parked(
    client: &Client,
    limit: i64,
    owner: &str,
) -> Result<Vec<Unparked>, DbError> {
    let rows = client
        .query_typed(WRITE_PARKED, &[(&limit, Type::INT8), (&owner, Type::TEXT)])
        .await?;
    Ok(rows
        .iter()
        .map(|row| Unparked {
            id: row.get(0),
            status: status_column(row.get(1)),
        })
        .collect())
}
