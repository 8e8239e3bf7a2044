//! The worker: wake (notify | poll) -> intake room -> claim -> permit -> analyze -> finish.
//!
//! One producer loop per daemon claims work, in batches sized to the room its
//! [`crate::intake`] has: the free workers, plus as many tasks as the workers get through
//! while a claim is on its way (none for slow tasks, up to [`crate::intake::MAX_AHEAD`] for
//! texts analyzed in microseconds). Each claimed task runs on a task of its own that takes one
//! of `worker.concurrency` permits before its analyzer starts. A task claimed ahead that is
//! canceled, or whose worker starts shutting down, before it got a permit is never analyzed:
//! it is committed CANCELED, or released to QUEUED without costing an attempt.
//!
//! Each running task has a cancellation token, a child of the worker's abort token. A user's
//! cancel (the listener's `pgtaskd_cancel` notification, or the heartbeat's read of
//! `cancel_requested`) fires it; so does the abort phase of a shutdown. The analyzer runs on
//! a blocking thread (or inline, for short texts and an analyzer that never blocks) and is
//! always awaited to its return before the claim is finished, released or dropped: "asked
//! to stop" is never taken for "stopped".
//!
//! Finished claims are committed in batches by the [`crate::completer`]; a claim's permit
//! returns once its outcome is queued, so that claiming never waits for a commit.
//!
//! Finishing a claim survives database faults (invariant 4): when the connection fails after
//! the finish was sent, the result stays in memory, the row is re-read on a fresh connection
//! (with capped, jittered backoff while the database is down), and then accepted (terminal),
//! finished again (still RUNNING under this claim) or dropped (claim lost). The analyzer
//! never runs twice for one claim. A claim whose answer was lost is cleaned up by the next
//! scan: the rows RUNNING under this instance that no task of the registry holds are given
//! back, as a shutdown gives back its claims.
//!
//! Callers: [`crate::daemon`] runs [`Worker::run`] and [`Worker::shutdown`]; tests also call
//! [`Worker::run_once`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::analyzer::{AnalyzeError, Analyzer};
use crate::backoff::{jitter, Backoff};
use crate::completer::Completer;
use crate::config::WorkerConfig;
use crate::db::{DbError, Pool, Session};
use crate::intake::{Intake, MAX_AHEAD};
use crate::metrics::Metrics;
use crate::queue::{self, Claimed, FinishError, Outcome, TaskStatus};

/// Outcomes that may wait for a batch commit, per unit of `worker.concurrency`.
const COMPLETION_QUEUE_PER_WORKER: usize = 4;
/// Claim statements that may be on their way at once.
const CLAIMS_IN_FLIGHT: usize = 2;
/// The most tasks one claim statement takes.
const MAX_CLAIM_BATCH: usize = 100;
/// Retry delays while a finish cannot reach the database.
const COMMIT_RETRY_BASE: Duration = Duration::from_millis(50);
const COMMIT_RETRY_CAP: Duration = Duration::from_secs(5);

/// The worker of one daemon instance. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    completer: Completer,
    metrics: Arc<Metrics>,
    /// How many scans for work the producer loop has completed.
    scans: watch::Sender<u64>,
    analyzer: Arc<dyn Analyzer>,
    instance: String,
    config: WorkerConfig,
    /// Claimed tasks not yet through the analyzer, against the claim-ahead target.
    intake: Intake,
    /// `worker.concurrency` permits: one per analyzer running.
    permits: Arc<Semaphore>,
    wake: Notify,
    running: Mutex<HashMap<i64, Running>>,
    tracker: TaskTracker,
    /// The first phase of a shutdown: tasks still waiting for a permit give their claim back.
    draining: CancellationToken,
    /// Fires the tokens of every running task: the second phase of a shutdown.
    abort: CancellationToken,
    /// Ends the heartbeat, once the last task ended.
    heartbeat_stop: CancellationToken,
    /// A claim failed with the database unreachable: it may have committed with its answer
    /// lost. The next scan gives back what it took.
    claim_unanswered: AtomicBool,
}

