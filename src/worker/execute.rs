//! Running one claim: wait for a permit (the lane's, and the daemon's when it has several
//! lanes), run the analyzer (inline or on a blocking thread, catching a panic either way) or
//! the lane's handler (`handle.rs`), and hand what came of it to the completer.
//!
//! The analyzer is always awaited to its return before the claim is finished, released or
//! dropped. Spawned by the claim path ([`Worker::claim_and_start`]), one task per claim.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::held::Held;
use super::shared::SharedPermit;
use super::Worker;
use crate::analyzer::AnalyzeError;
use crate::completer::{Action, Claim};
use crate::events;
use crate::queue::{Claimed, FinishError, Outcome, Payload, TaskStatus};

impl Worker {
    /// Wait for a permit, analyze one claimed task and commit what came of it.
    pub(super) async fn execute(self, task: Claimed, mut held: Held, cancel: CancellationToken) {
        let started = Instant::now();
        let Claimed {
            id,
            attempt,
            token,
            bytes,
            payload,
            told,
            ..
        } = task;
        let claim = Claim { id, attempt, token };
        let inner = &self.inner;
        let Some(payload) = payload else {
            // Over worker.max_payload_bytes: the text was never loaded, and never will be.
            let limit = inner.config.max_payload_bytes.unwrap_or_default();
            let action = Action::Finish(Outcome::Failed(format!(
                "payload of {bytes} bytes is over worker.max_payload_bytes ({limit}); not run"
            )));
            return self
                .settle_unstarted(claim, started, &mut held, action)
                .await;
        };
        let Some((permit, shared)) = self.permits(&cancel).await else {
            // Never started: a cancel request makes it CANCELED, a shutdown gives it back.
            drop(payload);
            let action = if cancel.is_cancelled() && !self.released_unfinished(id, token) {
                Action::Finish(Outcome::Canceled)
            } else {
                Action::Release
            };
            return self
                .settle_unstarted(claim, started, &mut held, action)
                .await;
        };
        held.hold_permit(permit);
        // Never start work whose lease has run out, or will before the expiry loop could stop
        // it: the task may be another daemon's by now (docs/design.md, "Work without a lease
        // stops").
        let by = Instant::now() + self.stop_ahead();
        if !inner.running.leased_at(id, token, by) {
            tracing::debug!(
                id,
                attempt,
                claim = token,
                "lease runs out before the work starts; giving the claim back"
            );
            drop(payload);
            // Its permits go back once the claim is (`held` and `shared` dropped on return).
            return self
                .settle_unstarted(claim, started, &mut held, Action::Release)
                .await;
        }
        let analysis = inner.intake.analysis();
        // The analyzer (or the handler) takes the payload and lets go of it when it returns.
        let action = match &inner.handler {
            None => self.analyze(claim, payload, &cancel).await,
            Some(lane) => self.handle(lane, claim, told, payload, &cancel).await,
        };
        held.analyzed();
        if let Some(lane) = &inner.handler {
            // The attempt's last progress is written before its end, so that the next
            // attempt is told it (docs/handlers.md, "Progress"). A failure is said by the
            // flusher's log; the finish goes on.
            let _ = lane.progress.flush_task(&inner.pool, id, token).await;
        }
        // The analyzer has returned: from here on, nothing else may stop this claim. Its
        // permit goes back as soon as the outcome is queued for a batch, so that the next
        // claims need not wait for this commit.
        let result = match &action {
            Action::Finish(outcome) => {
                let pending = inner.completer.finish(claim, outcome.clone()).await;
                held.free_permit();
                drop(shared);
                drop(analysis);
                pending.answer().await
            }
            Action::Release => {
                let result = inner.completer.write(claim, &action).await;
                held.free_permit();
                drop(shared);
                result
            }
        };
        self.record_outcome(claim, started, &action, result);
    }

    /// Settle a claim whose work never started (its payload let go of already) with
    /// `action`: its intake bytes given back, the action written, the outcome recorded.
    async fn settle_unstarted(
        &self,
        claim: Claim,
        started: Instant,
        held: &mut Held,
        action: Action,
    ) {
        held.free_intake();
        let result = self.inner.completer.write(claim, &action).await;
        self.record_outcome(claim, started, &action, result);
    }

    /// Whether a stopped claim is given back unfinished rather than finished CANCELED: a
    /// shutdown's abort stopped it, or its lease ran out without a heartbeat (`expiry.rs`).
    pub(super) fn released_unfinished(&self, id: i64, token: i64) -> bool {
        self.inner.abort.is_cancelled() || self.inner.running.lease_expired(id, token)
    }

    /// Wait for one of this lane's permits and, with several lanes, one of the daemon's
    /// `worker.concurrency` permits too; `None` when a cancel or the start of a shutdown comes
    /// first (a permit already taken goes back with it).
    async fn permits(
        &self,
        cancel: &CancellationToken,
    ) -> Option<(OwnedSemaphorePermit, Option<SharedPermit>)> {
        let draining = &self.inner.draining;
        let own = acquire(&self.inner.permits, cancel, draining).await?;
        let shared = match &self.inner.shared {
            None => None,
            Some(lanes) => Some(SharedPermit::new(
                acquire(lanes.permits(), cancel, draining).await?,
                Arc::clone(lanes),
            )),
        };
        Some((own, shared))
    }

