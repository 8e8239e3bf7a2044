//! The two-phase stop: stop claiming, let running tasks finish for a grace period, then
//! stop the analyzers still running, wait for each to return, and settle every claim.
//!
//! Called by [`crate::daemon`] after [`Worker::run`] returned.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Worker;

impl Worker {
    /// The two-phase stop, after [`Worker::run`] returned: let running tasks finish for up
    /// to `grace` (or until `hurry` fires), then stop the analyzers that still run, wait for
    /// each to return, commit what finished and release the rest to QUEUED.
    pub async fn shutdown(&self, grace: Duration, hurry: CancellationToken) {
        let tracker = &self.inner.tracker;
        tracker.close();
        self.inner.draining.cancel();
        let running = self.running();
        if running > 0 {
            tracing::info!(
                running,
                grace_ms = grace.as_millis() as u64,
                "waiting for running tasks"
            );
        }
        tokio::select! {
            _ = tracker.wait() => {
                self.inner.heartbeat_stop.cancel();
                return;
            }
            _ = tokio::time::sleep(grace) => {
                tracing::info!(running = self.running(), "shutdown grace is over; stopping the analyzers");
            }
            _ = hurry.cancelled() => {
                tracing::info!(running = self.running(), "second signal; stopping the analyzers");
            }
        }
        self.inner.abort.cancel();
        tracker.wait().await;
        self.inner.heartbeat_stop.cancel();
    }
}
