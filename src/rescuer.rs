//! The rescuer: every daemon looks, on a jittered tick, for RUNNING tasks whose lease
//! expired (their daemon crashed, froze or lost the database) and takes them back
//! (docs/design.md, "Nothing lost"): QUEUED again while attempts remain, FAILED after
//! `max_attempts`, CANCELED when a cancel was requested. It then wakes the daemons.
//! Concurrent rescuers skip each other's rows, so many daemons never fight.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backoff::jitter;
use crate::db::{DbError, Pool};
use crate::metrics::Metrics;
use crate::queue::{self, TaskStatus};

/// The most rows one rescue statement takes back.
const BATCH: i64 = 500;

/// How often to look: half a lease, between 100 ms and 30 s.
pub fn interval(lease: Duration) -> Duration {
    (lease / 2).clamp(Duration::from_millis(100), Duration::from_secs(30))
}

/// Rescue on every tick until `stop` fires.
pub async fn run(
    pool: Pool,
    instance: String,
    lease: Duration,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let period = interval(lease);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(jitter(period)) => {}
        }
        match run_once(&pool, &instance).await {
            Ok(rescued) => metrics.rescued(rescued),
            Err(err) => tracing::warn!(error = %err, "rescuer could not run"),
        }
    }
}

/// Take back every expired lease now; returns how many tasks were taken back.
///
/// # Errors
///
/// Database failures.
pub async fn run_once(pool: &Pool, instance: &str) -> Result<usize, DbError> {
    let client = pool.get().await?;
    let mut total = 0;
    loop {
        let rescued = client.bounded(queue::rescue(&client, BATCH)).await?;
        for task in &rescued {
            tracing::warn!(
                id = task.id,
                attempt = task.attempt,
                previous_owner = task.previous_owner.as_deref().unwrap_or(""),
                status = %task.status,
                rescued_by = instance,
                "lease expired; task rescued"
            );
        }
        total += rescued.len();
        if rescued.iter().any(|t| t.status == TaskStatus::Queued) {
            client.bounded(queue::notify_tasks(&client)).await?;
        }
        if (rescued.len() as i64) < BATCH {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_is_half_a_lease_within_bounds() {
        assert_eq!(interval(Duration::from_secs(30)), Duration::from_secs(15));
        assert_eq!(
            interval(Duration::from_millis(50)),
            Duration::from_millis(100)
        );
        assert_eq!(interval(Duration::from_secs(600)), Duration::from_secs(30));
    }
}
