//! The lease heartbeat: every third of a lease, extend the leases of the tasks this worker
//! runs, and stop the analyzers of tasks whose cancellation was requested (a lost
//! notification) or whose claim was lost.
//!
//! The batched statement never waits for a row lock: a claim whose row someone else holds
//! (a producer's open transaction that requested its cancel) is extended by a statement of
//! its own that waits for that row, one claim at a time, on one session (docs/design.md, "No
//! one else's lock delays a batch").
//!
//! The batched statement locks the rows it extends while it runs; it holds the completer's
//! heartbeat turn meanwhile, so that a finish that finds its row locked can tell this
//! daemon's heartbeat from someone else's lock ([`crate::completer::Completer::heartbeat_turn`]).
//!
//! Spawned by [`Worker::run`]; ends when [`Worker::shutdown`] saw the last task end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::Worker;
use crate::backoff::jitter;
use crate::queue::{self, Beat};
use crate::repeats::{log_failure, log_recovery, Repeats};

impl Worker {
    /// Extend the leases of running tasks every third of a lease, and stop the analyzers of
    /// tasks whose cancellation was requested (a lost notification) or whose claim was lost.
    pub(super) async fn heartbeat(self) {
        let period = self.inner.config.lease / 3;
        let waiting = Arc::new(AtomicBool::new(false));
        let failures = Repeats::new();
        loop {
            tokio::select! {
                _ = self.inner.heartbeat_stop.cancelled() => return,
                _ = tokio::time::sleep(jitter(period)) => {}
            }
            let claims = self.inner.running.snapshot();
            if claims.is_empty() {
                continue;
            }
            let ids: Vec<i64> = claims.iter().map(|(id, _)| *id).collect();
            let tokens: Vec<i64> = claims.iter().map(|(_, token)| *token).collect();
            // The database extends the leases after this instant: by this clock, until then
            // plus the lease at the latest.
            let sent = Instant::now();
            let extended = match self.inner.pool.get().await {
                Ok(client) => {
                    let _turn = self.inner.completer.heartbeat_turn().await;
                    client
                        .bounded(queue::heartbeat(
                            &client,
                            &ids,
                            &tokens,
                            self.inner.config.lease,
                        ))
                        .await
                }
                Err(err) => Err(err),
            };
            let extended = match extended {
                Ok(extended) => {
                    // A write the database took: claims waiting their turn to settle try now.
                    self.inner.completer.database_answered();
                    log_recovery!(failures, "lease heartbeat working again");
                    extended
                }
                Err(err) => {
                    if err.is_exhausted() {
                        self.inner.metrics.refused_for_room();
                    }
                    log_failure!(failures, err, "lease heartbeat failed");
                    continue;
                }
            };
            // Few rows are ever locked: look their tokens up, rather than every claim in the
            // answer.
            let busy: Vec<(i64, i64)> = extended
                .iter()
                .filter(|e| e.beat == Beat::Busy)
                .filter_map(|e| claims.iter().find(|(id, _)| *id == e.id).copied())
                .collect();
            if !busy.is_empty() && !waiting.swap(true, Ordering::AcqRel) {
                tokio::spawn(self.clone().extend_busy(busy, Arc::clone(&waiting)));
            }
            // Each claim's beat, found once (the answer holds every claim still held).
            let beats: HashMap<i64, Beat> = extended.iter().map(|e| (e.id, e.beat)).collect();
            let mut renewed = Vec::with_capacity(claims.len());
            let mut lost = 0;
            for &(id, token) in &claims {
                let beat = beats.get(&id).copied();
                if matches!(beat, Some(Beat::Extended { .. })) {
                    renewed.push((id, token));
                }
                let Some(task) = self.inner.running.get(id) else {
                    continue;
                };
                if task.token != token {
                    continue;
                }
                let attempt = task.attempt;
                match verdict(beat, task.cancel.is_cancelled(), task.analyzed) {
                    Verdict::Keep => {}
                    Verdict::CancelRequested => {
                        tracing::info!(
                            id,
                            attempt,
                            "cancel requested (seen by the heartbeat); stopping its handler"
                        );
                        task.cancel.cancel();
                    }
                    Verdict::LeaseLost => {
                        lost += 1;
                        tracing::debug!(
                            id,
                            attempt,
                            "lease lost; stopping its handler, its result will be dropped"
                        );
                        task.cancel.cancel();
                    }
                }
            }
            self.inner
                .running
                .extended(&renewed, sent + self.inner.config.lease);
            if lost > 0 {
                tracing::warn!(
                    tasks = lost,
                    "leases lost; stopping their handlers, their results will be dropped"
                );
            }
        }
    }
}

