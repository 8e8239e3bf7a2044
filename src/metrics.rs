//! The daemon's Prometheus metrics, served at `GET /metrics` in the text format.
//!
//! Counters and histograms are updated where things happen (the worker, the listener's
//! events, the rescuer); gauges that describe the table and the pool are read at scrape
//! time: QUEUED and RUNNING counts from their partial indexes (cheap, never a full scan), and
//! the pool's sessions in use; per queue (a `queue` label), QUEUED, due and RUNNING tasks, the
//! age of the oldest due task and whether the queue is paused. A queue that has nothing left
//! keeps its series, at zero.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::queue::{Backlog, TaskStatus};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStatusLabel {
    queue: String,
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
    queue_tasks: Family<QueueStatusLabel, Gauge>,
    queue_due: Family<QueueLabel, Gauge>,
    queue_oldest_due: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    queue_paused: Family<QueueLabel, Gauge>,
    /// Every queue given a series so far: those absent from a scrape are set to zero.
    queues_seen: Mutex<BTreeSet<String>>,
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
        let queue_tasks = Family::<QueueStatusLabel, Gauge>::default();
        registry.register(
            "queue_tasks",
            "Tasks of a queue by status (QUEUED and RUNNING only: counted from partial indexes)",
            queue_tasks.clone(),
        );
        let queue_due = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "queue_due_tasks",
            "QUEUED tasks of a queue whose run_at has come",
            queue_due.clone(),
        );
        let queue_oldest_due = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "queue_oldest_due_seconds",
            "How long the oldest due task of a queue has waited (0 when none is due)",
            queue_oldest_due.clone(),
        );
        let queue_paused = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "queue_paused",
            "1 while a queue is paused (pgtaskd pause), else 0",
            queue_paused.clone(),
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
            queue_tasks,
            queue_due,
            queue_oldest_due,
            queue_paused,
            queues_seen: Mutex::new(BTreeSet::new()),
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

    /// Set the per-queue gauges of a scrape from `backlog`; the queues seen before and not
    /// in it now are set to zero.
    pub fn observe_queues(&self, backlog: &[Backlog]) {
        let mut seen = self
            .queues_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let zero = |queue: &str| Backlog {
            queue: queue.to_string(),
            paused: false,
            queued: 0,
            due: 0,
            oldest_due_age_s: None,
            running: 0,
        };
        let absent: Vec<Backlog> = seen
            .iter()
            .filter(|queue| !backlog.iter().any(|b| &b.queue == *queue))
            .map(|queue| zero(queue))
            .collect();
        for figures in backlog.iter().chain(&absent) {
            let queue = QueueLabel {
                queue: figures.queue.clone(),
            };
            for (status, n) in [
                (TaskStatus::Queued, figures.queued),
                (TaskStatus::Running, figures.running),
            ] {
                self.queue_tasks
                    .get_or_create(&QueueStatusLabel {
                        queue: figures.queue.clone(),
                        status: status.as_str(),
                    })
                    .set(n);
            }
            self.queue_due.get_or_create(&queue).set(figures.due);
            self.queue_oldest_due
                .get_or_create(&queue)
                .set(figures.oldest_due_age_s.unwrap_or(0.0).max(0.0));
            self.queue_paused
                .get_or_create(&queue)
                .set(i64::from(figures.paused));
            seen.insert(figures.queue.clone());
        }
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
        metrics.observe_queues(&[Backlog {
            queue: "gone".into(),
            paused: false,
            queued: 1,
            due: 1,
            oldest_due_age_s: Some(2.0),
            running: 0,
        }]);
        metrics.observe_queues(&[Backlog {
            queue: "default".into(),
            paused: true,
            queued: 7,
            due: 5,
            oldest_due_age_s: Some(1.5),
            running: 2,
        }]);
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
            "pgtaskd_queue_tasks{queue=\"default\",status=\"QUEUED\"} 7",
            "pgtaskd_queue_tasks{queue=\"default\",status=\"RUNNING\"} 2",
            "pgtaskd_queue_due_tasks{queue=\"default\"} 5",
            "pgtaskd_queue_oldest_due_seconds{queue=\"default\"} 1.5",
            "pgtaskd_queue_paused{queue=\"default\"} 1",
            "pgtaskd_queue_tasks{queue=\"gone\",status=\"QUEUED\"} 0",
            "pgtaskd_queue_due_tasks{queue=\"gone\"} 0",
            "pgtaskd_queue_paused{queue=\"gone\"} 0",
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
