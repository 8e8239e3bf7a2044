//! Claiming: the fill loop that claims batches while the intake has room, starting each
//! claimed task, and giving back the tasks of a claim whose answer was lost.
//!
//! Claims start from the front of the queue, except while those claims are slow: see
//! `floor.rs` (docs/design.md, "Claims after a position"). Only a worker of one queue
//! does this.
//!
//! Called by [`Worker::run`] (one fill per scan, see `idle.rs` for what follows a scan) and
//! [`Worker::run_once`].

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::floor::Pending;
use super::held::Held;
use super::intake::Room;
use super::Worker;
use crate::db::DbError;
use crate::queue::{self, ClaimLimits, FinishError};
use crate::repeats::{log_failure, log_recovery};

/// Claim statements that may be on their way at once.
const CLAIMS_IN_FLIGHT: usize = 2;
/// The most tasks one claim statement takes: the ceiling's batch (`bench --mode ceiling`). A
/// claim of 100 cost the server measurably more per task in a drain (docs/benchmark.md).
pub(super) const MAX_CLAIM_BATCH: usize = 500;

/// What one scan ([`Worker::fill`]) did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Scan {
    /// Tasks claimed by all its claims.
    pub claimed: usize,
    /// A claim failed: the scan ended early, not because the queue ran dry.
    pub failed: bool,
    /// A limited queue was passed over and may have room this much after the scan ended
    /// (the soonest of its claims' answers).
    pub again_in: Option<std::time::Duration>,
}

/// What the claims of one scan share: how many may be on their way, whether the queue ran
/// dry, what they claimed, and the bytes the next claim needs free.
struct ScanState {
    /// One claim at a time until one comes back full; then up to [`CLAIMS_IN_FLIGHT`].
    in_flight: Arc<Semaphore>,
    widened: AtomicBool,
    /// A claim came back short, or failed: the scan ends.
    drained: AtomicBool,
    claimed: AtomicUsize,
    failed: AtomicBool,
    /// The size of the first task the budget left out (0: none).
    needed: AtomicU64,
    /// The soonest a limited queue passed over may have room, in microseconds (`u64::MAX`:
    /// none).
    again_in_us: AtomicU64,
}

impl ScanState {
    fn new() -> ScanState {
        ScanState {
            in_flight: Arc::new(Semaphore::new(1)),
            widened: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            claimed: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            needed: AtomicU64::new(0),
            again_in_us: AtomicU64::new(u64::MAX),
        }
    }

    /// What one claim came to: its report, or `None` when it failed.
    fn record(&self, report: Option<&ClaimReport>) {
        match report {
            Some(report) => {
                self.claimed.fetch_add(report.claimed, Ordering::AcqRel);
                if let Some(again_in) = report.again_in {
                    let us = u64::try_from(again_in.as_micros()).unwrap_or(u64::MAX - 1);
                    self.again_in_us.fetch_min(us, Ordering::AcqRel);
                }
                self.needed
                    .store(report.left_out.unwrap_or(0), Ordering::Release);
                if report.full {
                    if !self.widened.swap(true, Ordering::AcqRel) {
                        self.in_flight.add_permits(CLAIMS_IN_FLIGHT - 1);
                    }
                } else if report.left_out.is_none() {
                    self.drained.store(true, Ordering::Release);
                }
            }
            None => {
                self.drained.store(true, Ordering::Release);
                self.failed.store(true, Ordering::Release);
            }
        }
    }
}

/// What [`Worker::give_back_held`] did.
#[derive(Debug, Default)]
pub(super) struct GivenBack {
    pub given_back: usize,
    /// Rows still RUNNING under this instance: locked by someone else, or not reached.
    pub left: usize,
    /// The database failure that ended the round, if one did.
    pub error: Option<DbError>,
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
    /// A limited queue was passed over and may have room this much later.
    pub again_in: Option<std::time::Duration>,
}

