//! One claimed task's hold on its worker, as a guard: its entry in the registry (which the
//! cancel paths and the heartbeat find), its place and payload bytes in the intake, and, while
//! its analyzer runs, one of `worker.concurrency` permits. Each is given back exactly once:
//! when the task lets go of it, or when the guard is dropped, whichever comes first, however
//! the task ends (a return, an error, a panic).

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::Inner;
use crate::queue::Claimed;

/// What one claimed task holds of its worker; dropping it gives back what is left.
pub(super) struct Held {
    inner: Arc<Inner>,
    id: i64,
    token: i64,
    /// The payload bytes the intake counts for this task, until they are given back.
    intake: Option<u64>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Held {
    /// Register `task`, which weighs `bytes` in the intake (nothing when its payload was left
    /// in the database), with `cancel` to stop its analyzer.
    /// Its lease is taken as good until `lease_until`.
    pub(super) fn new(
        inner: &Arc<Inner>,
        task: &Claimed,
        cancel: CancellationToken,
        lease_until: std::time::Instant,
    ) -> Held {
        inner
            .running
            .insert(task.id, task.attempt, task.token, cancel, lease_until);
        Held {
            inner: Arc::clone(inner),
            id: task.id,
            token: task.token,
            intake: Some(if task.payload.is_some() {
                task.bytes
            } else {
                0
            }),
            permit: None,
        }
    }

    /// The task took a permit: it is given back with the guard, or by [`Held::free_permit`].
    pub(super) fn hold_permit(&mut self, permit: OwnedSemaphorePermit) {
        self.permit = Some(permit);
    }

    /// The task let go of its payload: the intake may claim more.
    pub(super) fn free_intake(&mut self) {
        if let Some(bytes) = self.intake.take() {
            self.inner.intake.done(bytes);
        }
    }

    /// The task needs no worker any more (its outcome is queued for a commit).
    pub(super) fn free_permit(&mut self) {
        self.permit = None;
    }

    /// The analyzer returned: what is left is the write, which its fence decides.
    pub(super) fn analyzed(&mut self) {
        self.inner.running.analyzed(self.id, self.token);
        self.free_intake();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.free_intake();
        self.permit = None;
        self.inner.running.remove(self.id, self.token);
    }
}
