//! Retention: when `retention.finished_after` is set, delete finished rows older than that,
//! in bounded batches, every quarter of that window (at least once a minute, at most once a
//! second; see [`interval`]). Off by default: results are the user's data.
//!
//! Every row deleted is added to the count of dead rows that [`super::vacuum`] vacuums
//! after (docs/design.md, "Vacuum"): the daemon knows when it made rows dead, and vacuuming
//! then keeps the table at the size of its retention window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::backoff::jitter;
use crate::db::{DbError, Pool};
use crate::queue;

/// The longest and the shortest time between two prunes.
const MAX_INTERVAL: Duration = Duration::from_secs(60);
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The most rows one statement deletes, so that no statement holds many locks for long.
const BATCH: i64 = 1000;
/// One pass in this many starts from the oldest finished row; the others where the last pass
/// ended.
const FROM_START_EVERY: u32 = 8;

/// How often to prune rows kept for `older_than`: a quarter of it, so that a row outlives the
/// window by at most a quarter of it (one left behind a pass's position, see `pass`: by at
/// most `FROM_START_EVERY` passes) and the table holds at most 1.25 windows of finished
/// rows; at most a minute (long windows: once a minute, as before) and at least a second.
pub fn interval(older_than: Duration) -> Duration {
    (older_than / 4).clamp(MIN_INTERVAL, MAX_INTERVAL)
}

/// Prune on every tick until `stop` fires, adding the rows deleted to `pruned`.
pub async fn run(
    pool: Pool,
    older_than: Duration,
    pruned: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let every = interval(older_than);
    let mut from = None;
    let mut passes: u32 = 0;
    loop {
        let start = if passes % FROM_START_EVERY == 0 {
            None
        } else {
            from
        };
        passes = passes.wrapping_add(1);
        match pass(&pool, older_than, start).await {
            Ok((deleted, end)) => {
                pruned.fetch_add(deleted, Ordering::Relaxed);
                // A pass deletes every prunable row from its start on: nothing prunable is
                // left after where it ended, even when that is before the position it
                // replaces (a pass from the oldest row that found only rows left behind; a
                // server clock set back, which would otherwise leave the position in the
                // future). A pass from the oldest row that deleted nothing keeps it.
                from = end.or(from);
            }
            Err(err) => tracing::warn!(error = %err, "retention could not run"),
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(jitter(every)) => {}
        }
    }
}

/// Delete every finished row older than `older_than` now, batch by batch; returns how many.
///
/// # Errors
///
/// Database failures.
pub async fn run_once(pool: &Pool, older_than: Duration) -> Result<u64, DbError> {
    Ok(pass(pool, older_than, None).await?.0)
}

/// One pass: delete every finished row older than `older_than` from `from` on (`None`: from
/// the oldest), batch by batch. The first batch reads from `from`, each next one from where
/// the last ended ([`queue::prune::Pruned::last`]), so that a pass reads the dead index
/// entries of the rows deleted before it once, not once per batch; and [`run`] starts most
/// passes where the last one ended, so that under a held xmin horizon a pass does not walk the
/// entries of every row deleted since the hold began, which grow with the hold until they take
/// longer than the statement timeout. A row left before the position (locked by another
/// deleter, or its finish committed late) is pruned by the next pass from the oldest, at most
/// [`FROM_START_EVERY`] passes later (docs/design.md, "Vacuum"). Returns how many rows it
/// deleted and where it ended: the latest `finished_at` among them, or `from` when it deleted
/// none.
async fn pass(
    pool: &Pool,
    older_than: Duration,
    mut from: Option<DateTime<Utc>>,
) -> Result<(u64, Option<DateTime<Utc>>), DbError> {
    let client = pool.get().await?;
    let mut total = 0;
    loop {
        let pruned = client
            .bounded(queue::prune(&client, older_than, BATCH, from))
            .await?;
        let deleted = pruned.deleted;
        from = pruned.last.or(from);
        total += deleted;
        if deleted < BATCH as u64 {
            if total > 0 {
                tracing::info!(deleted = total, "finished rows pruned");
            }
            return Ok((total, from));
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
