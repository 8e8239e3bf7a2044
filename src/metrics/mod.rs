//! The daemon's Prometheus metrics, served at `GET /metrics` in the text format.
//!
//! Counters and histograms are updated where things happen (the worker, the listener's
//! events, the rescuer); gauges that describe the table and the pool are read at scrape
//! time: QUEUED and RUNNING counts from their partial indexes (cheap, never a full scan), and
//! the pool's sessions in use; per queue (a `queue` label), QUEUED, due and RUNNING tasks, the
//! age of the oldest due task and whether the queue is paused. A queue that has nothing left
//! keeps its series, at zero. Any producer can name a new queue with each row it inserts, so
//! at most [`QUEUE_SERIES`] queues have series: the daemon's own first, then the paused ones,
//! then the longest backlogs; the others are counted by `pgtaskd_queues_unlisted`, and their
//! tasks still count in the totals by status.
//!
//! The vacuum health of the task table (docs/design.md, "Vacuum health") is not read at
//! scrape time: the daemon's watch (`src/maintenance/vacuum_health.rs`) reads it every `vacuum_health.check_interval`
//! and sets its gauges here, so a storm of scrapes costs the database nothing for it; the age
//! of that reading is a gauge of its own. The horizon's gauges carry one series, labelled with
//! the kind of what holds it (`none` when nothing does); the holder's pid, name and state are
//! a series of their own only while the horizon is held past the warning threshold, so that
//! the statements that come and go do not make a new series at every reading. No label ever
//! holds query text.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::queue::{Backlog, TaskStatus, VacuumHealth};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TupleLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabel {
    part: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByLabel {
    by: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// What holds the horizon: a session's pid, `application_name` and state, a slot's name (and
/// the pid using it); empty when not known. Never query text.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HolderLabel {
    kind: &'static str,
    pid: String,
    name: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStatusLabel {
    queue: String,
    status: &'static str,
}

/// The most queues with per-queue series: past it, a producer that names a queue per row
/// would make every scrape, and the daemon's memory, grow without bound.
pub const QUEUE_SERIES: usize = 100;

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
    /// The queues with series now (at most [`QUEUE_SERIES`]): those absent from a scrape
    /// keep theirs, at zero, while there is room.
    queues_seen: Mutex<BTreeSet<String>>,
    /// The queues this daemon serves: always given series.
    own_queues: Vec<String>,
    queues_unlisted: Gauge,
    table_tuples: Family<TupleLabel, Gauge>,
    table_bytes: Family<PartLabel, Gauge>,
    table_vacuum_age: Family<ByLabel, Gauge<f64, AtomicU64>>,
    table_vacuum_count: Family<ByLabel, Gauge>,
    horizon_age_s: Family<KindLabel, Gauge<f64, AtomicU64>>,
    horizon_age_xids: Family<KindLabel, Gauge>,
    horizon_held: Gauge,
    horizon_holder: Family<HolderLabel, Gauge>,
    vacuum_reading_age: Gauge<f64, AtomicU64>,
    /// When the vacuum health was last read; held (with the lock) while its families are
    /// cleared and set, and while encoding, so that a scrape never sees them half set.
    vacuum_read_at: Mutex<Option<Instant>>,
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
        let queues_unlisted = Gauge::default();
        registry.register(
            "queues_unlisted",
            format!("Queues with tasks or a pause that have no per-queue series: past the first {QUEUE_SERIES} (the daemon's own, the paused, the longest backlogs)"),
            queues_unlisted.clone(),
        );
        let table_tuples = Family::<TupleLabel, Gauge>::default();
        registry.register(
            "table_tuples",
            "Live and dead tuples of pgtaskd.tasks (the statistics system's estimates)",
            table_tuples.clone(),
        );
        let table_bytes = Family::<PartLabel, Gauge>::default();
        registry.register(
            "table_bytes",
            "Size of pgtaskd.tasks: heap, TOAST (table and index) and indexes",
            table_bytes.clone(),
        );
        let table_vacuum_age = Family::<ByLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "table_vacuum_age_seconds",
            "Seconds since the last vacuum of pgtaskd.tasks, by autovacuum or by a VACUUM \
             command (no series: none since the statistics were reset)",
            table_vacuum_age.clone(),
        );
        let table_vacuum_count = Family::<ByLabel, Gauge>::default();
        registry.register(
            "table_vacuum_count",
            "Vacuums of pgtaskd.tasks since the statistics were reset, by autovacuum or by a \
             VACUUM command",
            table_vacuum_count.clone(),
        );
        let horizon_age_s = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "xmin_horizon_age_seconds",
            "How long the oldest xmin horizon holding back vacuum of pgtaskd.tasks has been \
             held; kind: session, prepared_transaction, replication_slot, or none (0)",
            horizon_age_s.clone(),
        );
        let horizon_age_xids = Family::<KindLabel, Gauge>::default();
        registry.register(
            "xmin_horizon_age_transactions",
            "Transaction ids assigned since the oldest xmin horizon; kind as for its age",
            horizon_age_xids.clone(),
        );
        let horizon_held = Gauge::default();
        registry.register(
            "xmin_horizon_held",
            "1 while the xmin horizon is held back longer than health.xmin_horizon_warning",
            horizon_held.clone(),
        );
        let horizon_holder = Family::<HolderLabel, Gauge>::default();
        registry.register(
            "xmin_horizon_holder",
            "1 for what holds the xmin horizon back longer than health.xmin_horizon_warning: \
             kind, the session's pid, application_name and state, or the slot's name",
            horizon_holder.clone(),
        );
        let vacuum_reading_age = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "vacuum_health_reading_age_seconds",
            "Seconds since the table and horizon figures were read (every \
             health.check_interval); NaN before the first reading",
            vacuum_reading_age.clone(),
        );
        vacuum_reading_age.set(f64::NAN);
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
            own_queues: queues.to_vec(),
            queues_unlisted,
            table_tuples,
            table_bytes,
            table_vacuum_age,
            table_vacuum_count,
            horizon_age_s,
            horizon_age_xids,
            horizon_held,
            horizon_holder,
            vacuum_reading_age,
            vacuum_read_at: Mutex::new(None),
        }
    }

    /// Tasks claimed since the daemon started.
    pub fn claims(&self) -> u64 {
        self.claimed.get()
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

    /// Set the per-queue gauges of a scrape from `backlog`, for at most [`QUEUE_SERIES`]
    /// queues: the daemon's own, then the paused ones, then the longest backlogs (ties by
    /// name); the queues that had series and have nothing now keep them, at zero, while there
    /// is room. Every other queue loses its series.
    pub fn observe_queues(&self, backlog: &[Backlog]) {
        let mut seen = self
            .queues_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let zero = |queue: &str| Backlog {
            queue: queue.to_string(),
            paused: false,
            queued: 0,
            due: 0,
            oldest_due_age_s: None,
            running: 0,
        };
        let own = |queue: &str| self.own_queues.iter().any(|q| q == queue);
        let in_backlog: HashSet<&str> = backlog.iter().map(|b| b.queue.as_str()).collect();
        let mut ranked: Vec<&Backlog> = backlog.iter().collect();
        ranked.sort_by(|a, b| {
            own(&b.queue)
                .cmp(&own(&a.queue))
                .then(b.paused.cmp(&a.paused))
                .then((b.queued + b.running).cmp(&(a.queued + a.running)))
                .then(a.queue.cmp(&b.queue))
        });
        let listed = |shown: &[Backlog], queue: &str| shown.iter().any(|b| b.queue == queue);
        // Queues with nothing now, at zero, while there is room.
        let add_empty = |shown: &mut Vec<Backlog>, queues: &mut dyn Iterator<Item = &String>| {
            for queue in queues {
                if shown.len() < QUEUE_SERIES
                    && !listed(shown, queue)
                    && !in_backlog.contains(queue.as_str())
                {
                    shown.push(zero(queue));
                }
            }
        };
        let mut shown: Vec<Backlog> = Vec::new();
        add_empty(&mut shown, &mut self.own_queues.iter());
        let mut unlisted = 0;
        for figures in ranked {
            if listed(&shown, &figures.queue) {
                continue;
            }
            if shown.len() < QUEUE_SERIES {
                shown.push(figures.clone());
            } else {
                unlisted += 1;
            }
        }
        add_empty(&mut shown, &mut seen.iter());
        for gone in seen.iter().filter(|queue| !listed(&shown, queue)) {
            let queue = QueueLabel {
                queue: gone.clone(),
            };
            for status in [TaskStatus::Queued, TaskStatus::Running] {
                self.queue_tasks.remove(&QueueStatusLabel {
                    queue: gone.clone(),
                    status: status.as_str(),
                });
            }
            self.queue_due.remove(&queue);
            self.queue_oldest_due.remove(&queue);
            self.queue_paused.remove(&queue);
        }
        seen.clear();
        for figures in &shown {
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
        self.queues_unlisted.set(unlisted);
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

    /// Set the vacuum-health gauges from one reading: `horizon_age_s` is the horizon's age as
    /// the watch settled it (the server's, or its own estimate), `held` whether that is past
    /// the warning threshold.
    pub fn observe_vacuum(&self, health: &VacuumHealth, horizon_age_s: f64, held: bool) {
        let mut read_at = self
            .vacuum_read_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *read_at = Some(Instant::now());
        for (state, n) in [("live", health.live_tuples), ("dead", health.dead_tuples)] {
            self.table_tuples
                .get_or_create(&TupleLabel { state })
                .set(n);
        }
        for (part, n) in [
            ("heap", health.table_bytes),
            ("toast", health.toast_bytes),
            ("indexes", health.index_bytes),
        ] {
            self.table_bytes.get_or_create(&PartLabel { part }).set(n);
        }
        for (by, age, count) in [
            ("vacuum", health.vacuum_age_s, health.vacuum_count),
            (
                "autovacuum",
                health.autovacuum_age_s,
                health.autovacuum_count,
            ),
        ] {
            match age {
                Some(age) => {
                    self.table_vacuum_age
                        .get_or_create(&ByLabel { by })
                        .set(age.max(0.0));
                }
                None => {
                    self.table_vacuum_age.remove(&ByLabel { by });
                }
            }
            self.table_vacuum_count
                .get_or_create(&ByLabel { by })
                .set(count);
        }
        let kind = health.horizon.as_ref().map_or("none", |h| h.kind.as_str());
        self.horizon_age_s.clear();
        self.horizon_age_xids.clear();
        self.horizon_holder.clear();
        self.horizon_age_s
            .get_or_create(&KindLabel { kind })
            .set(horizon_age_s.max(0.0));
        self.horizon_age_xids
            .get_or_create(&KindLabel { kind })
            .set(health.horizon.as_ref().map_or(0, |h| h.age_xids));
        self.horizon_held.set(i64::from(held));
        if let Some(horizon) = health.horizon.as_ref().filter(|_| held) {
            self.horizon_holder
                .get_or_create(&HolderLabel {
                    kind,
                    pid: horizon.pid.map(|p| p.to_string()).unwrap_or_default(),
                    name: horizon.name.clone().unwrap_or_default(),
                    state: horizon.state.clone().unwrap_or_default(),
                })
                .set(1);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let read_at = self
            .vacuum_read_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = *read_at {
            self.vacuum_reading_age.set(at.elapsed().as_secs_f64());
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        drop(read_at);
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

    fn backlog_of(queue: &str, queued: i64, paused: bool) -> Backlog {
        Backlog {
            queue: queue.into(),
            paused,
            queued,
            due: queued,
            oldest_due_age_s: Some(1.0),
            running: 0,
        }
    }

    fn series_of(text: &str, queue: &str) -> usize {
        let label = format!("queue=\"{queue}\"");
        text.lines().filter(|line| line.contains(&label)).count()
    }

    #[test]
    fn per_queue_series_stop_at_the_limit_keeping_own_paused_and_longest_queues() {
        let metrics = Metrics::serving(&["default".to_string()]);
        // A producer naming a queue per row: 150 queues of 1..=150 tasks, one paused and
        // empty; the daemon's own queue has nothing.
        let mut backlog: Vec<Backlog> = (1..=150)
            .map(|n| backlog_of(&format!("q{n}"), n, false))
            .collect();
        backlog.push(backlog_of("held", 0, true));
        metrics.observe_queues(&backlog);
        let text = metrics.encode();
        let queues: BTreeSet<&str> = text
            .lines()
            .filter(|line| line.starts_with("pgtaskd_queue_paused{"))
            .map(|line| line.split('"').nth(1).unwrap())
            .collect();
        assert_eq!(queues.len(), QUEUE_SERIES, "{queues:?}");
        assert!(
            queues.contains("default"),
            "the daemon's own queue, at zero"
        );
        assert!(queues.contains("held"), "a paused queue");
        assert!(
            queues.contains("q150") && queues.contains("q53"),
            "{queues:?}"
        );
        assert!(!queues.contains("q52"), "the shortest backlogs go unlisted");
        assert_eq!(
            series_of(&text, "q150"),
            5,
            "all five series of a listed queue"
        );
        assert!(
            text.lines()
                .any(|line| line == "pgtaskd_queues_unlisted 52"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|line| line == "pgtaskd_queue_tasks{queue=\"default\",status=\"QUEUED\"} 0"),
            "{text}"
        );

        // The flood drains; new queues take the places, and a queue pushed out loses its
        // series rather than showing a zero it does not have.
        let mut backlog: Vec<Backlog> = (1..=120)
            .map(|n| backlog_of(&format!("r{n}"), 1000 + n, false))
            .collect();
        backlog.push(backlog_of("q150", 1, false));
        metrics.observe_queues(&backlog);
        let text = metrics.encode();
        assert_eq!(series_of(&text, "q150"), 0, "{text}");
        assert_eq!(
            series_of(&text, "q53"),
            0,
            "emptied, and no room left for it"
        );
        assert_eq!(series_of(&text, "r120"), 5);
        assert_eq!(
            series_of(&text, "r22"),
            5,
            "the 99 longest after the daemon's own"
        );
        assert_eq!(series_of(&text, "r21"), 0);
        assert_eq!(series_of(&text, "default"), 5);
        assert!(text
            .lines()
            .any(|line| line == "pgtaskd_queues_unlisted 22"));

        // Under the limit again: a queue that empties keeps its series, at zero.
        metrics.observe_queues(&[backlog_of("r120", 3, false)]);
        metrics.observe_queues(&[]);
        let text = metrics.encode();
        assert!(
            text.lines()
                .any(|line| line == "pgtaskd_queue_due_tasks{queue=\"r120\"} 0"),
            "{text}"
        );
        assert!(text.lines().any(|line| line == "pgtaskd_queues_unlisted 0"));
    }

    #[test]
    fn the_vacuum_gauges_show_one_horizon_and_its_holder_only_while_held() {
        use crate::queue::{Horizon, HorizonKind};
        let metrics = Metrics::new();
        assert!(metrics
            .encode()
            .contains("pgtaskd_vacuum_health_reading_age_seconds NaN"));
        let mut health = VacuumHealth {
            live_tuples: 10,
            dead_tuples: 90,
            vacuum_age_s: None,
            autovacuum_age_s: Some(12.5),
            vacuum_count: 0,
            autovacuum_count: 3,
            table_bytes: 8192,
            toast_bytes: 16384,
            index_bytes: 40960,
            horizon: Some(Horizon {
                kind: HorizonKind::Session,
                xid: 700,
                age_xids: 42,
                age_s: Some(400.0),
                pid: Some(4711),
                name: Some("analyst \"q\"".into()),
                state: Some("idle in transaction".into()),
            }),
            sees_all_sessions: true,
        };
        metrics.observe_vacuum(&health, 400.0, true);
        let text = metrics.encode();
        for line in [
            "pgtaskd_table_tuples{state=\"live\"} 10",
            "pgtaskd_table_tuples{state=\"dead\"} 90",
            "pgtaskd_table_bytes{part=\"heap\"} 8192",
            "pgtaskd_table_bytes{part=\"toast\"} 16384",
            "pgtaskd_table_bytes{part=\"indexes\"} 40960",
            "pgtaskd_table_vacuum_age_seconds{by=\"autovacuum\"} 12.5",
            "pgtaskd_table_vacuum_count{by=\"vacuum\"} 0",
            "pgtaskd_table_vacuum_count{by=\"autovacuum\"} 3",
            "pgtaskd_xmin_horizon_age_seconds{kind=\"session\"} 400.0",
            "pgtaskd_xmin_horizon_age_transactions{kind=\"session\"} 42",
            "pgtaskd_xmin_horizon_held 1",
            "pgtaskd_xmin_horizon_holder{kind=\"session\",pid=\"4711\",name=\"analyst \\\"q\\\"\",state=\"idle in transaction\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            !text.contains("by=\"vacuum\"} 0.0"),
            "never vacuumed: no series"
        );
        health.horizon = None;
        health.vacuum_age_s = Some(1.0);
        metrics.observe_vacuum(&health, 0.0, false);
        let text = metrics.encode();
        for line in [
            "pgtaskd_xmin_horizon_age_seconds{kind=\"none\"} 0.0",
            "pgtaskd_xmin_horizon_age_transactions{kind=\"none\"} 0",
            "pgtaskd_xmin_horizon_held 0",
            "pgtaskd_table_vacuum_age_seconds{by=\"vacuum\"} 1.0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("kind=\"session\""), "{text}");
        assert!(!text.contains("pgtaskd_xmin_horizon_holder{"), "{text}");
        assert!(!text.contains("reading_age_seconds NaN"), "{text}");
    }
}
