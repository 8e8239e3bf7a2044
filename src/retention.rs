//! Retention: when `retention.finished_after` is set, delete finished rows older than that,
//! in bounded batches, every quarter of that window (at least once a minute, at most once a
//! second; see [`interval`]), and vacuum the table once [`VACUUM_AFTER`] rows were deleted.
//! Off by default: results are the user's data.
//!
//! Why retention vacuums (docs/design.md, "Vacuum"): every task leaves three dead row
//! versions, and autovacuum visits a database at most once per `autovacuum_naptime` (a
//! server-wide minute by default; it may be off altogether). Between two visits a busy queue
//! writes a minute of dead rows into new pages, and the table grows by that much. The daemon
//! knows when it made rows dead; vacuuming then keeps the table at the size of its retention
//! window. Only a role that may vacuum the table does (its owner: the role that ran `pgtaskd
//! migrate`); under any other, autovacuum alone does, with the settings of schema 8.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

use crate::backoff::jitter;
use crate::db::{DbError, Pool};
use crate::queue;

/// The longest and the shortest time between two prunes.
const MAX_INTERVAL: Duration = Duration::from_secs(60);
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The most rows one statement deletes, so that no statement holds many locks for long.
const BATCH: i64 = 1000;
/// Rows pruned after which retention vacuums the table: the table's own autovacuum threshold
/// (sql/0008_autovacuum.sql).
pub const VACUUM_AFTER: u64 = 5000;

/// How often to prune rows kept for `older_than`: a quarter of it, so that a row outlives the
/// window by at most a quarter of it and the table holds at most 1.25 windows of finished
/// rows; at most a minute (long windows: once a minute, as before) and at least a second.
pub fn interval(older_than: Duration) -> Duration {
    (older_than / 4).clamp(MIN_INTERVAL, MAX_INTERVAL)
}

/// Prune on every tick until `stop` fires; beside it, vacuum after every [`VACUUM_AFTER`] rows
/// pruned. The two run apart so that a long vacuum never delays the next prune.
pub async fn run(pool: Pool, older_than: Duration, stop: CancellationToken) {
    let every = interval(older_than);
    let pruned = Arc::new(AtomicU64::new(0));
    let vacuum = tokio::spawn(vacuum_when_due(
        pool.clone(),
        Arc::clone(&pruned),
        stop.clone(),
    ));
    loop {
        match run_once(&pool, older_than).await {
            Ok(deleted) => {
                pruned.fetch_add(deleted, Ordering::Relaxed);
            }
            Err(err) => tracing::warn!(error = %err, "retention could not run"),
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(jitter(every)) => {}
        }
    }
    let _ = vacuum.await;
}

/// Vacuum the table whenever [`VACUUM_AFTER`] rows were pruned since the last vacuum, looking
/// every [`MIN_INTERVAL`], until `stop` fires or vacuuming is left to autovacuum.
async fn vacuum_when_due(pool: Pool, pruned: Arc<AtomicU64>, stop: CancellationToken) {
    let mut vacuum = Vacuum::default();
    loop {
        let seen = pruned.load(Ordering::Relaxed);
        if seen >= VACUUM_AFTER {
            match vacuum.run(&pool).await {
                Some(true) => {
                    pruned.fetch_sub(seen, Ordering::Relaxed);
                }
                Some(false) => return,
                None => {}
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(MIN_INTERVAL) => {}
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

/// Retention's vacuum: whether the daemon may vacuum the table.
#[derive(Default)]
struct Vacuum {
    /// Unknown until first needed; `false` for good once a vacuum was refused or ran into the
    /// statement timeout (a table too large for the daemon to vacuum within it).
    allowed: Option<bool>,
}

impl Vacuum {
    /// Vacuum once: `Some(true)` when it ran, `Some(false)` when the daemon leaves vacuuming
    /// to autovacuum from now on, `None` when it failed and may be tried again.
    async fn run(&mut self, pool: &Pool) -> Option<bool> {
        let outcome = async {
            let client = pool.get().await?;
            if self.allowed.is_none() {
                let allowed = client.bounded(queue::prune::may_vacuum(&client)).await?;
                if !allowed {
                    tracing::info!(
                        "retention leaves vacuuming pgtaskd.tasks to autovacuum: this role does not own it"
                    );
                }
                self.allowed = Some(allowed);
            }
            if self.allowed == Some(true) {
                client.bounded(queue::prune::vacuum(&client)).await?;
            }
            Ok::<_, DbError>(self.allowed)
        }
        .await;
        match outcome {
            Ok(allowed) => allowed,
            Err(err) if err.code() == Some(&SqlState::QUERY_CANCELED) => {
                tracing::warn!(error = %err, "retention's vacuum of pgtaskd.tasks took longer than database.statement_timeout; leaving it to autovacuum from now on");
                self.allowed = Some(false);
                Some(false)
            }
            Err(err) => {
                tracing::warn!(error = %err, "retention could not vacuum");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_a_quarter_of_the_window_between_a_second_and_a_minute() {
        let s = Duration::from_secs;
        assert_eq!(interval(s(60)), s(15));
        assert_eq!(interval(s(120)), s(30));
        assert_eq!(interval(s(240)), s(60));
        assert_eq!(
            interval(s(7 * 24 * 3600)),
            s(60),
            "long windows: once a minute"
        );
        assert_eq!(interval(s(2)), s(1), "never more often than once a second");
        assert_eq!(interval(Duration::from_millis(10)), s(1));
        assert_eq!(
            interval(Duration::from_millis(4200)),
            Duration::from_millis(1050)
        );
    }
}
