//! One try at a time for every claim settled alone while the database refuses them.
//!
//! During an outage each claim settled alone would retry on its own backoff: with a hundred
//! claims running when the database went, that is a hundred connection attempts every few
//! seconds, and a burst of them against a server still starting up. Instead the claims that
//! found the database away take turns: one waits the next delay of a shared backoff (50 ms
//! doubling to 5 s, jittered) and tries its write, while the others queue; once a write
//! works (this claim's, or a finish batch's), every claim waiting tries again at once, each
//! still bounded by the completer's share of the pool. A server that gives sessions but
//! refuses the writes (a standby at the daemon's address, a database made read-only) is thus
//! tried once per delay too, not once per claim.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;

use crate::backoff::Backoff;

/// The turns' delays: the first soon (a dropped connection is often back at once), then
/// growing to the cap.
const TURN_BASE: Duration = Duration::from_millis(50);
const TURN_CAP: Duration = Duration::from_secs(5);

/// Writes that worked, and the turns of the claims waiting for the next one.
#[derive(Debug)]
pub(super) struct Reachable {
    /// How many writes worked: a claim reads it before its try, and its wait ends at once if
    /// it moved meanwhile.
    worked: AtomicU64,
    /// Held by the claim whose turn it is, while it waits its delay; the others queue.
    turns: Mutex<Turns>,
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
        }
    }
}

impl Reachable {
    /// Read before a try: what [`Reachable::turn`] compares with.
    pub(super) fn seen(&self) -> u64 {
        self.worked.load(Ordering::Acquire)
    }

    /// A write worked (a claim settled alone, a finish batch): the database takes writes.
    pub(super) fn worked(&self) {
        self.worked.fetch_add(1, Ordering::AcqRel);
    }

    /// Wait for this claim's next try, its try having failed for an outage after `seen` was
    /// read: at once if a write worked since, else its turn, after the next delay.
    pub(super) async fn turn(&self, seen: u64) {
        let mut turns = self.turns.lock().await;
        let now = self.worked.load(Ordering::Acquire);
        if now != seen {
            return;
        }
        if turns.since != now {
            turns.since = now;
            turns.backoff.reset();
        }
        let delay = turns.backoff.next_delay();
        tokio::time::sleep(delay).await;
    }
}
