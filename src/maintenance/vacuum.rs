//! The daemon's own `VACUUM` of `pgtaskd.task_state` (docs/design.md, "Vacuum"): run once the row
//! versions this daemon made dead since its last vacuum reach [`VACUUM_AFTER`], looking every
//! second. Started by `maintenance::start`; nothing else vacuums from the daemon.
//!
//! What counts as made dead:
//!
//! - the rows retention deleted ([`super::retention`] adds them to the shared count), always:
//!   autovacuum visits a database at most once per `autovacuum_naptime`, and between two visits
//!   a busy queue with retention writes a minute of dead rows into new pages;
//! - while autovacuum leaves the table alone (off in the server, or `autovacuum_enabled =
//!   false` on the table; read again every minute), two per claim once it is settled: the
//!   claim's update left the QUEUED version behind, the finish's (or release's) the RUNNING
//!   one. Counted at the finish, not at the claim: a burst claimed ahead all at once would
//!   otherwise start a vacuum before any of its versions were dead, and the next would wait
//!   for as many claims again. Without a vacuum those
//!   versions stay for good, and the claims' index of QUEUED rows keeps an entry for each, which
//!   every later claim walks past: the claim's cost would grow with every task ever run.
//!
//! Only a role that may vacuum the table does (its owner, the role that ran `pgtaskd migrate`,
//! or the database's owner); under any other it never does, and says so once (a warning where
//! autovacuum is off too: then nothing vacuums the table). The `VACUUM` runs on a session of
//! its own, opened for it, with no statement timeout (a first vacuum of a large table may take
//! minutes, and blocks no claim: it takes only a `SHARE UPDATE EXCLUSIVE` lock), never on a
//! pooled session the workers need. After a vacuum that took `d`, the next waits `d`, so that
//! vacuums take at most half the time however fast the queue turns; except after one that had
//! at least `MUCH_TO_REMOVE` dead row versions to remove (a busy queue, the end of a held
//! horizon), whose length is that work: the next waits at most `MAX_PAUSE`, and then has
//! less (a vacuum that is long because the table's indexes are large, each read whole, keeps
//! the half). One that failed is
//! tried again a minute later. `SKIP_LOCKED`: a vacuum already running (autovacuum's, another
//! daemon's) makes this one a no-op.
//!
//! A vacuum cannot remove what became dead after the oldest xmin horizon (a long report, a
//! forgotten `BEGIN`, a replica's feedback), and while that horizon stays where it is, each
//! vacuum reads every page written since for nothing: measured, vacuums back to back took
//! about a core from the claims and finishes during a two-minute held snapshot. So after a
//! vacuum that left at least [`VACUUM_AFTER`] dead row versions behind, the next one waits
//! until the horizon read before it (`pgtaskd.vacuum_health()`) has moved, and at most
//! `HELD_WAIT_MAX` (`Held`); it runs as soon as the horizon is released. A horizon that
//! cannot be read never makes a vacuum wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::db::{ConnectSettings, DbError, Pool};
use crate::metrics::Metrics;
use crate::queue;

/// Dead row versions after which the daemon vacuums: the table's own autovacuum threshold
/// (`pgtaskd.task_state`'s storage parameters in sql/schema.sql).
pub const VACUUM_AFTER: u64 = 5000;
/// How often the count is looked at.
const CHECK: Duration = Duration::from_secs(1);
/// How often whether autovacuum covers the table is read again.
const RECHECK: Duration = Duration::from_secs(60);
/// The longest pause after a vacuum. Waiting as long as the vacuum took, a vacuum of a minute
/// (the one after a two-minute held snapshot, at 16,600 tasks/s) was followed by a minute with
/// none, whose dead versions the next one took as long to remove: the table grew again
/// (docs/performance.md).
const MAX_PAUSE: Duration = Duration::from_secs(5);
const _: () = assert!(MAX_PAUSE.as_millis() >= CHECK.as_millis());
/// Dead row versions (the statistics' estimate, before the vacuum) from which the pause after
/// a vacuum is at most `MAX_PAUSE`.
const MUCH_TO_REMOVE: i64 = 20 * VACUUM_AFTER as i64;
/// How long after a failed vacuum the next is tried.
const RETRY: Duration = Duration::from_secs(60);
/// The longest a vacuum waits for a horizon that held back the last one: a reading that
/// missed the horizon's move (the oldest holder is in another database, say) delays vacuums
/// by no more.
const HELD_WAIT_MAX: Duration = Duration::from_secs(300);

