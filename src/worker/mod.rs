//! The worker: wake (notify | poll) -> intake room -> claim -> permit -> analyze -> finish.
//!
//! One producer loop per daemon claims work, in batches sized to the room its
//! [`intake`] has: the free workers, plus as many tasks as the workers get through
//! while a claim is on its way (none for slow tasks, up to [`intake::MAX_AHEAD`] for
//! texts analyzed in microseconds). Each claimed task runs on a task of its own that takes one
//! of `worker.concurrency` permits before its analyzer starts. A task claimed ahead that is
//! canceled, or whose worker starts shutting down, before it got a permit is never analyzed:
//! it is committed CANCELED, or released to QUEUED without costing an attempt.
//!
//! Each running task has a cancellation token, a child of the worker's abort token. A user's
//! cancel fires it once the row confirms it (the listener's `pgtaskd_cancel` notification is
//! only a hint, read back by `cancel.rs`; the heartbeat reads `cancel_requested` too); so does
//! the abort phase of a shutdown. The analyzer runs on
//! a blocking thread (or inline, for short texts and an analyzer that never blocks) and is
//! always awaited to its return before the claim is finished, released or dropped: "asked
//! to stop" is never taken for "stopped".
//!
//! Every write after the analyzer belongs to the completer (`src/completer/`): finishes are
//! committed in batches, and a claim's permit returns once its outcome is queued, so that
//! claiming never waits for a commit. Finishing a claim survives database faults there
//! ("Re-read, never re-run" in docs/design.md): the row is re-read, the analyzer never runs
//! twice for one claim. A claim whose answer was lost is cleaned up by the next scan: the rows
//! RUNNING under this instance that no task of the registry holds are given back, as a
//! shutdown gives back its claims.
//!
//! | file | owns |
//! | --- | --- |
//! | `mod.rs` | the [`Worker`] handle, the producer loop ([`Worker::run`], [`Worker::run_once`]) |
//! | `claim.rs` | claiming batches, starting them, giving back unanswered claims |
//! | [`intake`] (`intake.rs`) | how many tasks to claim next |
//! | `execute.rs` | one claim: permit, analyzer (inline or blocking), settling |
//! | `registry.rs` | the running tasks and their cancellation tokens |
//! | `cancel.rs` | cancel notifications, confirmed in the database before they stop anything |
//! | `heartbeat.rs` | lease extension, and the cancel read it carries |
//! | `shutdown.rs` | the two-phase stop |
//!
//! Callers: [`crate::daemon`] runs [`Worker::run`] and [`Worker::shutdown`]; tests also call
//! [`Worker::run_once`].

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::{watch, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::analyzer::Analyzer;
use crate::backoff::jitter;
use crate::completer::Completer;
use crate::config::WorkerConfig;
use crate::db::{DbError, Pool};
use crate::metrics::Metrics;

mod cancel;
mod claim;
mod execute;
mod heartbeat;
pub mod intake;
mod registry;
mod shutdown;

use claim::MAX_CLAIM_BATCH;
use intake::{Intake, MAX_AHEAD};
use registry::Registry;

/// Outcomes that may wait for a batch commit, per unit of `worker.concurrency`.
const COMPLETION_QUEUE_PER_WORKER: usize = 4;

/// The worker of one daemon instance. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

struct Inner {
    /// Sessions for claiming, the heartbeat and the clean-up of unanswered claims.
    pool: Pool,
    /// Every write after the analyzer: batched finishes, releases, unknown outcomes.
    completer: Completer,
    /// Claims, finishes and their durations, for the Prometheus endpoint.
    metrics: Arc<Metrics>,
    /// How many scans for work the producer loop has completed (the first ends the start-up).
    scans: watch::Sender<u64>,
    /// What a claimed task's payload is run through.
    analyzer: Arc<dyn Analyzer>,
    /// Written as `lease_owner`: every claim and write is fenced on it.
    instance: String,
    /// Concurrency, lease, poll interval and queues to claim from.
    config: WorkerConfig,
    /// Claimed tasks not yet through the analyzer, against the claim-ahead target.
    intake: Intake,
    /// `worker.concurrency` permits: one per analyzer running.
    permits: Arc<Semaphore>,
    /// Wake-ups from [`Worker::wake`] (the listener's notifications), coalesced into one scan.
    wake: Notify,
    /// The tasks this worker holds, so that the cancel paths can stop their analyzers.
    running: Registry,
    /// Cancel notifications for tasks of this worker, not yet confirmed by their rows.
    cancel_hints: cancel::Hints,
    /// Every task spawned for a claim, so that a shutdown can wait for the last one.
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
                    Arc::clone(&metrics),
                ),
                intake: Intake::new(config.concurrency, config.max_inflight_bytes),
                metrics,
                scans: watch::channel(0).0,
                permits: Arc::new(Semaphore::new(config.concurrency)),
                pool,
                analyzer,
                instance,
                config,
                wake: Notify::new(),
                running: Registry::default(),
                cancel_hints: cancel::Hints::default(),
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

    /// Counts the scans for work completed so far; the first one ends the start-up.
    pub fn scans(&self) -> watch::Receiver<u64> {
        self.inner.scans.subscribe()
    }

    /// How many tasks this worker is running now.
    pub fn running(&self) -> usize {
        self.inner.running.len()
    }

    /// The producer loop: scan for work at start, on every wake-up and on every poll tick,
    /// until `stop` fires. Returns at once when it does; running tasks go on (see
    /// [`Worker::shutdown`]). The lease heartbeat runs alongside until the last task ended.
    pub async fn run(&self, stop: CancellationToken) {
        tokio::spawn(self.clone().heartbeat());
        tokio::spawn(self.clone().confirm_cancels());
        // A claim sent just before the stop may still bring tasks back after it: they are
        // given back unanalyzed (the first phase of the stop starts with the stop itself), so
        // nothing is started once the stop fired.
        tokio::spawn({
            let (stop, draining) = (stop.clone(), self.inner.draining.clone());
            async move {
                stop.cancelled().await;
                draining.cancel();
            }
        });
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
        let Some(room) = self.inner.intake.reserve(free, 0) else {
            return Ok(0);
        };
        Ok(self.claim_and_start(room).await?.claimed)
    }
}