impl Worker {
    /// Extend, one at a time, the leases of claims whose rows someone else held locked at the
    /// heartbeat, each statement waiting for its row (up to the session's `lock_timeout`).
    /// `waiting` is cleared when done: one such task at a time. Failures are one line with
    /// their count; an outage ends the round (the next heartbeat tries again).
    async fn extend_busy(self, busy: Vec<(i64, i64)>, waiting: Arc<AtomicBool>) {
        let inner = &self.inner;
        let tasks = busy.len();
        let mut extended_one_by_one = 0;
        let mut failed = 0;
        let mut last_error = None;
        for (id, token) in busy {
            if inner.heartbeat_stop.is_cancelled() {
                break;
            }
            let sent = Instant::now();
            let extended = match inner.pool.get().await {
                Ok(client) => {
                    client
                        .bounded(queue::extend_one(&client, id, token, inner.config.lease))
                        .await
                }
                Err(err) => Err(err),
            };
            match extended {
                Ok(Some(cancel_requested)) => {
                    extended_one_by_one += 1;
                    tracing::debug!(id, claim = token, "lease of a locked row extended");
                    inner
                        .running
                        .extended(&[(id, token)], sent + inner.config.lease);
                    if cancel_requested {
                        if let Some(task) = inner.running.get(id).filter(|t| t.token == token) {
                            task.cancel.cancel();
                        }
                    }
                }
                // Lost meanwhile: the next heartbeat says so.
                Ok(None) => {}
                Err(err) => {
                    if err.is_exhausted() {
                        inner.metrics.refused_for_room();
                    }
                    tracing::debug!(id, claim = token, error = %err, "could not extend the lease of a row held at the heartbeat");
                    failed += 1;
                    let unavailable = err.is_unavailable();
                    last_error = Some(err);
                    if unavailable {
                        break;
                    }
                }
            }
        }
        match last_error {
            Some(err) if err.is_unavailable() => tracing::warn!(
                tasks,
                extended = extended_one_by_one,
                error = %err,
                "database unavailable while extending leases one by one; the next heartbeat tries again"
            ),
            Some(err) => tracing::warn!(
                tasks,
                extended = extended_one_by_one,
                failed,
                error = %err,
                "could not extend leases one by one (rows another transaction held at the heartbeat); the next heartbeat tries again"
            ),
            None => {}
        }
        waiting.store(false, Ordering::Release);
    }
}

/// What a heartbeat's answer means for one running task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Its lease was extended; nothing else to do.
    Keep,
    /// Its cancellation was requested and its analyzer not yet told: stop it.
    CancelRequested,
    /// Its lease was not extended, the claim is no longer this instance's: stop the analyzer.
    LeaseLost,
}

/// The verdict for a task, given its `beat` in the heartbeat's answer (none: not held any
/// more), whether its analyzer was already told to stop, and whether it has returned. A task
/// whose analyzer has returned is being written: its row may have just been finished (so no
/// lease was extended) and its write is fenced anyway, so there is nothing to stop and
/// nothing to warn of.
fn verdict(beat: Option<Beat>, already_cancelled: bool, analyzed: bool) -> Verdict {
    match beat {
        _ if analyzed => Verdict::Keep,
        Some(Beat::Extended {
            cancel_requested: true,
        }) if !already_cancelled => Verdict::CancelRequested,
        Some(_) => Verdict::Keep,
        None => Verdict::LeaseLost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Extended;

    fn extended(id: i64, cancel_requested: bool) -> Extended {
        Extended {
            id,
            beat: Beat::Extended { cancel_requested },
        }
    }

    #[test]
    fn a_heartbeat_answer_keeps_cancels_or_drops_each_task() {
        let busy = Extended {
            id: 4,
            beat: Beat::Busy,
        };
        let answer = [extended(1, false), extended(2, true), busy];
        let cases = [
            // (task, already told to stop, analyzer returned, verdict)
            (1, false, false, Verdict::Keep),
            (1, true, false, Verdict::Keep),
            (2, false, false, Verdict::CancelRequested),
            (2, true, false, Verdict::Keep),
            (3, false, false, Verdict::LeaseLost),
            // A lost lease stops the analyzer again: cancelling twice is harmless.
            (3, true, false, Verdict::LeaseLost),
            // Analyzed: its finish may have just committed; the fence decides the write.
            (3, false, true, Verdict::Keep),
            (2, false, true, Verdict::Keep),
            // Locked by someone else: still this claim's, extended on its own.
            (4, false, false, Verdict::Keep),
        ];
        for (id, already_cancelled, analyzed, expected) in cases {
            assert_eq!(
                verdict(
                    answer.iter().find(|e| e.id == id).map(|e| e.beat),
                    already_cancelled,
                    analyzed
                ),
                expected,
                "task {id}, already cancelled: {already_cancelled}, analyzed: {analyzed}"
            );
        }
    }
}
