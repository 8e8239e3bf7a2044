//! Claiming: the fill loop that claims batches while the intake has room, starting each
//! claimed task, and giving back the tasks of a claim whose answer was lost.
//!
//! Claims start from the front of the queue, except while those claims are slow: a held xmin
//! horizon leaves the entries of every task claimed since at the front of the claim index,
//! and each claim from the start walks them all. After a claim from the start that took at
//! least [`SLOW_CLAIM`] and came back full, the next claims start after the last task it
//! took ([`Floor`]), for ten times its duration and at most one poll interval; then one claims
//! from the start again, and while it is on its way the others still claim after the
//! position: while there is a position, claims from the start that walk a held horizon's
//! entries do not take both claim slots. What such a claim cannot see (a task of a higher
//! priority inserted since, one given back or retried, a late commit of a lower id) waits at
//! most until the next claim from the start has come back: a poll interval plus that claim's
//! own duration (docs/design.md, "Claims after a position"). Only a worker of one queue does
//! this.
//!
//! Called by [`Worker::run`] (one fill per scan, see `idle.rs` for what follows a scan) and
//! [`Worker::run_once`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::intake::Room;
use super::Worker;
use crate::db::DbError;
use crate::queue::{self, ClaimLimits, FinishError, Position};

/// Claim statements that may be on their way at once.
const CLAIMS_IN_FLIGHT: usize = 2;
/// The most tasks one claim statement takes: the ceiling's batch (`bench --mode ceiling`). A
/// claim of 100 cost the server measurably more per task in a drain (docs/benchmark.md).
pub(super) const MAX_CLAIM_BATCH: usize = 500;

/// A claim from the start at least this slow makes the next claims start after a position.
/// A claim of 500 short texts takes a few milliseconds; one that walks the index entries left
/// by a held horizon takes tens to thousands.
const SLOW_CLAIM: Duration = Duration::from_millis(20);

/// How many times a slow claim from the start's duration the claims after a position go on.
const AFTER_SLOW_CLAIM: u32 = 10;

/// Where the next claim may start, and what the last claim from the start cost.
#[derive(Debug, Default)]
pub(super) struct Floor {
    /// The last task of the latest full claim, in claim order.
    at: Option<Position>,
    /// The latest claim from the start: when it ended, and how long it took.
    from_start: Option<(Instant, Duration)>,
    /// Claims from the start on their way.
    starting: usize,
}

impl Floor {
    /// Where the claim about to be sent at `now` starts: after [`Floor::at`] while the latest
    /// claim from the start was slow and either ended less than ten times its duration ago
    /// (at most `poll`) or has a successor on its way; `None`: from the start, and then that
    /// claim is the one on its way until [`Floor::record`] or [`Floor::abandon`] is called
    /// for it.
    pub(super) fn next(&mut self, now: Instant, poll: Duration) -> Option<Position> {
        let after = self
            .at
            .zip(self.from_start)
            .and_then(|(at, (ended, took))| {
                let window = (took * AFTER_SLOW_CLAIM).min(poll);
                let recent = now.saturating_duration_since(ended) < window;
                (took >= SLOW_CLAIM && (recent || self.starting > 0)).then_some(at)
            });
        if after.is_none() {
            self.starting += 1;
        }
        after
    }

    /// A claim that started `after` (or from the start) failed: nothing is learned from it.
    pub(super) fn abandon(&mut self, after: Option<Position>) {
        if after.is_none() {
            self.starting = self.starting.saturating_sub(1);
        }
    }

    /// Record a claim that started `after` (or from the start), took `took` and ended at
    /// `now`: `more` when it took all it had room for (there may be more), `last` its last
    /// task. A claim that found less than it could take ends the positions: the next claim
    /// starts from the start.
    pub(super) fn record(
        &mut self,
        after: Option<Position>,
        took: Duration,
        now: Instant,
        more: bool,
        last: Option<Position>,
    ) {
        if after.is_none() {
            // What it saw replaces the positions before it (it may have found a task of a
            // higher priority, before them in claim order).
            self.from_start = Some((now, took));
            self.at = None;
            self.starting = self.starting.saturating_sub(1);
        }
        self.at = match (more, last) {
            (true, Some(last)) => Some(self.at.map_or(last, |at| at.max(last))),
            _ => None,
        };
    }
}

/// A claim the [`Floor`] chose a start for and has not been told about yet: dropped before
/// [`Floor::record`] (the claim failed, panicked or was dropped), it abandons the claim, so
/// that a claim from the start never stays counted as on its way.
struct Pending<'a> {
    floor: &'a std::sync::Mutex<Floor>,
    after: Option<Position>,
    recorded: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            if let Ok(mut floor) = self.floor.lock() {
                floor.abandon(self.after);
            }
        }
    }
}

