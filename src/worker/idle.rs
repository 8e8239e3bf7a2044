//! What follows a scan: linger, flag the daemon idle, watch the window, clear the flag
//! (docs/design.md, "Idle flags").
//!
//! Inserts notify only while some daemon's flag in `pgtaskd.idle_daemons` is live, so a
//! daemon must be flagged whenever it relies on a notification, and should not be while it
//! finds work by itself:
//!
//! - A claim that finds work makes the daemon busy: its flag, if any, is expired at once by
//!   a statement of its own, off the claim path, however long the scan then goes on. After
//!   the scan it lingers: it scans again every
//!   [`LINGER_TICK`] without being asked, until [`LINGER`] has passed since the last scan that
//!   found work. Under a steady stream (arrivals closer than that) it never flags itself, and
//!   producers never notify; a stream slow enough to flag between two tasks notifies rarely
//!   enough for the commit lock not to matter.
//! - A daemon with no room for another task (every worker busy, nothing to claim ahead, or
//!   its byte budget spent) is busy too: it does not flag itself, and scans again as soon as
//!   room is given back.
//! - A scan that found nothing after the linger, with room, flags the daemon idle, reads which
//!   transactions were then in progress (one round trip for both), and scans once more: a
//!   producer whose trigger read the flags before they held this one either committed before
//!   that last claim (which sees its rows) or is one of those transactions.
//! - While flagged, the daemon waits for a notification, its poll tick, or the next check of
//!   those transactions (1, 2, 4, ... ms after the flag: [`WATCH_FIRST`], doubling): when one
//!   of them has committed, it scans again. A producer transaction that inserted while the
//!   daemon was busy and commits `t` after it went idle is found within about `t` more, and
//!   by the poll tick at the latest.
//! - At every poll tick an idle daemon renews its flag the same way (flag, read the
//!   transactions, scan), so the flag lives [`ttl`] from then: two poll intervals and a
//!   second. A daemon killed without removing it stops counting then. A flag lost otherwise
//!   (a crash or a promotion empties the unlogged table) is written again after the
//!   listener's next session, or at the next poll tick; meanwhile inserts wait for that tick.
//!
//! Called by [`Worker::run`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::claim::Scan;
use super::Worker;
use crate::queue;

/// How long a daemon that found work goes on scanning by itself before it flags itself idle.
pub(super) const LINGER: Duration = Duration::from_millis(5);
/// How often it scans while it lingers.
pub(super) const LINGER_TICK: Duration = Duration::from_millis(1);
/// The first check of the transactions in progress when the flag was written; each next one
/// waits twice as long, until they have all ended or the poll tick comes.
pub(super) const WATCH_FIRST: Duration = Duration::from_millis(1);

/// How long a flag lives: renewed at every poll tick (at most one poll interval apart, each
/// after a scan), it outlives two of them.
pub fn ttl(poll_interval: Duration) -> Duration {
    poll_interval * 2 + Duration::from_secs(1)
}

/// Whether this worker's flag is written, shared with the claims of a scan: the first claim
/// that finds work removes it at once, however long the scan then goes on.
#[derive(Default)]
pub(super) struct Flag {
    /// The flag was written and not yet removed.
    flagged: AtomicBool,
    /// The statement removing the flag, while it may still be on its way: a new flag waits
    /// for it, so that a late removal never takes a new flag away.
    clearing: Mutex<Option<JoinHandle<()>>>,
}

/// The producer loop's own state: when it last found work, when it last wrote its flag, and
/// the transactions it watches.
#[derive(Default)]
pub(super) struct IdleState {
    /// When the last scan that claimed something ended; `None` before the first.
    last_work: Option<Instant>,
    /// When the flag was last written, while the daemon counts as flagged.
    flagged_at: Option<Instant>,
    /// The transactions in progress when the flag was written, not yet seen ending.
    watched: Vec<String>,
    /// When to check them next, and how long that wait was.
    watch_at: Option<(Instant, Duration)>,
    /// The last attempt to write the flag failed: the next is made at the poll tick.
    flag_failed: bool,
}