    /// Run the analyzer on `payload`, and say what to do with the claim.
    async fn analyze(&self, claim: Claim, payload: Payload, cancel: &CancellationToken) -> Action {
        let Claim { id, attempt, token } = claim;
        let len = payload.as_str().len();
        tracing::debug!(
            id,
            attempt,
            claim = token,
            bytes = len,
            "{}",
            events::ANALYZER_RUN
        );
        let analyzed = if len < self.inner.analyzer.inline_below() {
            // Short work for an analyzer that never blocks: no hop to a blocking thread. A
            // panic is caught here as the blocking thread would catch it, so that the claim
            // is finished (FAILED) rather than left running.
            let analyzer = &self.inner.analyzer;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                analyzer.analyze(payload.as_str(), cancel)
            }))
            .map_err(|panic| panic_message(panic.as_ref()))
        } else {
            let analyzer = Arc::clone(&self.inner.analyzer);
            let token = cancel.clone();
            tokio::task::spawn_blocking(move || analyzer.analyze(payload.as_str(), &token))
                .await
                .map_err(|join| match join.try_into_panic() {
                    Ok(panic) => panic_message(panic.as_ref()),
                    Err(join) => join.to_string(),
                })
        };
        match analyzed {
            Ok(Ok(counts)) => Action::Finish(Outcome::Succeeded(counts)),
            Ok(Err(AnalyzeError::Failed { message, .. })) => {
                Action::Finish(Outcome::Failed(message))
            }
            Ok(Err(AnalyzeError::Canceled { .. })) if self.released_unfinished(id, token) => {
                Action::Release
            }
            Ok(Err(AnalyzeError::Canceled { .. })) => Action::Finish(Outcome::Canceled),
            Err(panic) => Action::Finish(Outcome::Failed(format!("handler panicked: {panic}"))),
        }
    }

    /// The claim is settled: count it and log it (the caller's [`Held`] forgets it).
    fn record_outcome(
        &self,
        claim: Claim,
        started: Instant,
        action: &Action,
        result: Result<TaskStatus, FinishError>,
    ) {
        let Claim { id, attempt, .. } = claim;
        let duration = started.elapsed();
        // A failed attempt put back QUEUED for a retry is counted as such below, not as a
        // release.
        let retried = matches!(
            (&result, action),
            (Ok(TaskStatus::Queued), Action::Finish(outcome)) if outcome.may_queue_again()
        );
        if let (Ok(status), false) = (&result, retried) {
            self.inner.metrics.finished(*status, duration.as_secs_f64());
        }
        self.inner
            .summary
            .settled(result.as_ref().ok().copied(), retried);
        match (result, action) {
            (Ok(status), Action::Finish(Outcome::Succeeded(counts)))
                if status == TaskStatus::Succeeded =>
            {
                tracing::debug!(id, attempt, %status, words = counts.words, bytes = counts.bytes, runes = counts.runes, ?duration, "task finished");
            }
            (Ok(status), Action::Finish(Outcome::Failed(error)))
                if status == TaskStatus::Failed =>
            {
                tracing::debug!(id, attempt, %status, words = 0, bytes = 0, runes = 0, ?duration, error = error.as_str(), "task finished");
            }
            (Ok(status), Action::Finish(Outcome::Retry { error, after }))
                if status == TaskStatus::Queued =>
            {
                if let Some(lane) = &self.inner.handler {
                    self.inner.metrics.handler_retried(&lane.queue.name);
                }
                tracing::debug!(id, attempt, %status, retry_in = ?after, error = error.as_str(), ?duration, "attempt failed; task queued again");
            }
            (Ok(status), Action::Finish(Outcome::Snooze { after }))
                if status == TaskStatus::Queued =>
            {
                if let Some(lane) = &self.inner.handler {
                    self.inner.metrics.handler_snoozed(&lane.queue.name);
                }
                tracing::debug!(id, attempt, %status, run_in = ?after, ?duration, "task snoozed: queued again, no attempt used");
            }
            (Ok(status), Action::Release) if status == TaskStatus::Queued => {
                tracing::debug!(id, attempt, %status, ?duration, "task released for another daemon");
            }
            (Ok(status), _) => {
                tracing::debug!(id, attempt, %status, words = 0, bytes = 0, runes = 0, ?duration, "task finished");
            }
            (Err(FinishError::NotRunning { status }), _) => {
                // Counted in the summary (`results_dropped`).
                tracing::debug!(id, attempt, %status, "claim lost before the finish; result dropped");
            }
            (Err(FinishError::NotFound), _) => {
                tracing::debug!(id, attempt, "task deleted while it ran; result dropped");
            }
            (Err(FinishError::Locked), _) => {
                // Settling alone waits for a locked row; this is not expected here.
                tracing::error!(
                    id,
                    attempt,
                    "finish left undone: the row was locked; the lease will expire"
                );
            }
            (Err(FinishError::Db(err)), _) if self.inner.completer.gave_up() => {
                tracing::warn!(id, attempt, error = %err, "finish not taken yet; the stop's last look writes it once more, else its lease expires");
            }
            (Err(FinishError::Db(err)), _) => {
                tracing::error!(id, attempt, error = %err, "finish failed; the lease will expire");
            }
        }
    }
}

/// A permit of `semaphore`, unless `cancel` or `draining` fires first.
async fn acquire(
    semaphore: &Arc<Semaphore>,
    cancel: &CancellationToken,
    draining: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        _ = draining.cancelled() => None,
        permit = Arc::clone(semaphore).acquire_owned() => {
            Some(permit.expect("the worker's semaphores are never closed"))
        }
    }
}

/// The message of a panic payload, as far as it is text.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_message_is_read_from_str_and_string_payloads() {
        let from_str = std::panic::catch_unwind(|| panic!("static text")).unwrap_err();
        assert_eq!(panic_message(from_str.as_ref()), "static text");
        let from_string = std::panic::catch_unwind(|| panic!("formatted {}", 42)).unwrap_err();
        assert_eq!(panic_message(from_string.as_ref()), "formatted 42");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), "a panic without a message");
    }
}
