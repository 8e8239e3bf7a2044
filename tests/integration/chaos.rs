//! Chaos: three daemon processes under seeded random `kill -9`, restarts and terminated
//! sessions while tasks stream in. At the end every task is terminal, SUCCEEDED rows carry
//! the right counts, no row ever left a terminal state, and no task's analyzer ran more often
//! than it was claimed.

use std::collections::HashMap;
use std::time::Duration;

use pgtaskd::events::ANALYZER_RUN;

use crate::support::{audit, eventually, expected_counts, payload, DaemonProcess, TestDb, WAIT};

const DAEMONS: usize = 3;
const ROUNDS: usize = 40;
const TASKS_PER_ROUND: usize = 100;
const CONFIG: &str = "[worker]\nconcurrency = 4\nlease = \"1s\"\npoll_interval = \"200ms\"\n";

/// Every `(id, attempt)` in an [`ANALYZER_RUN`] debug line.
fn analyzer_runs(log: &str) -> Vec<(i64, i32)> {
    log.lines()
        .filter(|line| line.contains(ANALYZER_RUN))
        .filter_map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(name))
                    .and_then(|value| value.parse::<i64>().ok())
            };
            Some((field("id=")?, field("attempt=")? as i32))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_kills_restarts_and_terminated_sessions_lose_nothing_and_finish_nothing_twice() {
    let seed = std::env::var("PGTASKD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261130_u64);
    println!("chaos seed {seed} (set PGTASKD_CHAOS_SEED to replay)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;

    let mut running: Vec<DaemonProcess> = (0..DAEMONS)
        .map(|_| DaemonProcess::start(&db, CONFIG, &[]))
        .collect();
    let mut dead: Vec<DaemonProcess> = Vec::new();
    let (mut kills, mut terminations) = (0, 0);
    for round in 0..ROUNDS {
        let payloads: Vec<String> = (0..TASKS_PER_ROUND)
            .map(|i| payload(round * TASKS_PER_ROUND + i))
            .collect();
        client
            .execute(
                "INSERT INTO pgtaskd.tasks (payload, max_attempts) SELECT unnest($1::text[]), 20",
                &[&payloads],
            )
            .await
            .unwrap();
        match rng.u32(0..10) {
            0..=2 => {
                let victim = rng.usize(..running.len());
                let mut daemon = running.swap_remove(victim);
                daemon.signal(libc::SIGKILL);
                daemon.wait().await;
                dead.push(daemon);
                running.push(DaemonProcess::start(&db, CONFIG, &[]));
                kills += 1;
            }
            3..=5 => {
                let terminated: i64 = client
                    .query_one(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
                          WHERE datname = current_database() AND application_name LIKE 'pgtaskd/%'
                            AND random() < 0.5",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                terminations += terminated;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(20..200))).await;
    }
    println!("chaos: {kills} kills, {terminations} terminated sessions");

    let total = (ROUNDS * TASKS_PER_ROUND) as i64;
    eventually(WAIT * 2, "every task to be terminal", || {
        let client = &client;
        async move {
            let left: i64 = client
                .query_one(
                    "SELECT count(*) FROM pgtaskd.task_view WHERE status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED')",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (left == 0).then_some(())
        }
    })
    .await;

    let rows = client
        .query(
            "SELECT id, payload, status, words, bytes, runes, attempt FROM pgtaskd.task_view",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len() as i64, total);
    let mut attempts = HashMap::new();
    for row in &rows {
        let text: &str = row.get(1);
        let status: &str = row.get(2);
        assert_ne!(status, "CANCELED", "nobody canceled anything");
        if status == "SUCCEEDED" {
            let got = (
                row.get::<_, i64>(3),
                row.get::<_, i64>(4),
                row.get::<_, i64>(5),
            );
            assert_eq!(got, expected_counts(text));
        }
        attempts.insert(row.get::<_, i64>(0), row.get::<_, i32>(6));
    }
    let retried = attempts.values().filter(|a| **a > 1).count();
    println!("chaos: {retried} tasks needed more than one claim");
    assert_eq!(audit::transitions_out_of_terminal(&client).await, 0);
    assert_eq!(audit::tasks_finished_twice(&client).await, 0);

    for daemon in &mut running {
        daemon.signal(libc::SIGTERM);
        assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    }
    let mut runs: HashMap<(i64, i32), usize> = HashMap::new();
    for daemon in running.iter().chain(&dead) {
        for run in analyzer_runs(&daemon.log_text()) {
            *runs.entry(run).or_default() += 1;
        }
    }
    for ((id, attempt), n) in &runs {
        assert_eq!(
            *n, 1,
            "task {id} attempt {attempt}: the analyzer ran {n} times for one claim"
        );
        assert!(
            attempt <= &attempts[id],
            "task {id}: a run for attempt {attempt} beyond its claims"
        );
    }
    let mut per_task: HashMap<i64, i32> = HashMap::new();
    for (id, _) in runs.keys() {
        *per_task.entry(*id).or_default() += 1;
    }
    for (id, n) in per_task {
        assert!(
            n <= attempts[&id],
            "task {id}: {n} analyzer runs but {} claims",
            attempts[&id]
        );
    }
}
