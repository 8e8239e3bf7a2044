//! One wait for the database for every claim settled alone while it is unreachable.
//!
//! During an outage each claim settled alone would retry on its own backoff: with a hundred
//! claims running when the database went, that is a hundred connection attempts every few
//! seconds, and a burst of them against a server still starting up. Instead, the first claim
//! that finds the database away probes it (a session from the pool) on a capped, jittered
//! backoff; the others wait for that probe. Once it gets a session every waiting claim tries
//! its write again, each still bounded by the completer's share of the pool. A claim whose
//! try fails again waits for the next probe.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;

use crate::backoff::Backoff;
use crate::db::Pool;

/// The probe's delays: the first soon (a dropped connection is often back at once), then
/// growing to the cap.
const PROBE_BASE: Duration = Duration::from_millis(50);
const PROBE_CAP: Duration = Duration::from_secs(5);

/// Whether the database answered since a claim last tried it.
#[derive(Debug, Default)]
pub(super) struct Reachable {
    /// How many probes got a session: a claim reads it before its try, and its wait ends at
    /// once if it moved meanwhile.
    answered: AtomicU64,
    /// Held by the one claim probing; the others queue behind it.
    probe: Mutex<()>,
}

impl Reachable {
    /// Read before a try: what [`Reachable::answered_since`] compares with.
    pub(super) fn seen(&self) -> u64 {
        self.answered.load(Ordering::Acquire)
    }

    /// Return once the database gave a session after `seen` was read: at once if a probe
    /// already did, else after this claim's own probe, or the one it queued behind, did.
    pub(super) async fn answered_since(&self, seen: u64, pool: &Pool) {
        let _probing = self.probe.lock().await;
        if self.answered.load(Ordering::Acquire) != seen {
            return;
        }
        let mut backoff = Backoff::new(PROBE_BASE, PROBE_CAP);
        loop {
            tokio::time::sleep(backoff.next_delay()).await;
            if pool.get().await.is_ok() {
                self.answered.fetch_add(1, Ordering::AcqRel);
                return;
            }
        }
    }
}
