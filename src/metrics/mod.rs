//! The daemon's Prometheus metrics, served at `GET /metrics` in the text format.
//!
//! One small type per subsystem registers its own families into the daemon's one registry
//! (prefix `pgtaskd`) and is updated where things happen; [`Metrics`] holds them all, is what
//! the rest of the crate passes around, and encodes the registry.
//!
//! | module | families | updated by |
//! | --- | --- | --- |
//! | `worker` | claims, finishes by status, releases, claim-to-finish and enqueue-to-start | the worker, as it claims and settles each claim |
//! | `listener` | LISTEN reconnects | the daemon's listener events |
//! | `completer` | unknown-commit resolutions | the completer, re-reading a row |
//! | `maintenance` | lease rescues; the vacuum health of the task table | the rescuer; the vacuum-health watch, every `vacuum_health.check_interval` |
//! | `handlers` | per queue: each handler run's duration, failed attempts by kind, retries, snoozes | the worker's lanes, as each run returns |
//! | `progress` | progress reports taken, dropped by reason; flush statements and the rows they wrote | `src/progress/`, as reports come and flushes answer |
//! | `scrape` | QUEUED and RUNNING tasks, the pool's sessions | the `GET /metrics` handler, at each scrape |
//! | `queues` | per queue: QUEUED, due and RUNNING tasks, the oldest due task's age, paused; the queues left out | the `GET /metrics` handler, at each scrape |
//!
//! Gauges that describe the table and the pool are read at scrape time: QUEUED and RUNNING
//! counts from their partial indexes (cheap, never a full scan), and the pool's sessions in
//! use; per queue (a `queue` label), for at most [`QUEUE_SERIES`] queues (`queues`). The
//! vacuum health is the watch's last reading, never read at a scrape (`maintenance`).
//!
//! The families are encoded in the order they were registered: [`Metrics::serving`]
//! registers the subsystems in the order above.

mod completer;
mod handlers;
mod listener;
mod maintenance;
mod progress;
mod queues;
mod scrape;
mod worker;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use crate::queue::{Backlog, TaskStatus, VacuumHealth};
use completer::CompleterMetrics;
use handlers::HandlerMetrics;
use listener::ListenerMetrics;
use maintenance::{RescuerMetrics, VacuumHealthMetrics};
use progress::ProgressMetrics;
use queues::QueueMetrics;
pub use queues::QUEUE_SERIES;
use scrape::ScrapeMetrics;
use worker::WorkerMetrics;

/// A task status as a label: the worker's finishes and the scrape's totals.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

/// Every metric of one daemon.
pub struct Metrics {
    registry: Registry,
    worker: WorkerMetrics,
    listener: ListenerMetrics,
    completer: CompleterMetrics,
    rescuer: RescuerMetrics,
    scrape: ScrapeMetrics,
    queues: QueueMetrics,
    vacuum_health: VacuumHealthMetrics,
    handlers: HandlerMetrics,
    progress: ProgressMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// The metrics of a daemon that serves no queue in particular (tools and tests).
    pub fn new() -> Metrics {
        Metrics::serving(&[])
    }

    /// The metrics of a daemon serving `queues`, whose per-queue series are always shown.
    pub fn serving(queues: &[String]) -> Metrics {
        let mut registry = Registry::with_prefix("pgtaskd");
        // The order of registration is the order of the exposition.
        let worker = WorkerMetrics::register(&mut registry);
        let listener = ListenerMetrics::register(&mut registry);
        let completer = CompleterMetrics::register(&mut registry);
        let rescuer = RescuerMetrics::register(&mut registry);
        let scrape = ScrapeMetrics::register(&mut registry);
        let queues = QueueMetrics::register(&mut registry, queues);
        let vacuum_health = VacuumHealthMetrics::register(&mut registry);
        let handlers = HandlerMetrics::register(&mut registry);
        let progress = ProgressMetrics::register(&mut registry);
        Metrics {
            registry,
            worker,
            listener,
            completer,
            rescuer,
            scrape,
            queues,
            vacuum_health,
            handlers,
            progress,
        }
    }

    /// Tasks claimed since the daemon started.
    pub fn claims(&self) -> u64 {
        self.worker.claims()
    }

    /// Claims settled since the daemon started: finished, or given back to QUEUED.
    pub fn settled(&self) -> u64 {
        self.worker.settled()
    }

    pub fn claimed(&self, waited_seconds: f64) {
        self.worker.claimed(waited_seconds);
    }

    pub fn finished(&self, status: TaskStatus, claim_to_finish_seconds: f64) {
        self.worker.finished(status, claim_to_finish_seconds);
    }

    /// One run of queue `queue`'s handler took `seconds`; `failure` is the kind of a failed
    /// attempt.
    pub fn handler_ran(&self, queue: &str, seconds: f64, failure: Option<&'static str>) {
        self.handlers.ran(queue, seconds, failure);
    }

    /// A failed attempt of queue `queue`'s handler was put back for another try.
    /// It is not counted as finished nor as released (`pgtaskd_tasks_released`).
    pub fn handler_retried(&self, queue: &str) {
        self.worker.retried();
        self.handlers.retried(queue);
    }

    /// Queue `queue`'s handler asked to run a task later without using an attempt; not
    /// counted as finished nor as released.
    pub fn handler_snoozed(&self, queue: &str) {
        self.handlers.snoozed(queue);
    }

    /// A progress report was taken into memory.
    pub fn progress_reported(&self) {
        self.progress.reported();
    }

