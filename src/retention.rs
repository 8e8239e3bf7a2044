//! Retention: when `retention.finished_after` is set, delete finished rows older than that,
//! in bounded batches, once a minute. Off by default: results are the user's data.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backoff::jitter;
use crate::db::{DbError, Pool};
use crate::queue;

/// How often to prune.
const INTERVAL: Duration = Duration::from_secs(60);
/// The most rows one statement deletes, so that no statement holds many locks for long.
const BATCH: i64 = 1000;

/// Prune on every tick until `stop` fires.
pub async fn run(pool: Pool, older_than: Duration, stop: CancellationToken) {
    loop {
        if let Err(err) = run_once(&pool, older_than).await {
            tracing::warn!(error = %err, "retention could not run");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(jitter(INTERVAL)) => {}
        }
    }
}

/// Delete every finished row older than `older_than` now, batch by batch; returns how many.
///
/// # Errors
///
/// Database failures.
pub async fn run_once(pool: &Pool, older_than: Duration) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let mut total = 0;
    loop {
        let deleted = client
            .bounded(queue::prune(&client, older_than, BATCH))
            .await?;
        total += deleted;
        if deleted < BATCH as u64 {
            if total > 0 {
                tracing::info!(deleted = total, "finished rows pruned");
            }
            return Ok(total);
        }
    }
}