/// A task this worker runs, as the cancel paths find it.
struct Running {
    attempt: i32,
    cancel: CancellationToken,
}

/// What to do with a claim once its analyzer returned.
#[derive(Debug)]
enum Action {
    Finish(Outcome),
    /// Shutdown stopped the analyzer: give the claim back.
    Release,
}

impl Worker {
    /// A worker that claims for instance `instance` from `pool`.
    pub fn new(
        pool: Pool,
        analyzer: Arc<dyn Analyzer>,
        instance: String,
        config: WorkerConfig,
        metrics: Arc<Metrics>,
    ) -> Worker {
        Worker {
            inner: Arc::new(Inner {
                completer: Completer::start(
                    pool.clone(),
                    instance.clone(),
                    COMPLETION_QUEUE_PER_WORKER * config.concurrency + MAX_AHEAD,
                ),
                intake: Intake::new(config.concurrency),
                metrics,
                scans: watch::channel(0).0,
                permits: Arc::new(Semaphore::new(config.concurrency)),
                pool,
                analyzer,
                instance,
                config,
                wake: Notify::new(),
                running: Mutex::new(HashMap::new()),
                tracker: TaskTracker::new(),
                draining: CancellationToken::new(),
                abort: CancellationToken::new(),
                heartbeat_stop: CancellationToken::new(),
                claim_unanswered: AtomicBool::new(false),
            }),
        }
    }

    /// The instance id written as `lease_owner`.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// Ask the producer loop to look for work now. Wake-ups are coalesced: many calls while
    /// the loop is busy make one more scan.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// A cancel request for task `id` arrived: stop its analyzer if this worker runs it. The
    /// database already holds `cancel_requested`; the finish will commit CANCELED.
    pub fn cancel_running(&self, id: i64) {
        let running = self
            .inner
            .running
            .lock()
            .expect("running-task registry poisoned");
        if let Some(task) = running.get(&id) {
            tracing::info!(
                id,
                attempt = task.attempt,
                "cancel requested; stopping the analyzer"
            );
            task.cancel.cancel();
        }
    }

    /// Counts the scans for work completed so far; the first one ends the start-up.
    pub fn scans(&self) -> watch::Receiver<u64> {
        self.inner.scans.subscribe()
    }

    /// How many tasks this worker is running now.
    pub fn running(&self) -> usize {
        self.inner
            .running
            .lock()
            .expect("running-task registry poisoned")
            .len()
    }

