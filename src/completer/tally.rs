//! What settling claims alone came to, for the log: the first claim of a burst says so, the
//! last sums the burst up (docs/design.md, "Settle before rescuing"). A burst that only waited
//! for rows another claim held locked for a moment is a healthy drain's, said at debug level.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::queue::{FinishError, TaskStatus};

use super::resolve::Why;

/// What settling alone came to, for the one summary line of a burst of it.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Claims being settled alone now.
    settling: AtomicUsize,
    /// Whether this burst was said at WARN (one not of a locked row came in it).
    warned: AtomicBool,
    written: AtomicUsize,
    landed: AtomicUsize,
    lost: AtomicUsize,
    /// Given up on an unreachable database at a stop: still RUNNING, its lease left to expire.
    unsettled: AtomicUsize,
    pub(super) retries: AtomicUsize,
}

impl Tally {
    /// A claim starts settling alone; the first of a burst that is not a lock's says so at
    /// WARN. A row locked by a claim scanning past it (held until that claim commits, a few
    /// milliseconds) is part of a healthy drain: it waits for that lock, said at debug level.
    pub(super) fn start(&self, id: i64, why: Why) {
        let first = self.settling.fetch_add(1, Ordering::AcqRel) == 0;
        if why == Why::Locked {
            if first {
                tracing::debug!(
                    id,
                    "settling claims one by one: a row held locked meanwhile"
                );
            }
        } else if !self.warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(id, ?why, "settling claims one by one");
        }
    }

    /// A claim settled alone; the last of a burst sums the burst up.
    pub(super) fn end(&self, result: &Result<TaskStatus, FinishError>, had_landed: bool) {
        match result {
            Ok(_) if had_landed => &self.landed,
            Ok(_) => &self.written,
            Err(FinishError::Db(_)) => &self.unsettled,
            Err(_) => &self.lost,
        }
        .fetch_add(1, Ordering::AcqRel);
        if self.settling.fetch_sub(1, Ordering::AcqRel) == 1 {
            let take = |n: &AtomicUsize| n.swap(0, Ordering::AcqRel);
            let (written, already_landed, claim_lost, unsettled, retries) = (
                take(&self.written),
                take(&self.landed),
                take(&self.lost),
                take(&self.unsettled),
                take(&self.retries),
            );
            // Summed up at the level the burst began at.
            if self.warned.swap(false, Ordering::AcqRel) {
                tracing::info!(
                    written,
                    already_landed,
                    claim_lost,
                    unsettled,
                    retries,
                    "claims settled one by one"
                );
            } else {
                tracing::debug!(
                    written,
                    already_landed,
                    claim_lost,
                    unsettled,
                    retries,
                    "claims settled one by one"
                );
            }
        }
    }
}
