//! Unit tests of the per-queue series (`queues.rs`): which queues a scrape gives series.

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
                waiting: 0,
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
        waiting: 0,
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
        7,
        "all seven series of a listed queue"
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
    assert_eq!(series_of(&text, "r120"), 7);
    assert_eq!(
        series_of(&text, "r22"),
        7,
        "the 99 longest after the daemon's own"
    );
    assert_eq!(series_of(&text, "r21"), 0);
    assert_eq!(series_of(&text, "default"), 7);
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
