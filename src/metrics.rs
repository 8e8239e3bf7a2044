//! The daemon's Prometheus metrics, served at `GET /metrics` in the text format.
//!
//! Counters and histograms are updated where things happen (the worker, the listener's
//! events, the rescuer); gauges that describe the table and the pool are read at scrape
//! time: QUEUED and RUNNING counts from their partial indexes (cheap, never a full scan), and
//! the pool's sessions in use.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::queue::TaskStatus;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

/// Every metric of one daemon.
pub struct Metrics {
    registry: Registry,
    claimed: Counter,
    finished: Family<StatusLabel, Counter>,
    released: Counter,
    claim_to_finish: Histogram,
    enqueue_to_start: Histogram,
    listener_reconnects: Counter,
    unknown_commits: Counter,
    rescued: Counter,
    tasks: Family<StatusLabel, Gauge>,
    pool_in_use: Gauge,
    pool_open: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("pgtaskd");
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
        let listener_reconnects = Counter::default();
        registry.register(
            "listener_reconnects",
            "Times the LISTEN connection was re-established",
            listener_reconnects.clone(),
        );
        let unknown_commits = Counter::default();
        registry.register(
            "unknown_commit_resolutions",
            "Finishes whose commit outcome was unknown and was resolved by re-reading the row",
            unknown_commits.clone(),
        );
        let rescued = Counter::default();
        registry.register(
            "lease_rescues",
            "Tasks whose expired lease this daemon's rescuer took back",
            rescued.clone(),
        );
        let tasks = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "tasks",
            "Tasks in the table by status (QUEUED and RUNNING only: counted from partial indexes)",
            tasks.clone(),
        );
        let pool_in_use = Gauge::default();
        registry.register(
            "pool_connections_in_use",
            "Worker sessions handed out by the pool",
            pool_in_use.clone(),
        );
        let pool_open = Gauge::default();
        registry.register(
            "pool_connections_open",
            "Worker sessions open in the pool",
            pool_open.clone(),
        );
        Metrics {
            registry,
            claimed,
            finished,
            released,
            claim_to_finish,
            enqueue_to_start,
            listener_reconnects,
            unknown_commits,
            rescued,
            tasks,
            pool_in_use,
            pool_open,
        }
    }

    pub fn claimed(&self, waited_seconds: f64) {
        self.claimed.inc();
        self.enqueue_to_start.observe(waited_seconds.max(0.0));
    }

    pub fn finished(&self, status: TaskStatus, claim_to_finish_seconds: f64) {
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

    pub fn listener_reconnected(&self) {
        self.listener_reconnects.inc();
    }

    pub fn unknown_commit_resolved(&self) {
        self.unknown_commits.inc();
    }

    pub fn rescued(&self, n: usize) {
        self.rescued.inc_by(n as u64);
    }

    /// Set the scrape-time gauges.
    pub fn observe_table_and_pool(&self, queued: i64, running: i64, pool: (usize, usize)) {
        for (status, n) in [(TaskStatus::Queued, queued), (TaskStatus::Running, running)] {
            self.tasks
                .get_or_create(&StatusLabel {
                    status: status.as_str(),
                })
                .set(n);
        }
        self.pool_open.set(pool.0 as i64);
        self.pool_in_use.set(pool.1 as i64);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_names_every_metric_with_its_values() {
        let metrics = Metrics::new();
        metrics.claimed(0.002);
        metrics.finished(TaskStatus::Succeeded, 0.01);
        metrics.finished(TaskStatus::Succeeded, 0.02);
        metrics.finished(TaskStatus::Failed, 0.01);
        metrics.finished(TaskStatus::Queued, 0.01);
        metrics.rescued(3);
        metrics.observe_table_and_pool(7, 2, (3, 1));
        let text = metrics.encode();
        for line in [
            "pgtaskd_tasks_claimed_total 1",
            "pgtaskd_tasks_finished_total{status=\"SUCCEEDED\"} 2",
            "pgtaskd_tasks_finished_total{status=\"FAILED\"} 1",
            "pgtaskd_tasks_released_total 1",
            "pgtaskd_lease_rescues_total 3",
            "pgtaskd_tasks{status=\"QUEUED\"} 7",
            "pgtaskd_tasks{status=\"RUNNING\"} 2",
            "pgtaskd_pool_connections_in_use 1",
            "pgtaskd_claim_to_finish_seconds_count 3",
            "pgtaskd_enqueue_to_start_seconds_count 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
