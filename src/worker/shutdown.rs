//! The two-phase stop: stop claiming, let running tasks finish for a grace period, then
//! stop the analyzers still running, wait for each to return, and settle every claim. The
//! settling waits for the database at most one more grace period: a daemon told to stop while
//! the database is unreachable exits, its unsettled claims left RUNNING for their leases to
//! expire.
//!
//! Called by [`crate::daemon`] after [`Worker::run`] returned.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Worker;

impl Worker {
    /// The two-phase stop, after [`Worker::run`] returned: let running tasks finish for up
    /// to `grace` (or until `hurry` fires), then stop the analyzers that still run, wait for
    /// each to return, commit what finished and release the rest to QUEUED. Returns how many
    /// claims were left unsettled because the database did not answer within one more
    /// `grace` (0 after a clean stop).
    pub async fn shutdown(&self, grace: Duration, hurry: CancellationToken) -> usize {
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
                return 0;
            }
            _ = tokio::time::sleep(grace) => {
                tracing::info!(running = self.running(), "shutdown grace is over; stopping the analyzers");
            }
            _ = hurry.cancelled() => {
                tracing::info!(running = self.running(), "second signal; stopping the analyzers");
            }
        }
        self.inner.abort.cancel();
        let settled = tokio::time::timeout(grace, tracker.wait()).await;
        if settled.is_err() {
            tracing::warn!(
                unsettled = self.running(),
                "the database did not answer for the last claims within the grace; leaving them RUNNING: their leases expire and another daemon runs them again"
            );
            self.inner.completer.give_up();
            tracker.wait().await;
        }
        self.inner.heartbeat_stop.cancel();
        self.inner.completer.abandoned()
    }
}