/// What the loop waits for after a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Scan again after this long (lingering, or a failed scan's poll), unless woken first.
    Scan(Duration),
    /// Busy, with no room for another task: scan again once some is given back (or when
    /// woken, or at the poll tick).
    Room,
    /// Idle: wait for a notification or the poll tick; check the watched transactions at
    /// this instant if it comes first.
    Idle { watch_at: Option<Instant> },
}

impl IdleState {
    /// Still lingering at `now` after the last scan that found work.
    fn lingering(&self, now: Instant) -> bool {
        self.last_work
            .is_some_and(|at| now.saturating_duration_since(at) < LINGER)
    }

    /// What to wait for at `now`, after `scan`, whose work (if any) [`Worker::after_scan`]
    /// has recorded, with or without `room` for another task.
    pub(super) fn wait(&self, now: Instant, scan: Scan, poll: Duration, room: bool) -> Wait {
        if scan.failed || self.flag_failed {
            // The database is in trouble: scan at the poll tick.
            Wait::Scan(poll)
        } else if self.flagged_at.is_none() && !room && !self.lingering(now) {
            Wait::Room
        } else if self.flagged_at.is_none() {
            // Lingering; or the linger ended after this scan began: the next scan flags the
            // daemon idle.
            Wait::Scan(LINGER_TICK)
        } else {
            Wait::Idle {
                watch_at: self.watch_at.map(|(at, _)| at),
            }
        }
    }
}

impl Worker {
    /// Record what `scan` found: work makes the daemon busy. Returns true when the daemon
    /// has just flagged itself idle: the caller scans once more at once (the last claim).
    pub(super) async fn after_scan(&self, state: &mut IdleState, scan: Scan) -> bool {
        if scan.claimed > 0 {
            // Its first claim that found work removed the flag.
            state.last_work = Some(Instant::now());
            state.flagged_at = None;
            state.flag_failed = false;
            state.watch_at = None;
            state.watched.clear();
            return false;
        }
        if scan.failed || state.lingering(Instant::now()) || !self.inner.intake.has_room() {
            // Without room a notification would find nothing to do: the daemon scans again
            // once room is given back.
            return false;
        }
        // A new listener session: the flag may have been lost with the server (a crash or a
        // promotion empties the table), so it is written again.
        let relisten = self.inner.relisten.swap(false, Ordering::AcqRel);
        let refresh = self.inner.config.poll_interval / 2;
        let due = match state.flagged_at {
            None => true,
            Some(at) => relisten || at.elapsed() >= refresh,
        };
        if !due {
            return false;
        }
        let clearing = match self.inner.flag.clearing.lock() {
            Ok(mut slot) => slot.take(),
            Err(_) => None,
        };
        if let Some(clearing) = clearing {
            let _ = clearing.await;
        }
        let ttl = ttl(self.inner.config.poll_interval);
        let flagged = async {
            let client = self.inner.pool.get().await?;
            client
                .bounded(queue::flag_idle(&client, &self.flag_key(), ttl))
                .await
        }
        .await;
        match flagged {
            Ok(xids) => {
                self.inner.flag.flagged.store(true, Ordering::Release);
                state.flag_failed = false;
                let now = Instant::now();
                state.flagged_at = Some(now);
                state.watch_at = (!xids.is_empty()).then_some((now + WATCH_FIRST, WATCH_FIRST));
                state.watched = xids;
                true
            }
            Err(err) => {
                // Inserts then do not notify this daemon: it scans at its poll tick.
                state.flagged_at = None;
                state.flag_failed = true;
                state.watch_at = None;
                state.watched.clear();
                tracing::warn!(error = %err, "cannot flag this daemon idle; scanning at the poll tick");
                false
            }
        }
    }

