//! Per-queue series, set at each scrape by the `GET /metrics` handler from `queue::backlog`:
//! WAITING, QUEUED, due and RUNNING tasks, the age of the oldest due task, whether the queue is
//! paused, and whether it is unserved (due tasks, and no live daemon of `pgtaskd.daemons`
//! serves it), each labelled with the queue.
//!
//! Any producer can name a new queue with each row it inserts, so at most [`QUEUE_SERIES`]
//! queues have series; [`choose`], a pure function, picks them: the daemon's own first, then
//! the paused ones, then the longest backlogs, then the queues that had series and have
//! nothing now, at zero, while there is room. The others lose their series (a zero would be
//! a lie) and are counted by `pgtaskd_queues_unlisted`; their tasks still count in the
//! totals by status.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::queue::{Backlog, TaskStatus};

/// The statuses a queue's `queue_tasks` series are of: those counted from partial indexes.
const SHOWN: [TaskStatus; 3] = [TaskStatus::Waiting, TaskStatus::Queued, TaskStatus::Running];

/// The most queues with per-queue series: past it, a producer that names a queue per row
/// would make every scrape, and the daemon's memory, grow without bound.
pub const QUEUE_SERIES: usize = 100;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStatusLabel {
    queue: String,
    status: &'static str,
}

pub(super) struct QueueMetrics {
    tasks: Family<QueueStatusLabel, Gauge>,
    due: Family<QueueLabel, Gauge>,
    oldest_due: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    paused: Family<QueueLabel, Gauge>,
    unserved: Family<QueueLabel, Gauge>,
    unlisted: Gauge,
    /// The queues with series now (at most [`QUEUE_SERIES`]): those absent from a scrape
    /// keep theirs, at zero, while there is room.
    seen: Mutex<BTreeSet<String>>,
    /// The queues this daemon serves: always given series.
    own: Vec<String>,
}

/// The queues given series at one scrape, with their figures, and how many were left out.
#[derive(Debug)]
pub(super) struct Chosen {
    pub(super) shown: Vec<Backlog>,
    pub(super) unlisted: i64,
}

/// Choose at most `limit` queues of `backlog` to give series: the `own` queues (at zero when
/// they have nothing), then the paused ones, then the longest backlogs (QUEUED + RUNNING; ties
/// by name), then the queues of `seen` (those with series until now) that have nothing now,
/// at zero, while there is room. `unlisted` counts the queues of `backlog` left out.
pub(super) fn choose(
    own: &[String],
    seen: &BTreeSet<String>,
    backlog: &[Backlog],
    limit: usize,
) -> Chosen {
    let zero = |queue: &str| Backlog {
        queue: queue.to_string(),
        paused: false,
        waiting: 0,
        queued: 0,
        due: 0,
        oldest_due_age_s: None,
        running: 0,
        served: false,
    };
    let is_own = |queue: &str| own.iter().any(|q| q == queue);
    let in_backlog: HashSet<&str> = backlog.iter().map(|b| b.queue.as_str()).collect();
    let mut ranked: Vec<&Backlog> = backlog.iter().collect();
    ranked.sort_by(|a, b| {
        is_own(&b.queue)
            .cmp(&is_own(&a.queue))
            .then(b.paused.cmp(&a.paused))
            .then((b.queued + b.running).cmp(&(a.queued + a.running)))
            .then(a.queue.cmp(&b.queue))
    });
    let listed = |shown: &[Backlog], queue: &str| shown.iter().any(|b| b.queue == queue);
    // Queues with nothing now, at zero, while there is room.
    let add_empty = |shown: &mut Vec<Backlog>, queues: &mut dyn Iterator<Item = &String>| {
        for queue in queues {
            if shown.len() < limit && !listed(shown, queue) && !in_backlog.contains(queue.as_str())
            {
                shown.push(zero(queue));
            }
        }
    };
    let mut shown: Vec<Backlog> = Vec::new();
    add_empty(&mut shown, &mut own.iter());
    let mut unlisted = 0;
    for figures in ranked {
        if listed(&shown, &figures.queue) {
            continue;
        }
        if shown.len() < limit {
            shown.push(figures.clone());
        } else {
            unlisted += 1;
        }
    }
    add_empty(&mut shown, &mut seen.iter());
    Chosen { shown, unlisted }
}

impl QueueMetrics {
    /// The families of a daemon serving `own`, whose series are always shown.
    pub(super) fn register(registry: &mut Registry, own: &[String]) -> QueueMetrics {
        let tasks = Family::<QueueStatusLabel, Gauge>::default();
        registry.register(
            "queue_tasks",
            "Tasks of a queue by status (WAITING, QUEUED and RUNNING only: counted from partial indexes)",
            tasks.clone(),
        );
        let due = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "queue_due_tasks",
            "QUEUED tasks of a queue whose run_at has come",
            due.clone(),
        );
        let oldest_due = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "queue_oldest_due_seconds",
            "How long the oldest due task of a queue has waited (0 when none is due)",
            oldest_due.clone(),
        );
        let paused = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "queue_paused",
            "1 while a queue is paused (pgtaskd pause), else 0",
            paused.clone(),
        );
        let unserved = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "queue_unserved",
            "1 while a queue has due tasks and no live daemon serves it (pgtaskd daemons), else 0",
            unserved.clone(),
        );
        let unlisted = Gauge::default();
        registry.register(
            "queues_unlisted",
            format!("Queues with tasks or a pause that have no per-queue series: past the first {QUEUE_SERIES} (the daemon's own, the paused, the longest backlogs)"),
            unlisted.clone(),
        );
        QueueMetrics {
            tasks,
            due,
            oldest_due,
            paused,
            unserved,
            unlisted,
            seen: Mutex::new(BTreeSet::new()),
            own: own.to_vec(),
        }
    }

    /// Set the per-queue gauges of a scrape from `backlog`, for the queues [`choose`] gives
    /// series; every other queue loses its series.
    pub(super) fn observe(&self, backlog: &[Backlog]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let Chosen { shown, unlisted } = choose(&self.own, &seen, backlog, QUEUE_SERIES);
        let listed = |shown: &[Backlog], queue: &str| shown.iter().any(|b| b.queue == queue);
        for gone in seen.iter().filter(|queue| !listed(&shown, queue)) {
            let queue = QueueLabel {
                queue: gone.clone(),
            };
            for status in SHOWN {
                self.tasks.remove(&QueueStatusLabel {
                    queue: gone.clone(),
                    status: status.as_str(),
                });
            }
            self.due.remove(&queue);
            self.oldest_due.remove(&queue);
            self.paused.remove(&queue);
            self.unserved.remove(&queue);
        }
        seen.clear();
        for figures in &shown {
            let queue = QueueLabel {
                queue: figures.queue.clone(),
            };
            for (status, n) in [
                (TaskStatus::Waiting, figures.waiting),
                (TaskStatus::Queued, figures.queued),
                (TaskStatus::Running, figures.running),
            ] {
                self.tasks
                    .get_or_create(&QueueStatusLabel {
                        queue: figures.queue.clone(),
                        status: status.as_str(),
                    })
                    .set(n);
            }
            self.due.get_or_create(&queue).set(figures.due);
            self.oldest_due
                .get_or_create(&queue)
                .set(figures.oldest_due_age_s.unwrap_or(0.0).max(0.0));
            self.paused
                .get_or_create(&queue)
                .set(i64::from(figures.paused));
            self.unserved
                .get_or_create(&queue)
                .set(i64::from(figures.unserved()));
            seen.insert(figures.queue.clone());
        }
        self.unlisted.set(unlisted);
    }
}

#[cfg(test)]
mod tests;