    /// The producer loop: scan for work at start, on every wake-up and on every poll tick,
    /// until `stop` fires. Returns at once when it does; running tasks go on (see
    /// [`Worker::shutdown`]). The lease heartbeat runs alongside until the last task ended.
    pub async fn run(&self, stop: CancellationToken) {
        tokio::spawn(self.clone().heartbeat());
        loop {
            self.fill(&stop).await;
            self.inner.scans.send_modify(|n| *n += 1);
            let poll = jitter(self.inner.config.poll_interval);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.inner.wake.notified() => {}
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// Claim one batch, as many tasks as there are free permits (at most one claim
    /// statement), and start them. Returns how many were claimed. Never waits for room.
    ///
    /// # Errors
    ///
    /// Database failures; nothing was claimed.
    pub async fn run_once(&self) -> Result<usize, DbError> {
        let free = self.inner.permits.available_permits().min(MAX_CLAIM_BATCH);
        let wanted = self.inner.intake.reserve(free);
        if wanted == 0 {
            return Ok(0);
        }
        self.claim_and_start(wanted).await
    }

    /// Claim until the queue runs dry or `stop` fires, one batch whenever the intake has room.
    async fn fill(&self, stop: &CancellationToken) {
        // No claim is on its way here: every claim that answered is in the registry.
        if self.inner.claim_unanswered.swap(false, Ordering::AcqRel) {
            if let Err(err) = self.release_unanswered().await {
                self.inner.claim_unanswered.store(true, Ordering::Release);
                tracing::warn!(error = %crate::db::describe(&err), "cannot look for the tasks of an unanswered claim; retrying at the next wake-up or poll");
                return;
            }
        }
        // One claim at a time until one comes back full; then up to CLAIMS_IN_FLIGHT claim
        // statements overlap, so that room freed while one claim is on its way is claimed
        // without waiting for it to come back. A wake-up for a single task costs one claim.
        let in_flight = Arc::new(Semaphore::new(1));
        let widened = Arc::new(AtomicBool::new(false));
        let drained = Arc::new(AtomicBool::new(false));
        let mut claims = tokio::task::JoinSet::new();
        'claims: loop {
            // Forget the claims that came back (a busy scan can go on for hours).
            while claims.try_join_next().is_some() {}
            let slot = tokio::select! {
                _ = stop.cancelled() => break,
                slot = Arc::clone(&in_flight).acquire_owned() => slot.expect("never closed"),
            };
            let wanted = loop {
                if drained.load(Ordering::Acquire) || stop.is_cancelled() {
                    break 'claims;
                }
                let wanted = self.inner.intake.reserve(MAX_CLAIM_BATCH);
                if wanted > 0 {
                    break wanted;
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
            claims.spawn(async move {
                match worker.claim_and_start(wanted).await {
                    Ok(claimed) if claimed == wanted => {
                        if !widened.swap(true, Ordering::AcqRel) {
                            in_flight.add_permits(CLAIMS_IN_FLIGHT - 1);
                        }
                    }
                    Ok(_) => drained.store(true, Ordering::Release),
                    Err(err) => {
                        drained.store(true, Ordering::Release);
                        if err.is_unavailable() {
                            worker.inner.claim_unanswered.store(true, Ordering::Release);
                        }
                        tracing::warn!(error = %crate::db::describe(&err), "claim failed; retrying at the next wake-up or poll");
                    }
                }
                drop(slot);
            });
        }
        // Return once no claim is on its way: the next scan starts from a settled state.
        while claims.join_next().await.is_some() {}
    }

    /// A claim failed after it may have committed: its tasks are RUNNING under this instance
    /// but in no registry, and would wait for their lease to expire. Give each back, fenced on
    /// its attempt, as a shutdown does (QUEUED, the attempt not counted; CANCELED if a cancel
    /// was requested). Their analyzers never ran. Called only while no claim is on its way.
    async fn release_unanswered(&self) -> Result<(), DbError> {
        let inner = &self.inner;
        let client = inner.pool.get().await?;
        let held = client
            .bounded(queue::held_by(&client, &inner.instance))
            .await?;
        let unanswered: Vec<(i64, i32)> = {
            let running = inner
                .running
                .lock()
                .expect("running-task registry poisoned");
            held.into_iter()
                .filter(|(id, _)| !running.contains_key(id))
                .collect()
        };
        for (id, attempt) in unanswered {
            match client
                .bounded(queue::release(&client, &inner.instance, id, attempt))
                .await
            {
                Ok(status) => {
                    tracing::warn!(id, attempt, %status, "task of a claim whose answer was lost given back");
                }
                Err(FinishError::Db(err)) => return Err(err),
                // Changed meanwhile (canceled, deleted): nothing of ours to give back.
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Claim up to `wanted` tasks, whose room in the intake is reserved, and start them.
    async fn claim_and_start(&self, wanted: usize) -> Result<usize, DbError> {
        let inner = &self.inner;
        let tasks = async {
            let client = inner.pool.get().await?;
            let sent = Instant::now();
            let tasks = client
                .bounded(queue::claim(
                    &client,
                    &inner.instance,
                    &inner.config.queues,
                    wanted,
                    inner.config.lease,
                ))
                .await?;
            inner.intake.claim_took(sent.elapsed());
            Ok::<_, DbError>(tasks)
        }
        .await;
        let tasks = match tasks {
            Ok(tasks) => tasks,
            Err(err) => {
                inner.intake.done(wanted);
                return Err(err);
            }
        };
        let claimed = tasks.len();
        inner.intake.done(wanted - claimed);
        for task in tasks {
            let cancel = inner.abort.child_token();
            inner
                .running
                .lock()
                .expect("running-task registry poisoned")
                .insert(
                    task.id,
                    Running {
                        attempt: task.attempt,
                        cancel: cancel.clone(),
                    },
                );
            tracing::info!(id = task.id, attempt = task.attempt, "task claimed");
            inner.metrics.claimed(task.waited);
            inner.tracker.spawn(self.clone().execute(task, cancel));
        }
        Ok(claimed)
    }

    /// Wait for a permit, analyze one claimed task and commit what came of it.
    async fn execute(self, task: Claimed, cancel: CancellationToken) {
        let started = Instant::now();
        let Claimed {
            id,
            attempt,
            payload,
            ..
        } = task;
        let inner = &self.inner;
        let permit = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            _ = inner.draining.cancelled() => None,
            permit = Arc::clone(&inner.permits).acquire_owned() => {
                Some(permit.expect("the worker's semaphore is never closed"))
            }
        };
        let Some(permit) = permit else {
            // Never started: a cancel request makes it CANCELED, a shutdown gives it back.
            inner.intake.done(1);
            let action = if cancel.is_cancelled() && !inner.abort.is_cancelled() {
                Action::Finish(Outcome::Canceled)
            } else {
                Action::Release
            };
            let result = self.commit(id, attempt, &action, false).await;
            self.settle(id, attempt, started, &action, result);
            return;
        };
        let analysis = inner.intake.analysis();
        let action = self.analyze(id, attempt, payload, &cancel).await;
        inner.intake.done(1);
        // The analyzer has returned: from here on, nothing else may stop this claim. Its
        // permit goes back as soon as the outcome is queued for a batch, so that the next
        // claims need not wait for this commit.
        let result = match &action {
            Action::Finish(outcome) => {
                let finish = queue::Finish {
                    id,
                    attempt,
                    outcome: outcome.clone(),
                };
                let answer = inner.completer.submit(finish).await;
                drop(permit);
                drop(analysis);
                match answer.await {
                    Ok(Ok(result)) => result,
                    Ok(Err(failed)) => {
                        tracing::warn!(
                            id,
                            attempt,
                            outcome_unknown = failed.outcome_unknown,
                            error = failed.message,
                            "batched finish failed; settling the task alone"
                        );
                        self.commit(id, attempt, &action, failed.outcome_unknown)
                            .await
                    }
                    Err(_) => self.commit(id, attempt, &action, true).await,
                }
            }
            Action::Release => {
                let result = self.commit(id, attempt, &action, false).await;
                drop(permit);
                result
            }
        };
        self.settle(id, attempt, started, &action, result);
    }

    /// Run the analyzer on `payload`, and say what to do with the claim.
    async fn analyze(
        &self,
        id: i64,
        attempt: i32,
        payload: String,
        cancel: &CancellationToken,
    ) -> Action {
        tracing::debug!(id, attempt, bytes = payload.len(), "analyzer run");
        let analyzed = if payload.len() < self.inner.analyzer.inline_below() {
            // Short work for an analyzer that never blocks: no hop to a blocking thread. A
            // panic is caught here as the blocking thread would catch it, so that the claim
            // is finished (FAILED) rather than left running.
            let analyzer = &self.inner.analyzer;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                analyzer.analyze(&payload, cancel)
            }))
            .map_err(|panic| panic_message(panic.as_ref()))
        } else {
            let analyzer = Arc::clone(&self.inner.analyzer);
            let token = cancel.clone();
            tokio::task::spawn_blocking(move || analyzer.analyze(&payload, &token))
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
            Ok(Err(AnalyzeError::Canceled { .. })) if self.inner.abort.is_cancelled() => {
                Action::Release
            }
            Ok(Err(AnalyzeError::Canceled { .. })) => Action::Finish(Outcome::Canceled),
            Err(panic) => Action::Finish(Outcome::Failed(format!("analyzer panicked: {panic}"))),
        }
    }

    /// The claim is settled: forget it, count it and log it.
    fn settle(
        &self,
        id: i64,
        attempt: i32,
        started: Instant,
        action: &Action,
        result: Result<TaskStatus, FinishError>,
    ) {
        self.inner
            .running
            .lock()
            .expect("running-task registry poisoned")
            .remove(&id);
        let duration = started.elapsed();
        if let Ok(status) = &result {
            self.inner.metrics.finished(*status, duration.as_secs_f64());
        }
        match (result, action) {
            (Ok(status), Action::Finish(Outcome::Succeeded(counts)))
                if status == TaskStatus::Succeeded =>
            {
                tracing::info!(id, attempt, %status, words = counts.words, bytes = counts.bytes, runes = counts.runes, ?duration, "task finished");
            }
            (Ok(status), Action::Finish(Outcome::Failed(error)))
                if status == TaskStatus::Failed =>
            {
                tracing::info!(id, attempt, %status, words = 0, bytes = 0, runes = 0, ?duration, error = error.as_str(), "task finished");
            }
            (Ok(status), Action::Release) if status == TaskStatus::Queued => {
                tracing::info!(id, attempt, %status, ?duration, "task released for another daemon");
            }
            (Ok(status), _) => {
                tracing::info!(id, attempt, %status, words = 0, bytes = 0, runes = 0, ?duration, "task finished");
            }
            (Err(FinishError::NotRunning { status }), _) => {
                tracing::warn!(id, attempt, %status, "claim lost before the finish; result dropped");
            }
            (Err(FinishError::NotFound), _) => {
                tracing::warn!(id, attempt, "task deleted while it ran; result dropped");
            }
            (Err(FinishError::Db(err)), _) => {
                tracing::error!(id, attempt, error = %crate::db::describe(&err), "finish failed; the lease will expire");
            }
        }
    }

    /// Apply `action` to the claim, retrying until the database answers. After a failure
    /// whose outcome is unknown, re-read before writing again.
    async fn commit(
        &self,
        id: i64,
        attempt: i32,
        action: &Action,
        mut outcome_unknown: bool,
    ) -> Result<TaskStatus, FinishError> {
        let mut backoff = Backoff::new(COMMIT_RETRY_BASE, COMMIT_RETRY_CAP);
        loop {
            let result = match self.inner.pool.get().await {
                Err(err) => Err(FinishError::Db(err)),
                Ok(client) if outcome_unknown => self.resolve(&client, id, attempt, action).await,
                Ok(client) => self.apply(&client, id, attempt, action).await,
            };
            match result {
                Err(FinishError::Db(err)) => {
                    let delay = backoff.next_delay();
                    let retry_in_ms = delay.as_millis() as u64;
                    let error = crate::db::describe(&err);
                    if err.is_unavailable() {
                        // The statement may or may not have committed.
                        outcome_unknown = true;
                        tracing::warn!(
                            id,
                            attempt,
                            error,
                            retry_in_ms,
                            "commit outcome unknown; will re-read the row"
                        );
                    } else {
                        // The server answered with an error: nothing was written.
                        tracing::warn!(id, attempt, error, retry_in_ms, "finish failed; retrying");
                    }
                    tokio::time::sleep(delay).await;
                }
                other => return other,
            }
        }
    }

    async fn apply(
        &self,
        client: &Session,
        id: i64,
        attempt: i32,
        action: &Action,
    ) -> Result<TaskStatus, FinishError> {
        let owner = &self.inner.instance;
        match action {
            Action::Finish(outcome) => {
                client
                    .bounded(queue::finish(client, owner, id, attempt, outcome))
                    .await
            }
            Action::Release => {
                client
                    .bounded(queue::release(client, owner, id, attempt))
                    .await
            }
        }
    }

    /// Invariant 4: find out what became of a write whose outcome is unknown.
    async fn resolve(
        &self,
        client: &Session,
        id: i64,
        attempt: i32,
        action: &Action,
    ) -> Result<TaskStatus, FinishError> {
        let state = client.bounded(queue::reread(client, id)).await?;
        self.inner.metrics.unknown_commit_resolved();
        let Some(state) = state else {
            tracing::warn!(
                id,
                attempt,
                found = "no row",
                "commit outcome unknown: resolved"
            );
            return Err(FinishError::NotFound);
        };
        let ours = state.status == TaskStatus::Running
            && state.attempt == attempt
            && state.lease_owner.as_deref() == Some(self.inner.instance.as_str());
        if ours {
            tracing::warn!(
                id,
                attempt,
                found = "still running under this claim",
                "commit outcome unknown: resolved; applying the same finish again"
            );
            return self.apply(client, id, attempt, action).await;
        }
        let landed = match action {
            Action::Finish(_) => state.status.is_terminal() && state.attempt == attempt,
            Action::Release => {
                state.status == TaskStatus::Queued || state.status == TaskStatus::Canceled
            }
        };
        if landed {
            tracing::warn!(id, attempt, found = %state.status, "commit outcome unknown: resolved; the write had landed");
            Ok(state.status)
        } else {
            tracing::warn!(id, attempt, found = %state.status, found_attempt = state.attempt, "commit outcome unknown: resolved; the claim was lost");
            Err(FinishError::NotRunning {
                status: state.status,
            })
        }
    }

    /// Extend the leases of running tasks every third of a lease, and stop the analyzers of
    /// tasks whose cancellation was requested (a lost notification) or whose claim was lost.
    async fn heartbeat(self) {
        let period = self.inner.config.lease / 3;
        loop {
            tokio::select! {
                _ = self.inner.heartbeat_stop.cancelled() => return,
                _ = tokio::time::sleep(jitter(period)) => {}
            }
            let claims: Vec<(i64, i32)> = {
                let running = self
                    .inner
                    .running
                    .lock()
                    .expect("running-task registry poisoned");
                running
                    .iter()
                    .map(|(id, task)| (*id, task.attempt))
                    .collect()
            };
            if claims.is_empty() {
                continue;
            }
            let ids: Vec<i64> = claims.iter().map(|(id, _)| *id).collect();
            let extended = match self.inner.pool.get().await {
                Ok(client) => {
                    client
                        .bounded(queue::heartbeat(
                            &client,
                            &self.inner.instance,
                            &ids,
                            self.inner.config.lease,
                        ))
                        .await
                }
                Err(err) => Err(err),
            };
            let extended = match extended {
                Ok(extended) => extended,
                Err(err) => {
                    tracing::warn!(error = %crate::db::describe(&err), "lease heartbeat failed");
                    continue;
                }
            };
            let running = self
                .inner
                .running
                .lock()
                .expect("running-task registry poisoned");
            for &(id, attempt) in &claims {
                let Some(task) = running.get(&id) else {
                    continue;
                };
                match extended.iter().find(|e| e.id == id) {
                    Some(e) if e.cancel_requested && !task.cancel.is_cancelled() => {
                        tracing::info!(
                            id,
                            attempt,
                            "cancel requested (seen by the heartbeat); stopping the analyzer"
                        );
                        task.cancel.cancel();
                    }
                    Some(_) => {}
                    None => {
                        tracing::warn!(
                            id,
                            attempt,
                            "lease lost; stopping the analyzer, its result will be dropped"
                        );
                        task.cancel.cancel();
                    }
                }
            }
        }
    }

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

/// The message of a panic payload, as far as it is text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}