/// What one scan ([`Worker::fill`]) did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Scan {
    /// Tasks claimed by all its claims.
    pub claimed: usize,
    /// A claim failed: the scan ended early, not because the queue ran dry.
    pub failed: bool,
}

/// What one claim statement took.
pub(super) struct ClaimReport {
    /// Tasks claimed and started.
    pub claimed: usize,
    /// The claim took all the tasks it had room for: there may be more.
    pub full: bool,
    /// The size of the first due task the byte budget left out: claim again once that much
    /// is free, rather than at the next poll.
    pub left_out: Option<u64>,
}

impl Worker {
    /// Claim until the queue runs dry or `stop` fires, one batch whenever the intake has room.
    /// Returns how many tasks it claimed, and whether it ended on a failure.
    pub(super) async fn fill(&self, stop: &CancellationToken) -> Scan {
        // No claim is on its way here: every claim that answered is in the registry.
        if self.inner.claim_unanswered.swap(false, Ordering::AcqRel) {
            if let Err(err) = self.release_unanswered().await {
                self.inner.claim_unanswered.store(true, Ordering::Release);
                tracing::warn!(error = %err, "cannot look for the tasks of an unanswered claim; retrying at the next wake-up or poll");
                return Scan {
                    claimed: 0,
                    failed: true,
                };
            }
        }
        // One claim at a time until one comes back full; then up to CLAIMS_IN_FLIGHT claim
        // statements overlap, so that room freed while one claim is on its way is claimed
        // without waiting for it to come back. A wake-up for a single task costs one claim.
        let in_flight = Arc::new(Semaphore::new(1));
        let widened = Arc::new(AtomicBool::new(false));
        let drained = Arc::new(AtomicBool::new(false));
        let claimed = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        // Bytes the next claim needs free: the first task the budget left out.
        let needed = Arc::new(AtomicU64::new(0));
        let mut claims = tokio::task::JoinSet::new();
        'claims: loop {
            // Forget the claims that came back (a busy scan can go on for hours).
            while claims.try_join_next().is_some() {}
            let slot = tokio::select! {
                _ = stop.cancelled() => break,
                slot = Arc::clone(&in_flight).acquire_owned() => slot.expect("never closed"),
            };
            let room = loop {
                if drained.load(Ordering::Acquire) || stop.is_cancelled() {
                    break 'claims;
                }
                let need = needed.load(Ordering::Acquire);
                if let Some(room) = self.inner.intake.reserve(MAX_CLAIM_BATCH, need) {
                    break room;
                }
                tokio::select! {
                    _ = stop.cancelled() => break 'claims,
                    _ = self.inner.intake.freed() => {}
                }
            };
            let worker = self.clone();
            let drained = Arc::clone(&drained);
            let widened = Arc::clone(&widened);
            let in_flight = Arc::clone(&in_flight);
            let needed = Arc::clone(&needed);
            let claimed = Arc::clone(&claimed);
            let failed = Arc::clone(&failed);
            claims.spawn(async move {
                match worker.claim_and_start(room).await {
                    Ok(report) => {
                        if report.claimed > 0 {
                            worker.found_work();
                        }
                        claimed.fetch_add(report.claimed, Ordering::AcqRel);
                        needed.store(report.left_out.unwrap_or(0), Ordering::Release);
                        if report.full {
                            if !widened.swap(true, Ordering::AcqRel) {
                                in_flight.add_permits(CLAIMS_IN_FLIGHT - 1);
                            }
                        } else if report.left_out.is_none() {
                            drained.store(true, Ordering::Release);
                        }
                    }
                    Err(err) => {
                        drained.store(true, Ordering::Release);
                        failed.store(true, Ordering::Release);
                        if err.is_unavailable() {
                            worker.inner.claim_unanswered.store(true, Ordering::Release);
                        }
                        tracing::warn!(error = %err, "claim failed; retrying at the next wake-up or poll");
                    }
                }
                drop(slot);
            });
        }
        // Return once no claim is on its way: the next scan starts from a settled state.
        while claims.join_next().await.is_some() {}
        Scan {
            claimed: claimed.load(Ordering::Acquire),
            failed: failed.load(Ordering::Acquire),
        }
    }

    /// A claim failed after it may have committed: its tasks are RUNNING under this instance
    /// but in no registry, and would wait for their lease to expire. Give each back, fenced on
    /// its claim's token, as a shutdown does (QUEUED, the attempt not counted; CANCELED if a cancel
    /// was requested). Their analyzers never ran. Called only while no claim is on its way.
    async fn release_unanswered(&self) -> Result<(), DbError> {
        let inner = &self.inner;
        let client = inner.pool.get().await?;
        let held = client
            .bounded(queue::held_by(&client, &inner.instance))
            .await?;
        let unanswered: Vec<(i64, i32, i64)> = held
            .into_iter()
            .filter(|(id, _, _)| !inner.running.contains(*id))
            .collect();
        for (id, attempt, token) in unanswered {
            match client
                .bounded(queue::release(&client, token, id, false))
                .await
            {
                Ok(status) => {
                    tracing::warn!(id, attempt, claim = token, %status, "task of a claim whose answer was lost given back");
                }
                Err(FinishError::Db(err)) => return Err(err),
                // Changed meanwhile (canceled, deleted): nothing of ours to give back.
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Claim what `room`, reserved in the intake, allows, and start the tasks.
    pub(super) async fn claim_and_start(&self, room: Room) -> Result<ClaimReport, DbError> {
        let inner = &self.inner;
        let limits = ClaimLimits {
            tasks: room.tasks,
            bytes: room.bytes,
            take_one: room.take_one,
            max_payload: inner.config.max_payload_bytes,
        };
        let one_queue = inner.config.queues.len() == 1;
        let after = match inner.floor.lock() {
            Ok(mut floor) if one_queue => floor.next(Instant::now(), inner.config.poll_interval),
            _ => None,
        };
        // Until it is recorded, however this claim ends (an error, a panic, a drop).
        let mut pending = Pending {
            floor: &inner.floor,
            after,
            recorded: !one_queue,
        };
        let batch = async {
            let client = inner.pool.get().await?;
            let sent = Instant::now();
            let batch = client
                .bounded(queue::claim_after(
                    &client,
                    &inner.instance,
                    &inner.config.queues,
                    limits,
                    inner.config.lease,
                    after,
                ))
                .await?;
            Ok::<_, DbError>((batch, sent.elapsed()))
        }
        .await;
        let (batch, took) = match batch {
            Ok(answer) => answer,
            Err(err) => {
                inner.intake.unreserve(room);
                return Err(err);
            }
        };
        let claimed = batch.tasks.len();
        let full = claimed == room.tasks;
        if let Ok(mut floor) = inner.floor.lock() {
            let more = full || batch.left_out.is_some();
            floor.record(after, took, Instant::now(), more, batch.last);
            pending.recorded = true;
        }
        inner.intake.claimed(room, claimed, batch.bytes, took);
        for task in batch.tasks {
            let cancel = inner.abort.child_token();
            inner
                .running
                .insert(task.id, task.attempt, task.token, cancel.clone());
            tracing::info!(
                id = task.id,
                attempt = task.attempt,
                claim = task.token,
                "task claimed"
            );
            inner.metrics.claimed(task.waited);
            inner.tracker.spawn(self.clone().execute(task, cancel));
        }
        Ok(ClaimReport {
            claimed,
            full,
            left_out: batch.left_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(priority: i32, id: i64) -> Option<Position> {
        Some(Position { priority, id })
    }

    const POLL: Duration = Duration::from_secs(2);

    #[test]
    fn a_fast_claim_from_the_start_keeps_every_claim_at_the_start() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        floor.record(None, Duration::from_millis(3), t0, true, at(0, 500));
        assert_eq!(floor.next(t0, POLL), None);
    }

    #[test]
    fn after_a_slow_full_claim_the_next_ones_start_after_its_last_task_for_ten_times_its_duration()
    {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        let slow = Duration::from_millis(50);
        floor.record(None, slow, t0, true, at(0, 500));
        assert_eq!(floor.next(t0, POLL), at(0, 500));
        // A claim after it that came back full moves the position on.
        floor.record(at(0, 500), Duration::from_millis(2), t0, true, at(0, 1000));
        assert_eq!(floor.next(t0 + slow * 9, POLL), at(0, 1000));
        assert_eq!(
            floor.next(t0 + slow * 10, POLL),
            None,
            "then from the start"
        );
    }

    #[test]
    fn the_claims_after_a_position_last_at_most_a_poll_interval() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        floor.record(None, Duration::from_secs(1), t0, true, at(0, 500));
        assert_eq!(
            floor.next(t0 + Duration::from_millis(1999), POLL),
            at(0, 500)
        );
        assert_eq!(floor.next(t0 + POLL, POLL), None);
    }

    #[test]
    fn while_a_slow_claim_from_the_start_is_on_its_way_the_others_claim_after_the_position() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        let slow = Duration::from_millis(500);
        floor.record(None, slow, t0, true, at(0, 500));
        let later = t0 + POLL;
        assert_eq!(
            floor.next(later, POLL),
            None,
            "the window is over: one from the start"
        );
        assert_eq!(
            floor.next(later, POLL),
            at(0, 500),
            "the second claim slot does not walk the same entries"
        );
        floor.record(
            at(0, 500),
            Duration::from_millis(2),
            later,
            true,
            at(0, 1000),
        );
        assert_eq!(floor.next(later, POLL), at(0, 1000));
        // It came back, slow again: its window starts.
        let back = later + slow;
        floor.record(None, slow, back, true, at(0, 1200));
        assert_eq!(floor.next(back, POLL), at(0, 1200));
        // Past that window, one goes from the start; it fails: the next goes from the start.
        let past = back + POLL;
        assert_eq!(floor.next(past, POLL), None);
        floor.abandon(None);
        assert_eq!(floor.next(past, POLL), None);
    }

    #[test]
    fn each_claim_from_the_start_on_its_way_counts_until_it_comes_back() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        let slow = Duration::from_millis(500);
        floor.record(None, slow, t0, true, at(0, 500));
        let later = t0 + POLL;
        // A claim after the position came back with less than it had room for: no position,
        // so two claims from the start may be on their way at once.
        floor.record(
            at(0, 500),
            Duration::from_millis(2),
            later,
            false,
            at(0, 600),
        );
        assert_eq!(floor.next(later, POLL), None);
        assert_eq!(floor.next(later, POLL), None);
        // The first comes back (slow, full) while the second is still on its way.
        floor.record(None, slow, later + slow, true, at(0, 1100));
        let past = later + slow + POLL;
        assert_eq!(
            floor.next(past, POLL),
            at(0, 1100),
            "one from the start is still on its way"
        );
        floor.abandon(None);
        assert_eq!(floor.next(past, POLL), None, "now none is");
    }

    #[test]
    fn a_claim_dropped_before_it_was_recorded_is_no_longer_on_its_way() {
        let floor = std::sync::Mutex::new(Floor::default());
        let t0 = Instant::now();
        let slow = Duration::from_millis(500);
        floor
            .lock()
            .unwrap()
            .record(None, slow, t0, true, at(0, 500));
        let later = t0 + POLL;
        let after = floor.lock().unwrap().next(later, POLL);
        assert_eq!(after, None);
        drop(Pending {
            floor: &floor,
            after,
            recorded: false,
        });
        assert_eq!(floor.lock().unwrap().starting, 0);
        assert_eq!(floor.lock().unwrap().next(later, POLL), None);
    }

    #[test]
    fn fast_claims_from_the_start_may_overlap() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        floor.record(None, Duration::from_millis(3), t0, true, at(0, 500));
        assert_eq!(floor.next(t0, POLL), None);
        assert_eq!(floor.next(t0, POLL), None);
    }

    #[test]
    fn a_claim_that_found_less_than_it_could_take_sends_the_next_to_the_start() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        floor.record(None, Duration::from_millis(50), t0, true, at(0, 500));
        floor.record(at(0, 500), Duration::from_millis(2), t0, false, at(0, 600));
        assert_eq!(floor.next(t0, POLL), None);
        floor.record(None, Duration::from_millis(50), t0, false, at(0, 700));
        assert_eq!(
            floor.next(t0, POLL),
            None,
            "a drained queue has no position"
        );
    }

    #[test]
    fn a_claim_from_the_start_replaces_the_position_with_its_own() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        floor.record(None, Duration::from_millis(50), t0, true, at(0, 500));
        floor.record(at(0, 500), Duration::from_millis(2), t0, true, at(0, 5000));
        // Tasks of priority 5 were inserted since: the next claim from the start takes some.
        floor.record(None, Duration::from_millis(50), t0, true, at(5, 600));
        assert_eq!(
            floor.next(t0, POLL),
            at(5, 600),
            "the rest of priority 5 is not skipped"
        );
    }

    #[test]
    fn concurrent_claims_keep_the_later_position_in_claim_order() {
        let mut floor = Floor::default();
        let t0 = Instant::now();
        floor.record(None, Duration::from_millis(50), t0, true, at(5, 900));
        // A lower priority is later in claim order than any id of a higher one.
        floor.record(at(5, 900), Duration::from_millis(2), t0, true, at(3, 10));
        floor.record(at(5, 900), Duration::from_millis(2), t0, true, at(5, 1400));
        assert_eq!(floor.next(t0, POLL), at(3, 10));
    }
}
