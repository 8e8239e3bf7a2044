//! Per-queue series, set at each scrape by the `GET /metrics` handler from `queue::backlog`:
//! QUEUED, due and RUNNING tasks, the age of the oldest due task, whether the queue is
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
            "Tasks of a queue by status (QUEUED and RUNNING only: counted from partial indexes)",
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
            for status in [TaskStatus::Queued, TaskStatus::Running] {
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
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    /// One scrape's inputs to [`choose`] and the queues it gives series, in its order.
    struct Case {
        what: &'static str,
        own: &'static [&'static str],
        seen: &'static [&'static str],
        /// (queue, QUEUED, RUNNING, paused)
        backlog: &'static [(&'static str, i64, i64, bool)],
        limit: usize,
        chosen: &'static [&'static str],
        unlisted: i64,
    }

    #[test]
    fn choose_gives_series_to_own_then_paused_then_longest_then_the_emptied_while_there_is_room() {
        let cases = [
            Case {
                what: "under the limit every queue, longest first",
                own: &[],
                seen: &[],
                backlog: &[("b", 1, 0, false), ("a", 5, 0, false)],
                limit: 3,
                chosen: &["a", "b"],
                unlisted: 0,
            },
            Case {
                what: "over the limit the longest backlogs, ties by name",
                own: &[],
                seen: &[],
                backlog: &[
                    ("a", 1, 0, false),
                    ("c", 3, 0, false),
                    ("b", 3, 0, false),
                    ("d", 2, 0, false),
                ],
                limit: 3,
                chosen: &["b", "c", "d"],
                unlisted: 1,
            },
            Case {
                what: "RUNNING tasks count in the backlog",
                own: &[],
                seen: &[],
                backlog: &[("a", 1, 5, false), ("b", 3, 0, false)],
                limit: 1,
                chosen: &["a"],
                unlisted: 1,
            },
            Case {
                what: "the daemon's own queue first, even empty",
                own: &["mine"],
                seen: &[],
                backlog: &[("a", 9, 0, false), ("b", 8, 0, false), ("c", 7, 0, false)],
                limit: 3,
                chosen: &["mine", "a", "b"],
                unlisted: 1,
            },
            Case {
                what: "the daemon's own queue first, however short",
                own: &["mine"],
                seen: &[],
                backlog: &[
                    ("a", 9, 0, false),
                    ("b", 8, 0, false),
                    ("mine", 1, 0, false),
                    ("c", 7, 0, false),
                ],
                limit: 3,
                chosen: &["mine", "a", "b"],
                unlisted: 1,
            },
            Case {
                what: "a paused queue before longer backlogs",
                own: &[],
                seen: &[],
                backlog: &[("a", 9, 0, false), ("b", 8, 0, false), ("held", 0, 0, true)],
                limit: 2,
                chosen: &["held", "a"],
                unlisted: 1,
            },
            Case {
                what: "an emptied queue keeps its series, at zero, while there is room",
                own: &[],
                seen: &["old", "a"],
                backlog: &[("a", 1, 0, false)],
                limit: 3,
                chosen: &["a", "old"],
                unlisted: 0,
            },
            Case {
                what: "an emptied queue loses its series when there is no room, uncounted",
                own: &[],
                seen: &["old"],
                backlog: &[("a", 3, 0, false), ("b", 2, 0, false), ("c", 1, 0, false)],
                limit: 3,
                chosen: &["a", "b", "c"],
                unlisted: 0,
            },
            Case {
                what: "a queue that had series and still has tasks is ranked as any other",
                own: &[],
                seen: &["a"],
                backlog: &[("a", 1, 0, false), ("b", 5, 0, false), ("c", 4, 0, false)],
                limit: 2,
                chosen: &["b", "c"],
                unlisted: 1,
            },
        ];
        for case in cases {
            let own: Vec<String> = case.own.iter().map(|q| q.to_string()).collect();
            let seen: BTreeSet<String> = case.seen.iter().map(|q| q.to_string()).collect();
            let backlog: Vec<Backlog> = case
                .backlog
                .iter()
                .map(|&(queue, queued, running, paused)| Backlog {
                    queue: queue.into(),
                    paused,
                    queued,
                    due: queued,
                    oldest_due_age_s: Some(1.0),
                    running,
                    served: true,
                })
                .collect();
            let chosen = choose(&own, &seen, &backlog, case.limit);
            let names: Vec<&str> = chosen.shown.iter().map(|b| b.queue.as_str()).collect();
            assert_eq!(names, case.chosen, "{}", case.what);
            assert_eq!(chosen.unlisted, case.unlisted, "{}", case.what);
            for shown in &chosen.shown {
                let figures = backlog.iter().find(|b| b.queue == shown.queue);
                match figures {
                    Some(figures) => assert_eq!(shown, figures, "{}", case.what),
                    None => assert!(
                        shown.queued == 0 && shown.running == 0 && !shown.paused,
                        "{}: {shown:?} at zero",
                        case.what
                    ),
                }
            }
        }
    }

    fn backlog_of(queue: &str, queued: i64, paused: bool) -> Backlog {
        Backlog {
            queue: queue.into(),
            paused,
            queued,
            due: queued,
            oldest_due_age_s: Some(1.0),
            running: 0,
            served: true,
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
            6,
            "all six series of a listed queue"
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
        assert_eq!(series_of(&text, "r120"), 6);
        assert_eq!(
            series_of(&text, "r22"),
            6,
            "the 99 longest after the daemon's own"
        );
        assert_eq!(series_of(&text, "r21"), 0);
        assert_eq!(series_of(&text, "default"), 6);
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
}
