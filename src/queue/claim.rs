//! Claiming: QUEUED -> RUNNING, in batches, with exactly one winner per task (invariant 1).
//!
//! The rows are picked in a materialized CTE with `FOR UPDATE SKIP LOCKED`, so that concurrent
//! claimers step around each other instead of queueing, and the outer `UPDATE` re-checks
//! `status = 'QUEUED'`: the database is the arbiter, never an in-process lock. Each queue is
//! read through its own ordered scan of the partial index (a `LATERAL` per queue): a single
//! `queue = ANY(...)` scan would sort every QUEUED row of the queues on every claim. (A plain
//! `WHERE id IN (SELECT ... LIMIT n)` may be re-planned and update more rows than the limit.)
//! The claim increments `attempt`, the claim's fencing token, and sets the lease from the
//! database clock.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

/// A task this instance now runs, as the claim returned it.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub id: i64,
    /// The claim's fencing token: every later change of this claim names it.
    pub attempt: i32,
    pub payload: String,
    /// Seconds from the task becoming due (`created_at`, or a later `run_at`) to the claim,
    /// by the database clock.
    pub waited: f64,
}

/// The statement lives in `pgtaskd.claim` (sql/0003_plans.sql), whose planner settings keep
/// the ordered index plan however stale the table's statistics are.
const CLAIM: &str =
    "SELECT task_id, task_attempt, task_payload, waited_s FROM pgtaskd.claim($1, $2, $3, $4)";

/// Claim up to `limit` QUEUED tasks of `queues` whose `run_at` has come, for instance
/// `owner`, with a lease of `lease`. Highest priority first, then oldest. An empty result
/// means nothing could be claimed ("not claimed"), not an error.
///
/// # Errors
///
/// Database failures. A server error changed nothing; when the connection failed
/// ([`DbError::Unavailable`]), the claim may have committed without its answer arriving, and
/// [`held_by`] finds its tasks.
pub async fn claim(
    client: &Client,
    owner: &str,
    queues: &[String],
    limit: usize,
    lease: Duration,
) -> Result<Vec<Claimed>, DbError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let lease_ms = lease.as_millis() as f64;
    let rows = client
        .query_typed(
            CLAIM,
            &[
                (&queues, Type::TEXT_ARRAY),
                (&limit, Type::INT8),
                (&owner, Type::TEXT),
                (&lease_ms, Type::FLOAT8),
            ],
        )
        .await?;
    let claimed = rows
        .iter()
        .map(|row| Claimed {
            id: row.get(0),
            attempt: row.get(1),
            payload: row.get(2),
            waited: row.get(3),
        })
        .collect();
    Ok(claimed)
}

/// The claims the table holds for instance `owner`: `(id, attempt)` of its RUNNING rows,
/// read through the partial index of RUNNING rows.
///
/// # Errors
///
/// Database failures.
pub async fn held_by(client: &Client, owner: &str) -> Result<Vec<(i64, i32)>, DbError> {
    let rows = client
        .query_typed(
            "SELECT id, attempt FROM pgtaskd.tasks WHERE status = 'RUNNING' AND lease_owner = $1",
            &[(&owner, Type::TEXT)],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}