/// Vacuum whenever due until `stop` fires, or until the daemon may not vacuum the table.
/// `pruned` counts the rows retention deleted since the last vacuum; `metrics` the claims and
/// the progress rows written, each of which leaves dead row versions behind.
/// Checks go through `pool`; each vacuum opens a session from `settings`.
pub async fn run(
    pool: Pool,
    settings: ConnectSettings,
    pruned: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut allowed: Option<bool> = None;
    let mut claims_at_vacuum = metrics.settled() + metrics.progress_writes();
    let mut autovacuum_off: Option<(bool, Instant)> = None;
    let mut held = Held::default();
    loop {
        if autovacuum_off.is_none_or(|(_, at)| at.elapsed() >= RECHECK) {
            match read_autovacuum_off(&pool).await {
                Ok(off) => {
                    if autovacuum_off.map(|(was, _)| was) != Some(off) && off {
                        tracing::info!(
                            "autovacuum does not vacuum pgtaskd.task_state: the daemon vacuums it after every {VACUUM_AFTER} row versions its claims and finishes leave behind"
                        );
                    }
                    autovacuum_off = Some((off, Instant::now()));
                }
                Err(err) => {
                    tracing::debug!(error = %err, "cannot read whether autovacuum covers pgtaskd.task_state");
                }
            }
        }
        let off = autovacuum_off.is_some_and(|(off, _)| off);
        let seen = pruned.load(Ordering::Relaxed);
        let claims = metrics.settled() + metrics.progress_writes();
        let by_claims = if off {
            2 * claims.saturating_sub(claims_at_vacuum)
        } else {
            // Claims count only while autovacuum is off: a later switch starts from now.
            claims_at_vacuum = claims;
            0
        };
        let mut pause = CHECK;
        if seen + by_claims >= VACUUM_AFTER {
            if allowed.is_none() {
                allowed = may_vacuum(&pool, off).await;
            }
            match allowed {
                Some(false) => return,
                None => pause = RETRY,
                Some(true) => {
                    let before = super::vacuum_health::read(&pool).await.ok();
                    let dead_before = before.as_ref().map_or(0, |h| h.dead_tuples);
                    let horizon = before.and_then(|h| h.horizon).map(|h| h.xid);
                    if held.waits(horizon, Instant::now()) {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(CHECK) => {}
                        }
                        continue;
                    }
                    let started = Instant::now();
                    let vacuumed = tokio::select! {
                        _ = stop.cancelled() => return,
                        vacuumed = vacuum(&settings) => vacuumed,
                    };
                    match vacuumed {
                        Ok(()) => {
                            pruned.fetch_sub(seen, Ordering::Relaxed);
                            claims_at_vacuum = claims;
                            pause = started.elapsed().max(CHECK);
                            if dead_before >= MUCH_TO_REMOVE {
                                pause = pause.min(MAX_PAUSE);
                            }
                            let left = super::vacuum_health::read(&pool)
                                .await
                                .ok()
                                .map(|h| h.dead_tuples);
                            if let Some(xid) = held.vacuumed(horizon, left, Instant::now()) {
                                tracing::info!(
                                    xid,
                                    dead_tuples = left.unwrap_or_default(),
                                    "the vacuum of pgtaskd.task_state left dead row versions behind an xmin horizon held back; the next vacuum waits until the horizon moves (at most {} s)",
                                    HELD_WAIT_MAX.as_secs()
                                );
                            }
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "the daemon could not vacuum pgtaskd.task_state; trying again in a minute");
                            pause = RETRY;
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// The horizon the last vacuum could not get past, and what it makes the next one do.
#[derive(Debug, Default)]
struct Held {
    /// The horizon's transaction id, read before that vacuum, and when the vacuum ended.
    at: Option<(i64, Instant)>,
}

impl Held {
    /// A vacuum that began with the horizon at `horizon` ended at `now`, leaving `left` dead
    /// row versions (`None`: not known). Returns the horizon when it is newly held: at least
    /// [`VACUUM_AFTER`] were left, and the held horizon is not the one already known.
    fn vacuumed(&mut self, horizon: Option<i64>, left: Option<i64>, now: Instant) -> Option<i64> {
        let was = self.at.map(|(xid, _)| xid);
        self.at = match (horizon, left) {
            (Some(xid), Some(left)) if left >= VACUUM_AFTER as i64 => Some((xid, now)),
            _ => None,
        };
        let held = self.at.map(|(xid, _)| xid);
        held.filter(|xid| was != Some(*xid))
    }

    /// Whether a due vacuum waits at `now`, the horizon being `horizon`: it is the one that
    /// held back the last vacuum, and has been for less than [`HELD_WAIT_MAX`].
    fn waits(&self, horizon: Option<i64>, now: Instant) -> bool {
        match (self.at, horizon) {
            (Some((xid, since)), Some(now_xid)) => {
                xid == now_xid && now.saturating_duration_since(since) < HELD_WAIT_MAX
            }
            _ => false,
        }
    }
}

async fn read_autovacuum_off(pool: &Pool) -> Result<bool, DbError> {
    let client = pool.get().await?;
    client.bounded(queue::prune::autovacuum_off(&client)).await
}

/// Whether this daemon's role may vacuum the table (`None`: not known, the database did not
/// answer). A refusal is said once, as a warning when `autovacuum_off`.
async fn may_vacuum(pool: &Pool, autovacuum_off: bool) -> Option<bool> {
    let asked = async {
        let client = pool.get().await?;
        client.bounded(queue::prune::may_vacuum(&client)).await
    }
    .await;
    match asked {
        Ok(true) => Some(true),
        Ok(false) if autovacuum_off => {
            tracing::warn!(
                "nothing vacuums pgtaskd.task_state: autovacuum is off for it and this daemon's role does not own it; vacuum it from a job of the owner's, or turn autovacuum on"
            );
            Some(false)
        }
        Ok(false) => {
            tracing::info!(
                "the daemon leaves vacuuming pgtaskd.task_state to autovacuum: this role does not own it"
            );
            Some(false)
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot read whether this role may vacuum pgtaskd.task_state");
            None
        }
    }
}

/// One `VACUUM` on a session of its own, without a statement timeout.
async fn vacuum(settings: &ConnectSettings) -> Result<(), DbError> {
    let client = settings.connect().await?;
    client.batch_execute("SET statement_timeout = 0").await?;
    queue::prune::vacuum(&client).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANY: Option<i64> = Some(VACUUM_AFTER as i64);

    #[test]
    fn a_vacuum_that_left_many_dead_versions_makes_the_next_wait_for_the_horizon_to_move() {
        let mut held = Held::default();
        let t0 = Instant::now();
        assert_eq!(held.vacuumed(Some(700), MANY, t0), Some(700));
        assert!(held.waits(Some(700), t0 + Duration::from_secs(1)));
        assert!(!held.waits(Some(701), t0 + Duration::from_secs(1)), "moved");
        assert!(!held.waits(None, t0 + Duration::from_secs(1)), "released");
    }

    #[test]
    fn a_held_horizon_delays_vacuums_by_at_most_the_longest_wait() {
        let mut held = Held::default();
        let t0 = Instant::now();
        held.vacuumed(Some(700), MANY, t0);
        assert!(held.waits(Some(700), t0 + HELD_WAIT_MAX - Duration::from_millis(1)));
        assert!(!held.waits(Some(700), t0 + HELD_WAIT_MAX));
        // The vacuum run then left as many: the same horizon, not said again, waits again.
        assert_eq!(held.vacuumed(Some(700), MANY, t0 + HELD_WAIT_MAX), None);
        assert!(held.waits(Some(700), t0 + HELD_WAIT_MAX + Duration::from_secs(1)));
    }

    #[test]
    fn a_vacuum_that_left_few_or_an_unknown_count_or_horizon_makes_none_wait() {
        let t0 = Instant::now();
        let few = Some(VACUUM_AFTER as i64 - 1);
        for (horizon, left) in [(Some(700), few), (Some(700), None), (None, MANY)] {
            let mut held = Held::default();
            assert_eq!(held.vacuumed(horizon, left, t0), None);
            assert!(!held.waits(Some(700), t0), "{horizon:?} {left:?}");
        }
        let mut held = Held::default();
        held.vacuumed(Some(700), MANY, t0);
        assert!(
            !held.waits(None, t0),
            "a horizon that cannot be read never waits"
        );
    }
}
