//! The worker: wake (notify | poll) -> intake room -> claim -> permit -> analyze -> finish.
//!
//! One producer loop per daemon claims work when woken (a notification, which inserts send
//! only while some daemon is flagged idle, see `idle.rs`), at its poll tick, and by itself
//! while it keeps finding work. It claims, in batches sized to the room its
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
//! | `floor.rs` | where a claim starts: the front of the queue, or after a position while claims from the front are slow |
//! | `idle.rs` | after a scan: lingering, the idle flag the insert trigger reads, the window's watch |
//! | [`intake`] (`intake.rs`) | how many tasks to claim next |
//! | `execute.rs` | one claim: permit, analyzer (inline or blocking), its outcome to the completer |
//! | `held.rs` | what one claimed task holds (registry entry, intake bytes, permit), given back on drop |
//! | `registry.rs` | the running tasks and their cancellation tokens |
//! | `cancel.rs` | cancel notifications, confirmed in the database before they stop anything |
//! | `heartbeat.rs` | lease extension, and the cancel read it carries |
//! | `expiry.rs` | stopping the work of claims whose leases run out without a heartbeat |
//! | `shutdown.rs` | the two-phase stop |
//! | `summary.rs` | the minute's summary line, in place of a line per task at info level |
//! | `withheld.rs` | queues left out of claims while another daemon runs them with a handler this one lacks |
//!
//! Callers: [`crate::daemon`] runs [`Worker::run`] and [`Worker::shutdown`]; tests also call
//! [`Worker::run_once`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
mod expiry;
mod floor;
mod handle;
mod heartbeat;
mod held;
mod idle;
pub mod intake;
mod lanes;
mod registry;
mod shared;
mod shutdown;
mod summary;
mod withheld;

use claim::MAX_CLAIM_BATCH;
pub use idle::ttl as idle_flag_ttl;
use intake::{Intake, MAX_AHEAD};
pub use lanes::{Lane, LaneHandler, Workers};
use registry::Registry;
pub use withheld::Withheld;

/// The longest a stopping worker waits for its idle flag to be removed.
const CLEAR_ON_STOP: Duration = Duration::from_secs(1);

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
    /// How many claim statements have answered plus scans for work completed: the first after
    /// the listener is up ends the start-up. A claim's answer counts alone, because a scan
    /// with a backlog goes on claiming as room frees, until the backlog is drained.
    scans: watch::Sender<u64>,
    /// What a claimed task's payload is run through, unless the lane has a handler.
    analyzer: Arc<dyn Analyzer>,
    /// The queue's handler (`exec`, `http`) and its retry policy, for a lane of its own.
    handler: Option<lanes::LaneHandler>,
    /// The lane's name (its queue), empty for the default lane: its idle flag and its log.
    lane: String,
    /// `worker.concurrency` permits and counts shared by every lane of the daemon, when it
    /// has several (`shared.rs`).
    shared: Option<Arc<shared::Shared>>,
    /// The queues left out of claims (`withheld.rs`), shared by every lane of the daemon.
    withheld: Arc<Withheld>,
    /// The daemon's instance id: its idle flag's key, and its key
    /// ([`crate::queue::lease_key`]) is every claim's `lease_owner`.
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
    /// The claims' failures since the last claim that worked, for the log.
    claim_failures: crate::repeats::Repeats,
    /// The listener reconnected since the idle flag was last written.
    relisten: AtomicBool,
    /// Whether this daemon's idle flag is written (`idle.rs`).
    flag: idle::Flag,
    /// What this worker's tasks came to since the last summary line.
    summary: summary::Summary,
    /// Where the next claim may start while claims from the start are slow (`claim.rs`).
    floor: std::sync::Mutex<floor::Floor>,
}

impl Worker {
    /// A worker that claims for instance `instance` from `pool`, running every task of
    /// `config.queues` through `analyzer`.
    pub fn new(
        pool: Pool,
        analyzer: Arc<dyn Analyzer>,
        instance: String,
        config: WorkerConfig,
        metrics: Arc<Metrics>,
    ) -> Worker {
        Worker::for_lane(pool, analyzer, instance, config, metrics, Lane::default())
    }

