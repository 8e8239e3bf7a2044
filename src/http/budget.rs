//! The byte budget of the answers that carry a large payload or output
//! (`http.max_inflight_bytes`), taken by `GET /tasks/{id}` (`tasks.rs`).
//!
//! A 100 MB payload read by five clients at once took the daemon from 158 to 729 MB: each
//! answer held the row, the payload as a string and the JSON it became. Now a read of a
//! payload over [`UNCOUNTED_PAYLOAD`] first takes its size from the budget ([`ReadBudget`]),
//! then reads the row and writes its JSON from the row's buffer a chunk at a time as hyper
//! takes it (`streamed.rs`), and gives the bytes back once hyper has taken the last of the
//! answer. A read that finds no room is 503 with `Retry-After` at once, rather than
//! holding its connection and its request while it waits; a read always goes when no other
//! holds any of the budget, so a payload larger than the whole budget is still answered,
//! alone. The bytes held by the answers thus stay under the budget plus the largest payload,
//! as the worker's own `worker.max_inflight_bytes`.

use std::sync::{Arc, Mutex, MutexGuard};

/// Payloads and outputs up to this many bytes together are read with the rest of the row
/// and not counted.
pub(super) const UNCOUNTED_PAYLOAD: i64 = 64 << 10;

/// The bytes of the answers in progress, against `http.max_inflight_bytes`.
#[derive(Debug)]
pub(crate) struct ReadBudget {
    max: u64,
    held: Mutex<u64>,
}

impl ReadBudget {
    pub(crate) fn new(max: u64) -> Arc<ReadBudget> {
        Arc::new(ReadBudget {
            max,
            held: Mutex::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, u64> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `bytes` of the budget, when they fit in what is left or nothing is held; `None`
    /// otherwise.
    pub(super) fn try_take(self: &Arc<Self>, bytes: u64) -> Option<Share> {
        let mut held = self.lock();
        if *held != 0 && held.saturating_add(bytes) > self.max {
            return None;
        }
        *held += bytes;
        Some(Share {
            budget: Arc::clone(self),
            bytes,
        })
    }
}

/// One answer's part of the budget, given back when dropped.
#[derive(Debug)]
pub(super) struct Share {
    budget: Arc<ReadBudget>,
    bytes: u64,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.budget.lock();
        *held = held.saturating_sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_fits_what_is_left_or_goes_alone() {
        let budget = ReadBudget::new(100);
        let alone = budget.try_take(250).expect("nothing held: any size goes");
        assert!(budget.try_take(1).is_none());
        drop(alone);
        let first = budget.try_take(60).unwrap();
        let second = budget.try_take(40).unwrap();
        assert!(budget.try_take(1).is_none());
        drop(second);
        let third = budget.try_take(40).unwrap();
        assert!(budget.try_take(1).is_none());
        drop(first);
        drop(third);
        assert_eq!(*budget.lock(), 0);
    }
}
