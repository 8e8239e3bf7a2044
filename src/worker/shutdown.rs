//! The two-phase stop: stop claiming, let running tasks finish for a grace period, then
//! stop the analyzers still running, wait for each to return, and settle every claim.
//!
//! The grace bounds the wait for the analyzers; giving the claims back has a bound of its own,
//! [`settle_bound`]: one more grace, but never less than [`SETTLE_AT_LEAST`], so that a grace
//! of zero ("do not wait for the analyzers") still waits for the database to take the tasks
//! back; the completer's waits are hurried from the stop's start (no turn over 200 ms). When
//! that bound passes, the completer gives up, and one last look at the table ([`SWEEP_BOUND`])
//! writes once more each result it gave up on and counts what is really unsettled: a write
//! given up on may have landed anyway, and the rows still RUNNING under this instance are given back if the database
//! answers now, a row someone else holds locked waited for within that bound (a producer's
//! transaction that lets go of it a moment later no longer leaves the claim to its lease). Only claims the database never took back count: a daemon told to stop while
//! the database is unreachable exits, those claims left RUNNING for their leases to expire.
//!
//! Called by [`crate::daemon`] after [`Worker::run`] returned.

use std::collections::HashSet;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Worker;
use crate::completer::Action;
use crate::db::DbError;
use crate::queue::{self, FinishError};

/// The least time the last writes get, whatever the grace ("Two-phase shutdown" in
/// docs/design.md).
const SETTLE_AT_LEAST: Duration = Duration::from_secs(5);

/// How long the last look for unsettled claims waits for the database.
const SWEEP_BOUND: Duration = Duration::from_secs(2);

/// How long the last writes may wait for the database after the analyzers were stopped:
/// `grace`, but at least [`SETTLE_AT_LEAST`].
fn settle_bound(grace: Duration) -> Duration {
    grace.max(SETTLE_AT_LEAST)
}

impl Worker {
    /// The two-phase stop, after [`Worker::run`] returned: let running tasks finish for up
    /// to `grace` (or until `hurry` fires), then stop the analyzers that still run, wait for
    /// each to return, commit what finished and release the rest to QUEUED. Returns how many
    /// claims were left unsettled because the database did not take them within
    /// `settle_bound` (0 after a clean stop).
    pub async fn shutdown(&self, grace: Duration, hurry: CancellationToken) -> usize {
        let tracker = &self.inner.tracker;
        tracker.close();
        self.inner.draining.cancel();
        self.inner.completer.hurry();
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
                tracing::info!(running = self.running(), "shutdown grace is over; stopping the handlers");
            }
            _ = hurry.cancelled() => {
                tracing::info!(running = self.running(), "skipping the rest of the grace; stopping the handlers");
            }
        }
        self.inner.abort.cancel();
        let bound = settle_bound(grace);
        if tokio::time::timeout(bound, tracker.wait()).await.is_ok() {
            self.inner.heartbeat_stop.cancel();
            return 0;
        }
        tracing::warn!(
            unsettled = self.running(),
            bound_ms = bound.as_millis() as u64,
            "the last claims were not settled in time (the database did not answer or refused, or another transaction holds their rows); giving up on them"
        );
        self.inner.completer.give_up();
        tracker.wait().await;
        let abandoned = self.inner.completer.abandoned();
        let looked = tokio::time::timeout(SWEEP_BOUND, self.last_look()).await;
        // After the last look, so that the stop's summary counts what it wrote.
        self.inner.heartbeat_stop.cancel();
        match looked {
            Ok(Ok(0)) => {
                tracing::info!("every claim was settled after all");
                0
            }
            Ok(Ok(left)) => {
                tracing::warn!(unsettled = left, "leaving claims RUNNING: their leases expire and another daemon runs them again");
                left
            }
            Ok(Err(err)) => {
                tracing::warn!(unsettled = abandoned, error = %err, "leaving claims RUNNING: their leases expire and another daemon runs them again");
                abandoned
            }
            Err(_) => {
                tracing::warn!(unsettled = abandoned, "leaving claims RUNNING: their leases expire and another daemon runs them again");
                abandoned
            }
        }
    }

    /// After every task ended: write once more what the completer gave up on (a result
    /// computed is committed, not thrown away, when the database is back by now: each write
    /// fenced on its claim's token, so one that landed meanwhile is not written twice); park
    /// each result whose row another transaction holds locked, for a rescuer to write once
    /// the row is free (docs/design.md, "Parked results"); then give back each other row
    /// still RUNNING under this instance, as a shutdown releases its claims, waiting for a row
    /// someone else holds (the caller bounds the wait). Returns how many could not be given
    /// back.
    ///
    /// # Errors
    ///
    /// The database did not answer.
    async fn last_look(&self) -> Result<usize, DbError> {
        let given_up = self.inner.completer.take_abandoned();
        let mut parked = HashSet::new();
        if !given_up.is_empty() {
            let client = self.inner.pool.get().await?;
            let mut written = 0;
            let mut locked = Vec::new();
            for (claim, action) in given_up {
                let Action::Finish(outcome) = &action else {
                    continue; // a release: given back below
                };
                let finish = queue::finish(&client, claim.token, claim.id, outcome, false);
                match client.bounded(finish).await {
                    Ok(status) => {
                        written += 1;
                        self.inner.summary.recovered(status, &action);
                    }
                    Err(FinishError::Locked) => locked.push(queue::Finish {
                        id: claim.id,
                        token: claim.token,
                        outcome: outcome.clone(),
                    }),
                    Err(FinishError::Db(err)) => return Err(err),
                    // Landed meanwhile, or changed by someone else: nothing to write.
                    Err(_) => {}
                }
            }
            if written > 0 {
                tracing::info!(
                    written,
                    "results given up on were committed at the stop's last look"
                );
            }
            if !locked.is_empty() {
                parked = client.bounded(queue::park(&client, &locked)).await?;
                self.inner.summary.parked(parked.len());
                tracing::warn!(
                    parked = parked.len(),
                    ids = ?parked.iter().take(10).collect::<Vec<_>>(),
                    "rows another transaction holds locked: their results are parked, and a rescuer writes them once the rows are free and the leases expired"
                );
            }
        }
        Ok(self.give_back_held(false, true, &parked).await?.left)
    }
}
