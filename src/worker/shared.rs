//! What the lanes of one daemon share (`lanes.rs`), when it has several: the
//! `worker.concurrency` permits that cap their analyzers and handlers together, each lane's
//! count of tasks claimed and not started, the one lane that may hold a task of any size, and a
//! wake for every lane when a permit or payload bytes are given back.
//!
//! Each lane's intake (`intake.rs`) claims against both: no more tasks than the shared
//! permits free now could start, less the tasks every lane has claimed and not started (no
//! claiming ahead), so that a lane whose slow commands hold every permit never makes another
//! lane claim tasks that would wait for one, RUNNING under a lease that no other daemon can
//! take over (a hostile review: a default-queue task waited 28 s behind an `exec` queue's
//! timeouts while a second daemon sat idle; counting each lane's own only, lanes that looked
//! at once still did, 4 times in 10); and one lane at a time may take a task larger than its
//! share of the byte budget, so that N lanes never hold N such payloads at once (the review:
//! four lanes held four 100 MB payloads, 391 MiB, with a budget of 64 MiB), while small tasks
//! of the other lanes never keep it waiting (a payload larger than its lane's share waited
//! as long as any other lane held a byte).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How long a lane waiting for room sleeps at most before it looks again: a wake of
/// [`Shared::freed`] can come between its look and its wait.
pub(super) const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// The permits, counts and wake the lanes of one daemon share.
#[derive(Debug)]
pub struct Shared {
    permits: Arc<Semaphore>,
    lanes: Mutex<Lanes>,
    freed: Notify,
}

/// What every lane's intake writes of itself, under one lock.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    /// Each lane's tasks claimed, or being claimed, and not started: by lane number.
    pub(super) waiting: Vec<usize>,
    /// The lane that holds, or is claiming, a task of any size ([`Room::take_one`]
    /// (super::intake::Room)): one at a time.
    pub(super) oversize: Option<usize>,
}

impl Lanes {
    /// Tasks claimed and not started by every lane.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.iter().sum()
    }
}

impl Shared {
    /// For lanes that run at most `concurrency` tasks together.
    pub fn new(concurrency: usize) -> Arc<Shared> {
        Arc::new(Shared {
            permits: Arc::new(Semaphore::new(concurrency)),
            lanes: Mutex::new(Lanes::default()),
            freed: Notify::new(),
        })
    }

    /// The shared permits free now.
    pub(super) fn free_permits(&self) -> usize {
        self.permits.available_permits()
    }

    /// The shared permits, for one task to take one of.
    pub(super) fn permits(&self) -> &Arc<Semaphore> {
        &self.permits
    }

    /// A new lane's number.
    pub(super) fn join(&self) -> usize {
        let mut lanes = self.lanes();
        lanes.waiting.push(0);
        lanes.waiting.len() - 1
    }

    /// What every lane wrote of itself, locked: a lane's intake changes it under its own
    /// lock, then this one.
    pub(super) fn lanes(&self) -> MutexGuard<'_, Lanes> {
        self.lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A permit or bytes were given back: every lane waiting for room looks again.
    pub(super) fn wake(&self) {
        self.freed.notify_waiters();
    }

    /// Until [`Shared::wake`], or [`LOOK_AGAIN`].
    pub(super) async fn freed(&self) {
        let _ = tokio::time::timeout(LOOK_AGAIN, self.freed.notified()).await;
    }
}

/// One of the shared permits, held by one task: giving it back wakes every lane.
pub(super) struct SharedPermit {
    permit: Option<OwnedSemaphorePermit>,
    shared: Arc<Shared>,
}

impl SharedPermit {
    pub(super) fn new(permit: OwnedSemaphorePermit, shared: Arc<Shared>) -> SharedPermit {
        SharedPermit {
            permit: Some(permit),
            shared,
        }
    }
}

impl Drop for SharedPermit {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.shared.wake();
    }
}
