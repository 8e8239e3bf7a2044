//! Cancel notifications, confirmed before they stop anything.
//!
//! `NOTIFY pgtaskd_cancel, '<id>'` is what `pgtaskd.cancel` sends for a running task, but any
//! role that can connect may send the same notification. So a notification is only a hint:
//! it names a task to look at, and the analyzer is stopped only once the row says that this
//! instance runs it and that its cancellation was requested. Hints for tasks this worker
//! does not run cost a map lookup; hints for its own tasks are collected and confirmed
//! together, one read for however many arrived meanwhile, so a flood of notifications
//! costs a few reads, not a read each. A hint that cannot be confirmed (the database is
//! unreachable) is dropped: the heartbeat reads `cancel_requested` too.
//!
//! The listener calls [`Worker::cancel_running`]; the confirming loop is spawned by
//! [`Worker::run`] and ends with the heartbeat.

use std::collections::HashSet;

use super::Worker;
use crate::queue;

/// Task ids named by cancel notifications, waiting to be confirmed.
#[derive(Debug, Default)]
pub(super) struct Hints {
    ids: std::sync::Mutex<HashSet<i64>>,
    arrived: tokio::sync::Notify,
}

impl Hints {
    fn add(&self, id: i64) {
        self.ids.lock().expect("cancel hints poisoned").insert(id);
        self.arrived.notify_one();
    }

    fn take(&self) -> Vec<i64> {
        self.ids
            .lock()
            .expect("cancel hints poisoned")
            .drain()
            .collect()
    }
}

impl Worker {
    /// A cancel notification named task `id`: if this worker runs it, confirm in the database
    /// that its cancellation was requested, then stop its analyzer. Never blocks.
    pub fn cancel_running(&self, id: i64) {
        // Not ours, or stopping already: nothing to do, and nothing to log (anyone may send
        // such a notification, as often as they like).
        if let Some(task) = self.inner.running.get(id) {
            if !task.cancel.is_cancelled() {
                self.inner.cancel_hints.add(id);
            }
        }
    }

    /// Confirm the collected cancel hints, one read at a time, until the heartbeat stops.
    pub(super) async fn confirm_cancels(self) {
        let inner = &self.inner;
        loop {
            tokio::select! {
                _ = inner.heartbeat_stop.cancelled() => return,
                _ = inner.cancel_hints.arrived.notified() => {}
            }
            let ids = inner.cancel_hints.take();
            if ids.is_empty() {
                continue;
            }
            let confirmed = match inner.pool.get().await {
                Ok(client) => {
                    client
                        .bounded(queue::cancel_requested(
                            &client,
                            queue::lease_key(&inner.instance),
                            &ids,
                        ))
                        .await
                }
                Err(err) => Err(err),
            };
            let confirmed = match confirmed {
                Ok(confirmed) => confirmed,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot confirm cancel notifications; the heartbeat will read them");
                    continue;
                }
            };
            for id in confirmed {
                if let Some(task) = inner.running.get(id) {
                    tracing::info!(
                        id,
                        attempt = task.attempt,
                        "cancel requested; stopping its handler"
                    );
                    task.cancel.cancel();
                }
            }
        }
    }
}
