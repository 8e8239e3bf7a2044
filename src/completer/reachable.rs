//! One try at a time for every claim settled alone while the database refuses them.
//!
//! During an outage each claim settled alone would retry on its own backoff: with a hundred
//! claims running when the database went, that is a hundred connection attempts every few
//! seconds, and a burst of them against a server still starting up. Instead the claims that
//! found the database away take turns: one waits the next delay of a shared backoff (50 ms
//! doubling to 5 s, jittered) and tries its write, while the others queue; once a write
//! works (this claim's, or a finish batch's), every claim waiting tries again at once, each
//! still bounded by the completer's share of the pool; so does the claim waiting its delay
//! (a write that works wakes it, the lease heartbeat's included, and so does the start of a
//! stop, after which no delay is longer than 200 ms). A server that gives sessions but
//! refuses the writes (a standby at the daemon's address, a database made read-only) is thus
//! tried once per delay too, not once per claim.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, Notify};

use crate::backoff::Backoff;

/// The turns' delays: the first soon (a dropped connection is often back at once), then
/// growing to the cap.
const TURN_BASE: Duration = Duration::from_millis(50);
const TURN_CAP: Duration = Duration::from_secs(5);

/// The longest turn once the daemon is stopping: its last writes have a bound of their own
/// (a few seconds), which a turn of [`TURN_CAP`] would spend asleep while the database is back.
const HURRIED_CAP: Duration = Duration::from_millis(200);

/// Writes that worked, and the turns of the claims waiting for the next one.
#[derive(Debug)]
pub(super) struct Reachable {
    /// How many writes worked: a claim reads it before its try, and its wait ends at once if
    /// it moved meanwhile.
    worked: AtomicU64,
    /// Held by the claim whose turn it is, while it waits its delay; the others queue.
    turns: Mutex<Turns>,
    /// Wakes the claim waiting its delay when a write works or the stop begins.
    woken: Notify,
    /// The daemon is stopping: turns are at most [`HURRIED_CAP`].
    hurried: AtomicBool,
}

#[derive(Debug)]
struct Turns {
    backoff: Backoff,
    /// `worked` when the backoff last started over: a write that worked since starts it over.
    since: u64,
}

impl Default for Reachable {
    fn default() -> Self {
        Reachable {
            worked: AtomicU64::new(0),
            turns: Mutex::new(Turns {
                backoff: Backoff::new(TURN_BASE, TURN_CAP),
                since: 0,
            }),
            woken: Notify::new(),
            hurried: AtomicBool::new(false),
        }
    }
}

impl Reachable {
    /// Read before a try: what [`Reachable::turn`] compares with.
    pub(super) fn seen(&self) -> u64 {
        self.worked.load(Ordering::Acquire)
    }

    /// A write worked (a claim settled alone, a finish batch, the lease heartbeat): the
    /// database takes writes. The claim waiting its delay tries at once.
    pub(super) fn worked(&self) {
        self.worked.fetch_add(1, Ordering::AcqRel);
        self.woken.notify_waiters();
    }

    /// Wait until a write worked after `seen` was read (at once if one did already).
    pub(super) async fn worked_since(&self, seen: u64) {
        loop {
            let woken = self.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.worked.load(Ordering::Acquire) != seen {
                return;
            }
            woken.await;
        }
    }

    /// The daemon is stopping: the claim waiting its delay tries at once, and no turn is
    /// longer than [`HURRIED_CAP`] from now on.
    pub(super) fn hurry(&self) {
        self.hurried.store(true, Ordering::Release);
        self.woken.notify_waiters();
    }

    /// Wait for this claim's next try, its try having failed for an outage after `seen` was
    /// read: at once if a write worked since, else its turn, after the next delay or as soon
    /// as a write works or the stop begins.
    pub(super) async fn turn(&self, seen: u64) {
        let mut turns = self.turns.lock().await;
        // Registered before the check, so that a write working in between still wakes it.
        let woken = self.woken.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let now = self.worked.load(Ordering::Acquire);
        if now != seen {
            return;
        }
        if turns.since != now {
            turns.since = now;
            turns.backoff.reset();
        }
        let mut delay = turns.backoff.next_delay();
        if self.hurried.load(Ordering::Acquire) {
            delay = delay.min(HURRIED_CAP);
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = woken => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Many failed tries: the next turn's delay is at the cap.
    async fn grown(reachable: &Reachable) {
        let seen = reachable.seen();
        let mut turns = reachable.turns.lock().await;
        turns.since = seen;
        for _ in 0..20 {
            turns.backoff.next_delay();
        }
    }

    /// A claim waiting its turn, 100 ms into its delay.
    async fn waiting_turn(reachable: &Arc<Reachable>, seen: u64) -> tokio::task::JoinHandle<()> {
        let waiting = tokio::spawn({
            let reachable = Arc::clone(reachable);
            async move { reachable.turn(seen).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "the turn waits its delay");
        waiting
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_works_ends_the_wait_of_the_claim_whose_turn_it_is() {
        let reachable = Arc::new(Reachable::default());
        grown(&reachable).await;
        let seen = reachable.seen();
        let waiting = waiting_turn(&reachable, seen).await;
        let woken_at = tokio::time::Instant::now();
        reachable.worked();
        waiting.await.unwrap();
        assert!(woken_at.elapsed() < Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait_and_caps_every_later_turn() {
        let reachable = Arc::new(Reachable::default());
        grown(&reachable).await;
        let seen = reachable.seen();
        let waiting = waiting_turn(&reachable, seen).await;
        reachable.hurry();
        waiting.await.unwrap();
        for _ in 0..5 {
            let started = tokio::time::Instant::now();
            reachable.turn(seen).await;
            assert!(started.elapsed() <= HURRIED_CAP, "{:?}", started.elapsed());
        }
    }
}