    /// A progress report was dropped, for `reason`.
    pub fn progress_dropped(&self, reason: &'static str) {
        self.progress.dropped(reason);
    }

    /// Rows of progress written since the daemon started: each leaves a dead row version
    /// (and, over about 2 KiB, a dead TOAST row).
    pub fn progress_writes(&self) -> u64 {
        self.progress.writes()
    }

    /// A flush statement wrote the progress of `rows` tasks.
    pub fn progress_flushed(&self, rows: usize) {
        self.progress.flushed(rows);
    }

    pub fn listener_reconnected(&self) {
        self.listener.reconnected();
    }

    pub fn unknown_commit_resolved(&self) {
        self.completer.unknown_commit_resolved();
    }

    /// A result is held: the database refused its finish for want of room (`refusal`, its
    /// words). Paired with [`Metrics::room_again`] once the claim is settled.
    pub fn held_for_room(&self, refusal: &str) {
        self.completer.held_for_room(refusal);
    }

    /// A write of this daemon (a finish, a heartbeat) was refused for want of room.
    pub fn refused_for_room(&self) {
        self.completer.refused_for_room();
    }

    /// How many writes were refused for want of room since the start.
    pub fn refused_for_room_count(&self) -> u64 {
        self.completer.refused_for_room_count()
    }

    /// A result held for room was settled (written, or given up on at a stop).
    pub fn room_again(&self) {
        self.completer.room_again();
    }

    /// How many results every lane holds for room now.
    pub fn held_for_room_count(&self) -> i64 {
        self.completer.held_for_room_count()
    }

    /// While results are held for room: the server's words for the last refusal.
    pub fn room_refusal(&self) -> Option<String> {
        self.completer.room_refusal()
    }

    pub fn rescued(&self, n: usize) {
        self.rescuer.rescued(n);
    }

    /// Set the per-queue gauges of a scrape from `backlog`, for at most [`QUEUE_SERIES`]
    /// queues: the daemon's own, then the paused ones, then the longest backlogs (ties by
    /// name); the queues that had series and have nothing now keep them, at zero, while there
    /// is room. Every other queue loses its series.
    pub fn observe_queues(&self, backlog: &[Backlog]) {
        self.queues.observe(backlog);
    }

    /// Set the scrape-time gauges: `tasks` is the table's (WAITING, QUEUED, RUNNING), `pool`
    /// the pool's (open, in use) sessions.
    pub fn observe_table_and_pool(&self, tasks: (i64, i64, i64), pool: (usize, usize)) {
        self.scrape.observe(tasks, pool);
    }

    /// Set the vacuum-health gauges from one reading: `horizon_age_s` is the horizon's age as
    /// the watch settled it (the server's, or its own estimate), `held` whether that is past
    /// the warning threshold.
    pub fn observe_vacuum(&self, health: &VacuumHealth, horizon_age_s: f64, held: bool) {
        self.vacuum_health.observe(health, horizon_age_s, held);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let reading = self.vacuum_health.for_scrape();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        drop(reading);
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
        metrics.progress_reported();
        metrics.progress_flushed(2);
        metrics.progress_dropped("percent");
        metrics.observe_table_and_pool((4, 7, 2), (3, 1));
        metrics.observe_queues(&[Backlog {
            queue: "gone".into(),
            paused: false,
            waiting: 0,
            queued: 1,
            due: 1,
            oldest_due_age_s: Some(2.0),
            running: 0,
            served: true,
        }]);
        metrics.observe_queues(&[Backlog {
            queue: "default".into(),
            paused: true,
            waiting: 4,
            queued: 7,
            due: 5,
            oldest_due_age_s: Some(1.5),
            running: 2,
            served: false,
        }]);
        let text = metrics.encode();
        for line in [
            "pgtaskd_tasks_claimed_total 1",
            "pgtaskd_tasks_finished_total{status=\"SUCCEEDED\"} 2",
            "pgtaskd_tasks_finished_total{status=\"FAILED\"} 1",
            "pgtaskd_tasks_released_total 1",
            "pgtaskd_lease_rescues_total 3",
            "pgtaskd_tasks{status=\"WAITING\"} 4",
            "pgtaskd_tasks{status=\"QUEUED\"} 7",
            "pgtaskd_tasks{status=\"RUNNING\"} 2",
            "pgtaskd_pool_connections_in_use 1",
            "pgtaskd_queue_tasks{queue=\"default\",status=\"WAITING\"} 4",
            "pgtaskd_queue_tasks{queue=\"default\",status=\"QUEUED\"} 7",
            "pgtaskd_queue_tasks{queue=\"default\",status=\"RUNNING\"} 2",
            "pgtaskd_queue_due_tasks{queue=\"default\"} 5",
            "pgtaskd_queue_oldest_due_seconds{queue=\"default\"} 1.5",
            "pgtaskd_queue_paused{queue=\"default\"} 1",
            "pgtaskd_queue_unserved{queue=\"default\"} 1",
            "pgtaskd_queue_tasks{queue=\"gone\",status=\"QUEUED\"} 0",
            "pgtaskd_queue_due_tasks{queue=\"gone\"} 0",
            "pgtaskd_queue_paused{queue=\"gone\"} 0",
            "pgtaskd_queue_unserved{queue=\"gone\"} 0",
            "pgtaskd_claim_to_finish_seconds_count 3",
            "pgtaskd_progress_reports_total 1",
            "pgtaskd_progress_flushes_total 1",
            "pgtaskd_progress_writes_total 2",
            "pgtaskd_progress_dropped_total{reason=\"percent\"} 1",
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
