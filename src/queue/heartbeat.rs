//! The lease heartbeat: extend the leases of the claims this instance holds, and read their
//! `cancel_requested` in the same statement (the fallback for a lost cancel notification).
//!
//! The batch never waits for a row lock (docs/design.md, "No one else's lock delays a
//! batch"): its rows are locked in id order with `SKIP LOCKED`, and a row that someone else
//! holds (a producer's open transaction that requested its cancel) is reported as
//! [`Beat::Busy`], still this claim's but not extended. [`extend_one`] then waits for that
//! one row on a statement of its own.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

/// What a heartbeat found of one claim it was asked to extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Its lease was extended; whether a cancel was requested.
    Extended { cancel_requested: bool },
    /// Still this claim's, but its row is locked by another transaction: not extended.
    Busy,
}

/// A claim the heartbeat found still held (a claim it does not return was lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extended {
    pub id: i64,
    pub beat: Beat,
}

/// `pgtaskd.heartbeat` (sql/0026_state_functions.sql): the claims still held are locked in
/// id order with `SKIP LOCKED` and extended; those someone else holds are answered, not
/// extended.
const HEARTBEAT: &str = "SELECT task_id, task_extended, task_cancel_requested \
     FROM pgtaskd.heartbeat($1, $2, $3)";

/// Extend by `lease` the leases of the claims `tokens` of tasks `ids` (one token per id) that
/// are still held, without waiting for any row lock. A claim missing from the result is no
/// longer this instance's: it was taken over or finished.
///
/// # Errors
///
/// Database failures; nothing was extended.
pub async fn heartbeat(
    client: &Client,
    ids: &[i64],
    tokens: &[i64],
    lease: Duration,
) -> Result<Vec<Extended>, DbError> {
    let lease_ms = lease.as_millis() as f64;
    let rows = client
        .query_typed(
            HEARTBEAT,
            &[
                (&ids, Type::INT8_ARRAY),
                (&tokens, Type::INT8_ARRAY),
                (&lease_ms, Type::FLOAT8),
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Extended {
            id: row.get(0),
            beat: if row.get(1) {
                Beat::Extended {
                    cancel_requested: row.get(2),
                }
            } else {
                Beat::Busy
            },
        })
        .collect())
}

/// `pgtaskd.extend_lease`: the one row, waited for.
const EXTEND_ONE: &str = "SELECT task_cancel_requested FROM pgtaskd.extend_lease($1, $2, $3)";

/// Extend the lease of claim `token` of task `id`, waiting for its row if another
/// transaction holds it (up to the session's `lock_timeout`). `None` when the claim is no
/// longer held.
///
/// # Errors
///
/// Database failures, a lock timeout among them; nothing was extended.
pub async fn extend_one(
    client: &Client,
    id: i64,
    token: i64,
    lease: Duration,
) -> Result<Option<bool>, DbError> {
    let lease_ms = lease.as_millis() as f64;
    let rows = client
        .query_typed(
            EXTEND_ONE,
            &[
                (&id, Type::INT8),
                (&token, Type::INT8),
                (&lease_ms, Type::FLOAT8),
            ],
        )
        .await?;
    Ok(rows.first().map(|row| row.get(0)))
}
