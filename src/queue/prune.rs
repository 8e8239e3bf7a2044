//! Retention: delete finished rows older than a configured age, in bounded batches, so that a
//! busy table does not grow forever. Off unless `retention.finished_after` is set.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

/// The batch lives in `pgtaskd.prune` (in sql/schema.sql). Its rows are picked once,
/// into an array, and then deleted by primary key: written as `WHERE id IN (SELECT ...)`, the
/// planner may turn the pick into a semi-join, and with statistics taken while the table was
/// empty it chose to walk the whole primary key and run the locking pick once per row. The
/// function's planner settings keep the pick an ordered scan of `tasks_finished_idx` that
/// stops at its limit: under the same statistics the statement alone was planned as a bitmap
/// scan of every row older than the window, sorted, for every batch. It reads from
/// `from_finished` on (null: the index's start): the entries of rows deleted before stay at
/// the front until a vacuum removes them, and while the xmin horizon is held back none can,
/// so every batch from the start would walk the entries of every row deleted since the hold
/// began (see [`Pruned::last`]).
const PRUNE: &str = "SELECT deleted, last_finished FROM pgtaskd.prune($1, $2, $3)";

/// What one prune statement deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub deleted: u64,
    /// The latest `finished_at` among them: the next batch of the same pass starts there
    /// (`>=`, rows of one finish share it). A row finished before it that is still there (one
    /// locked by another deleter, or whose finish committed after this batch) is left to the
    /// next pass, which starts from the beginning. `None` when none was deleted.
    pub last: Option<DateTime<Utc>>,
}

/// Delete up to `limit` rows that finished more than `older_than` ago, and at or after
/// `from` when given, oldest first.
///
/// # Errors
///
/// Database failures; nothing was deleted.
pub async fn prune(
    client: &Client,
    older_than: Duration,
    limit: i64,
    from: Option<DateTime<Utc>>,
) -> Result<Pruned, DbError> {
    let older_ms = older_than.as_millis() as f64;
    let rows = client
        .query_typed(
            PRUNE,
            &[
                (&older_ms, Type::FLOAT8),
                (&limit, Type::INT8),
                (&from, Type::TIMESTAMPTZ),
            ],
        )
        .await?;
    // An aggregate: always one row.
    let Some(row) = rows.first() else {
        return Ok(Pruned {
            deleted: 0,
            last: None,
        });
    };
    Ok(Pruned {
        deleted: row.try_get::<_, i64>(0)?.max(0) as u64,
        last: row.try_get(1)?,
    })
}

/// Whether this session's role may vacuum the table: its owner (or a member of the owner's
/// role, a superuser included) or the database's owner. Anyone else's `VACUUM` would only warn.
const MAY_VACUUM: &str = "
SELECT pg_has_role(c.relowner, 'USAGE')
    OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE')
  FROM pg_class c
 WHERE c.oid = 'pgtaskd.task_state'::regclass";

/// Whether this session may [`vacuum`] the table.
///
/// # Errors
///
/// Database failures.
pub async fn may_vacuum(client: &Client) -> Result<bool, DbError> {
    Ok(client.query_typed_one(MAY_VACUUM, &[]).await?.get(0))
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
 WHERE c.oid = 'pgtaskd.task_state'::regclass";

/// Whether autovacuum will never vacuum the table.
///
/// # Errors
///
/// Database failures.
pub async fn autovacuum_off(client: &Client) -> Result<bool, DbError> {
    Ok(client.query_typed_one(AUTOVACUUM_OFF, &[]).await?.get(0))
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
        .batch_execute("VACUUM (SKIP_LOCKED) pgtaskd.task_state, pgtaskd.tasks")
        .await?;
    Ok(())
}