impl Worker {
    /// Claim until the queue runs dry or `stop` fires, one batch whenever the intake has room.
    /// Returns how many tasks it claimed, and whether it ended on a failure.
    pub(super) async fn fill(&self, stop: &CancellationToken) -> Scan {
        // No claim is on its way here: every claim that answered is in the registry.
        if self.inner.claim_unanswered.swap(false, Ordering::AcqRel) {
            if let Err(err) = self.release_unanswered().await {
                self.inner.claim_unanswered.store(true, Ordering::Release);
                log_failure!(
                    self.inner.claim_failures,
                    err,
                    "cannot look for the tasks of an unanswered claim; retrying at the next wake-up or poll"
                );
                return Scan {
                    claimed: 0,
                    failed: true,
                    again_in: None,
                };
            }
        }
        // One claim at a time until one comes back full; then up to CLAIMS_IN_FLIGHT claim
        // statements overlap, so that room freed while one claim is on its way is claimed
        // without waiting for it to come back. A wake-up for a single task costs one claim.
        let state = Arc::new(ScanState::new());
        let mut claims = tokio::task::JoinSet::new();
        'claims: loop {
            // Forget the claims that came back (a busy scan can go on for hours).
            while claims.try_join_next().is_some() {}
            let slot = tokio::select! {
                _ = stop.cancelled() => break,
                slot = Arc::clone(&state.in_flight).acquire_owned() => slot.expect("never closed"),
            };
            let room = loop {
                if state.drained.load(Ordering::Acquire) || stop.is_cancelled() {
                    break 'claims;
                }
                let need = state.needed.load(Ordering::Acquire);
                if let Some(room) = self.inner.intake.reserve(MAX_CLAIM_BATCH, need) {
                    break room;
                }
                tokio::select! {
                    _ = stop.cancelled() => break 'claims,
                    _ = self.inner.intake.freed() => {}
                }
            };
            let worker = self.clone();
            let state = Arc::clone(&state);
            claims.spawn(async move {
                let began = Instant::now();
                match worker.claim_and_start(room).await {
                    Ok(report) => {
                        log_recovery!(
                            worker.inner.claim_failures,
                            began = began,
                            "claims working again"
                        );
                        if report.claimed > 0 {
                            worker.found_work();
                        }
                        state.record(Some(&report));
                        // The database answers claims: ready, whatever the backlog.
                        worker.inner.scans.send_modify(|n| *n += 1);
                    }
                    Err(err) => {
                        state.record(None);
                        if err.is_unavailable() {
                            worker.inner.claim_unanswered.store(true, Ordering::Release);
                        }
                        log_failure!(
                            worker.inner.claim_failures,
                            err,
                            "claim failed; retrying at the next wake-up or poll"
                        );
                    }
                }
                drop(slot);
            });
        }
        // Return once no claim is on its way: the next scan starts from a settled state.
        while claims.join_next().await.is_some() {}
        let again_in_us = state.again_in_us.load(Ordering::Acquire);
        Scan {
            claimed: state.claimed.load(Ordering::Acquire),
            failed: state.failed.load(Ordering::Acquire),
            again_in: (again_in_us != u64::MAX)
                .then(|| std::time::Duration::from_micros(again_in_us)),
        }
    }

    /// A claim failed after it may have committed: its tasks are RUNNING under this instance
    /// but in no registry, and would wait for their lease to expire. Give each back, as a
    /// shutdown does. Their analyzers never ran. Called only while no claim is on its way.
    async fn release_unanswered(&self) -> Result<(), DbError> {
        let given = self.give_back_held(true, false, &HashSet::new()).await?;
        if given.given_back > 0 {
            tracing::warn!(
                tasks = given.given_back,
                "tasks of a claim whose answer was lost given back, never run"
            );
        }
        match given.error {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Give back the rows RUNNING under this instance (with `unregistered_only`, those no
    /// claim of the registry holds), each fenced on its claim's token: QUEUED, the attempt not
    /// counted; CANCELED if a cancel was requested. A row someone else holds is waited for
    /// only with `wait` (the last look of a stop, under its own bound), else left. The tasks
    /// in `parked` are left alone: their results are parked for a rescuer to write. A failure
    /// of the database ends the round; the rows not given back are counted as left.
    ///
    /// # Errors
    ///
    /// The database did not answer the look-up.
    pub(super) async fn give_back_held(
        &self,
        unregistered_only: bool,
        wait: bool,
        parked: &HashSet<i64>,
    ) -> Result<GivenBack, DbError> {
        let inner = &self.inner;
        let client = inner.pool.get().await?;
        let held = client
            .bounded(queue::held_by(
                &client,
                queue::lease_key(&inner.instance),
                &inner.config.queues,
            ))
            .await?;
        let held: Vec<(i64, i32, i64)> = held
            .into_iter()
            .filter(|(id, _, _)| !unregistered_only || !inner.running.contains(*id))
            .filter(|(id, _, _)| !parked.contains(id))
            .collect();
        let mut given = GivenBack::default();
        let total = held.len();
        for (n, (id, attempt, token)) in held.into_iter().enumerate() {
            match client
                .bounded(queue::release(&client, token, id, wait))
                .await
            {
                Ok(status) => {
                    given.given_back += 1;
                    tracing::debug!(id, attempt, claim = token, %status, "held task given back");
                }
                // Not given back: its lease expires.
                Err(FinishError::Locked) => given.left += 1,
                Err(FinishError::Db(err)) => {
                    given.left += total - n;
                    given.error = Some(err);
                    break;
                }
                // Changed meanwhile (finished by a late write, canceled, deleted): nothing of
                // ours to give back.
                Err(FinishError::NotRunning { .. } | FinishError::NotFound) => {}
            }
        }
        Ok(given)
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
        // Without the queues another daemon runs with a handler this one lacks.
        let queues = inner.withheld.claimable(&inner.config.queues);
        // While the database refuses to write results for want of room (a full disk), no
        // more is claimed once this lane holds as many results as its concurrency: the work
        // held in memory, to be run again should the daemon stop before there is room, stays
        // at the rounds claimed before the first refusal (docs/operations.md, "A full disk").
        let room_refused = inner.completer.held_for_room() >= inner.config.concurrency;
        let batch = async {
            if queues.is_empty() || room_refused {
                let nothing = queue::ClaimBatch::default();
                return Ok::<_, DbError>((nothing, std::time::Duration::ZERO, Instant::now()));
            }
            let client = inner.pool.get().await?;
            let sent = Instant::now();
            let batch = client
                .bounded(queue::claim_after(
                    &client,
                    queue::lease_key(&inner.instance),
                    &queues,
                    limits,
                    inner.config.lease,
                    after,
                ))
                .await?;
            let took = sent.elapsed();
            // One message per task: the largest payload is what its buffers grew to.
            let largest = batch
                .tasks
                .iter()
                .filter(|task| task.payload.is_some())
                .map(|task| task.bytes)
                .max();
            client.carried(largest.unwrap_or(0));
            Ok::<_, DbError>((batch, took, sent))
        }
        .await;
        let (batch, took, sent) = match batch {
            Ok(answer) => answer,
            Err(err) => {
                inner.intake.unreserve(room);
                return Err(err);
            }
        };
        let claimed = batch.tasks.len();
        let full = claimed == room.tasks;
        if let Some(after) = after {
            tracing::debug!(
                after_priority = after.priority,
                after_id = after.id,
                claimed,
                took_ms = took.as_secs_f64() * 1000.0,
                "claim after a position"
            );
        }
        if let Ok(mut floor) = inner.floor.lock() {
            floor.record(
                after,
                took,
                Instant::now(),
                claimed,
                batch.last,
                batch.left_out.is_some(),
            );
            pending.recorded = true;
        }
        inner.intake.claimed(room, claimed, batch.bytes, took);
        inner.summary.claimed(claimed);
        for task in batch.tasks {
            let cancel = inner.abort.child_token();
            // The database wrote the lease after `sent`: by this clock, it is good until then.
            let held = Held::new(
                &self.inner,
                &task,
                cancel.clone(),
                sent + inner.config.lease,
            );
            tracing::debug!(
                id = task.id,
                attempt = task.attempt,
                claim = task.token,
                "task claimed"
            );
            inner.metrics.claimed(task.waited);
            inner
                .tracker
                .spawn(self.clone().execute(task, held, cancel));
        }
        Ok(ClaimReport {
            claimed,
            full,
            left_out: batch.left_out,
            again_in: batch.again_in,
        })
    }
}
