//! The worker's metrics: claims, finishes by terminal status, releases at shutdown, and the
//! two latencies a task's life is measured by. Updated by `src/worker/` as it claims
//! (`claim.rs`) and as each analyzer's outcome is committed (`execute.rs`); the daemon's own
//! VACUUM reads the claims counter to judge how much the table has churned.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::StatusLabel;
use crate::queue::TaskStatus;

pub(super) struct WorkerMetrics {
    claimed: Counter,
    finished: Family<StatusLabel, Counter>,
    released: Counter,
    /// Claims settled (finished or given back), for the daemon's own vacuum; not exposed.
    settled: std::sync::atomic::AtomicU64,
    claim_to_finish: Histogram,
    enqueue_to_start: Histogram,
}

impl WorkerMetrics {
    pub(super) fn register(registry: &mut Registry) -> WorkerMetrics {
        let claimed = Counter::default();
        registry.register(
            "tasks_claimed",
            "Tasks claimed by this daemon",
            claimed.clone(),
        );
        let finished = Family::<StatusLabel, Counter>::default();
        registry.register(
            "tasks_finished",
            "Tasks this daemon committed, by terminal status",
            finished.clone(),
        );
        let released = Counter::default();
        registry.register(
            "tasks_released",
            "Claims given back to QUEUED at shutdown",
            released.clone(),
        );
        let claim_to_finish = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        registry.register(
            "claim_to_finish_seconds",
            "Time from a claim to its committed finish",
            claim_to_finish.clone(),
        );
        let enqueue_to_start = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        registry.register(
            "enqueue_to_start_seconds",
            "Time from a task becoming due (created_at or run_at) to its claim",
            enqueue_to_start.clone(),
        );
        WorkerMetrics {
            claimed,
            finished,
            released,
            settled: std::sync::atomic::AtomicU64::new(0),
            claim_to_finish,
            enqueue_to_start,
        }
    }

    pub(super) fn claims(&self) -> u64 {
        self.claimed.get()
    }

    pub(super) fn settled(&self) -> u64 {
        self.settled.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn claimed(&self, waited_seconds: f64) {
        self.claimed.inc();
        self.enqueue_to_start.observe(waited_seconds.max(0.0));
    }

    /// A failed attempt was committed back to QUEUED for a later try: a settled claim, counted
    /// by `pgtaskd_handler_retries`, neither a finish nor a release.
    pub(super) fn retried(&self) {
        self.settled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A finish committed; [`TaskStatus::Queued`] is a claim given back, not a finish.
    pub(super) fn finished(&self, status: TaskStatus, claim_to_finish_seconds: f64) {
        self.settled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if status == TaskStatus::Queued {
            self.released.inc();
            return;
        }
        self.finished
            .get_or_create(&StatusLabel {
                status: status.as_str(),
            })
            .inc();
        self.claim_to_finish.observe(claim_to_finish_seconds);
    }
}