    /// The watched transactions' check is due: returns true when one of them committed, so
    /// that its rows may be waiting.
    pub(super) async fn check_watched(&self, state: &mut IdleState) -> bool {
        let Some((_, waited)) = state.watch_at.take() else {
            return false;
        };
        let settled = async {
            let client = self.inner.pool.get().await?;
            client
                .bounded(queue::settled(&client, &state.watched))
                .await
        }
        .await;
        let committed = match settled {
            Ok((open, committed)) => {
                state.watched = open;
                committed
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot check the transactions open when this daemon went idle; scanning now");
                state.watched.clear();
                true
            }
        };
        if !state.watched.is_empty() {
            // Until the poll tick, which writes the flag again and reads the transactions
            // anew.
            let next = waited * 2;
            state.watch_at = Some((Instant::now() + next, next));
        }
        committed
    }

    /// A claim found work: remove the flag, if it is written, on a session of its own, so
    /// that the claim path never waits for it.
    pub(super) fn found_work(&self) {
        let flag = &self.inner.flag;
        if !flag.flagged.swap(false, Ordering::AcqRel) {
            return;
        }
        let clearing = tokio::spawn(self.clone().clear_flag(false));
        if let Ok(mut slot) = flag.clearing.lock() {
            *slot = Some(clearing);
        }
    }

    /// Expire this daemon's flag (its row stays, for the next flag), or delete it when the
    /// daemon stops (`remove`). A failure leaves it to expire: inserts notify in vain until
    /// then.
    pub(super) async fn clear_flag(self, remove: bool) {
        let cleared = async {
            let client = self.inner.pool.get().await?;
            let instance = &self.flag_key();
            if remove {
                client.bounded(queue::remove_idle(&client, instance)).await
            } else {
                client.bounded(queue::clear_idle(&client, instance)).await
            }
        }
        .await;
        if let Err(err) = cleared {
            tracing::debug!(error = %err, "cannot clear this daemon's idle flag; it expires by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL: Duration = Duration::from_secs(2);

    fn scan(claimed: usize, failed: bool) -> Scan {
        Scan {
            claimed,
            failed,
            again_in: None,
        }
    }

    #[test]
    fn after_a_scan_the_loop_lingers_waits_for_room_or_for_a_notification() {
        let t0 = Instant::now();
        let busy = IdleState {
            last_work: Some(t0),
            ..IdleState::default()
        };
        let watched_at = t0 + Duration::from_millis(3);
        let flagged = IdleState {
            flagged_at: Some(t0),
            watch_at: Some((watched_at, Duration::from_millis(2))),
            ..IdleState::default()
        };
        let flag_failed = IdleState {
            flag_failed: true,
            ..IdleState::default()
        };
        let cases = [
            // (state, now, scan, room, what to wait for)
            // A failed scan, or a flag that could not be written: the poll tick.
            (&busy, t0, scan(0, true), true, Wait::Scan(POLL)),
            (&flag_failed, t0, scan(0, false), true, Wait::Scan(POLL)),
            // Found work just now: linger, room or not.
            (&busy, t0, scan(3, false), true, Wait::Scan(LINGER_TICK)),
            (&busy, t0, scan(3, false), false, Wait::Scan(LINGER_TICK)),
            (
                &busy,
                t0 + LINGER / 2,
                scan(0, false),
                false,
                Wait::Scan(LINGER_TICK),
            ),
            // The linger is over: without room, wait for room; with room, the next scan
            // flags the daemon idle.
            (&busy, t0 + LINGER, scan(0, false), false, Wait::Room),
            (
                &busy,
                t0 + LINGER,
                scan(0, false),
                true,
                Wait::Scan(LINGER_TICK),
            ),
            // Never found work, no room: wait for room.
            (&IdleState::default(), t0, scan(0, false), false, Wait::Room),
            // Flagged: wait for a notification, the poll tick, or the watch.
            (
                &flagged,
                t0,
                scan(0, false),
                true,
                Wait::Idle {
                    watch_at: Some(watched_at),
                },
            ),
            (
                &flagged,
                t0,
                scan(0, false),
                false,
                Wait::Idle {
                    watch_at: Some(watched_at),
                },
            ),
        ];
        for (state, now, scan, room, expected) in cases {
            assert_eq!(
                state.wait(now, scan, POLL, room),
                expected,
                "at +{:?}, {scan:?}, room {room}",
                now - t0
            );
        }
    }
}