    /// A worker of one lane of the daemon (`lanes.rs`): its queues in `config.queues`, its
    /// concurrency in `config.concurrency`, its handler and shared permits in `lane`.
    pub fn for_lane(
        pool: Pool,
        analyzer: Arc<dyn Analyzer>,
        instance: String,
        config: WorkerConfig,
        metrics: Arc<Metrics>,
        lane: Lane,
    ) -> Worker {
        Worker {
            inner: Arc::new(Inner {
                completer: Completer::start(
                    pool.clone(),
                    COMPLETION_QUEUE_PER_WORKER * config.concurrency + MAX_AHEAD,
                    Arc::clone(&metrics),
                ),
                intake: Intake::sharing(
                    config.concurrency,
                    config.max_inflight_bytes,
                    lane.shared.clone(),
                ),
                metrics,
                scans: watch::channel(0).0,
                permits: Arc::new(Semaphore::new(config.concurrency)),
                pool,
                analyzer,
                handler: lane.handler,
                lane: lane.name,
                shared: lane.shared,
                withheld: lane.withheld,
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
                claim_failures: crate::repeats::Repeats::new(),
                relisten: AtomicBool::new(false),
                flag: idle::Flag::default(),
                summary: summary::Summary::default(),
                floor: std::sync::Mutex::default(),
            }),
        }
    }

    /// The daemon's instance id, whose key is written as `lease_owner`.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// The key of this worker's idle flag: the instance id, with the lane's name for a lane
    /// of its own.
    fn flag_key(&self) -> std::borrow::Cow<'_, str> {
        if self.inner.lane.is_empty() {
            std::borrow::Cow::Borrowed(&self.inner.instance)
        } else {
            std::borrow::Cow::Owned(format!("{}/{}", self.inner.instance, self.inner.lane))
        }
    }

    /// Ask the producer loop to look for work now. Wake-ups are coalesced: many calls while
    /// the loop is busy make one more scan.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// The listener has a new session: the idle flag is written again after the next scan
    /// that finds nothing (a crash or a promotion of the server empties the flags).
    pub fn relisten(&self) {
        self.inner.relisten.store(true, Ordering::Release);
    }

    /// Counts the claim statements answered and the scans for work completed so far; the
    /// first one ends the start-up.
    pub fn scans(&self) -> watch::Receiver<u64> {
        self.inner.scans.subscribe()
    }

    /// How many tasks this worker is running now.
    pub fn running(&self) -> usize {
        self.inner.running.len()
    }

    /// The producer loop: scan for work at start, on every wake-up and on every poll tick,
    /// and, while the daemon finds work, every millisecond until it has found none for 5 ms;
    /// then, once it has room for another task, flag the daemon idle, so that inserts notify
    /// (see `idle.rs`), until `stop` fires. Returns when it does, once its idle flag is removed
    /// (at most a second); running tasks go on (see [`Worker::shutdown`]). The lease
    /// heartbeat runs alongside until the last task ended.
    pub async fn run(&self, stop: CancellationToken) {
        tokio::spawn(self.clone().heartbeat());
        tokio::spawn(self.clone().expire_leases());
        tokio::spawn(self.clone().confirm_cancels());
        tokio::spawn(self.clone().summarize());
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
        let mut idle = idle::IdleState::default();
        let mut scan_now = true;
        let mut scan = claim::Scan::default();
        let mut poll_at = Instant::now();
        // When a limited queue passed over by the last scan may have room (docs/limits.md).
        let mut limited_at: Option<Instant> = None;
        loop {
            if scan_now {
                scan = self.fill(&stop).await;
                if stop.is_cancelled() {
                    break;
                }
                limited_at = scan.again_in.map(|after| Instant::now() + after);
                if self.after_scan(&mut idle, scan).await {
                    // Flagged idle: the last claim, which sees every producer that read the
                    // flags before they held this one and committed since.
                    continue;
                }
                self.inner.scans.send_modify(|n| *n += 1);
                poll_at = Instant::now() + jitter(self.inner.config.poll_interval);
            }
            let room = self.inner.intake.has_room();
            let wait = idle.wait(Instant::now(), scan, self.inner.config.poll_interval, room);
            let (until, watch) = match wait {
                idle::Wait::Scan(after) => ((Instant::now() + after).min(poll_at), false),
                idle::Wait::Idle { watch_at: Some(at) } if at < poll_at => (at, true),
                idle::Wait::Room | idle::Wait::Idle { .. } => (poll_at, false),
            };
            let for_room = matches!(wait, idle::Wait::Room);
            scan_now = tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.inner.wake.notified() => true,
                _ = self.inner.intake.freed(), if for_room => true,
                _ = sleep_until_some(limited_at) => true,
                _ = tokio::time::sleep_until(until.into()) => {
                    !watch || self.check_watched(&mut idle).await
                }
            };
        }
        // Inserts stop notifying for this daemon (or its flag expires, if the database does
        // not answer in time).
        let _ = tokio::time::timeout(CLEAR_ON_STOP, self.clone().clear_flag(true)).await;
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

/// Sleep until `at`, or for ever when there is none.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
