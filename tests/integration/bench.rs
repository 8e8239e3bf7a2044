//! `pgtaskd bench` as a user runs it: the workload against a real database, with the daemon
//! as a process of its own; the JSON report's figures, the check totals, and the rows
//! removed afterwards. Soak mode is in `bench_soak`.

use std::time::Duration;

use pgtaskd::bench::workload;

use crate::support::daemon::{binary, pgtaskd};
use crate::support::{count, eventually, TestDb, WAIT};

pub(crate) async fn bench(db: &TestDb, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "--json"];
    all.extend_from_slice(args);
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &all).await;
    assert!(status.success(), "pgtaskd {all:?}: {stdout}{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|err| panic!("{err}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_reports_its_figures_and_the_workloads_totals_and_leaves_no_rows() {
    let db = TestDb::new().await;
    let report = bench(
        &db,
        &["--mode", "drain", "--tasks", "500", "--concurrency", "4"],
    )
    .await;
    assert_eq!(report["mode"], "drain");
    assert_eq!(report["tasks"], 500);
    assert_eq!(report["concurrency"], 4);
    let (words, bytes, runes) = workload::check_totals(500);
    assert_eq!(
        report["check_totals"],
        serde_json::json!([words, bytes, runes]),
        "the table's totals are the workload's"
    );
    assert!(report["seconds"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["tasks_per_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        report["daemon_peak_rss_mib"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(report["daemon_cpu_s"].as_f64().is_some(), "{report}");
    assert!(report["latency_ms"].is_null(), "{report}");
    assert!(report["notify_floor_ms"].is_null(), "{report}");
    assert!(report["drain"].is_null(), "{report}");
    assert!(
        report["wal_bytes_per_task"].as_f64().unwrap() > 100.0,
        "{report}"
    );
    assert!(report["server_cpu_s"].as_f64().unwrap() > 0.0, "{report}");
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_mode_times_each_task_until_the_daemon_starts_its_analyzer_and_the_notify_floor() {
    let db = TestDb::new().await;
    let report = bench(&db, &["--mode", "latency"]).await;
    assert_eq!(report["mode"], "latency");
    assert_eq!(report["tasks"], 210);
    // The daemon's latency, and the floor under it: the same inserts timed to a bare LISTEN
    // session of the bench's own, before the daemon starts.
    for figure in ["latency_ms", "notify_floor_ms"] {
        let at = |q: &str| {
            report[figure][q]
                .as_f64()
                .unwrap_or_else(|| panic!("{figure}.{q}: {report}"))
        };
        assert!(at("p50") > 0.0, "{report}");
        assert!(
            at("p50") <= at("p90") && at("p90") <= at("p99") && at("p99") <= at("max"),
            "{report}"
        );
    }
    assert!(
        report["daemon_idle_cpu_s_per_s"].as_f64().is_some(),
        "{report}"
    );
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ceiling_mode_claims_and_finishes_the_backlog_without_a_daemon_then_drains_it_with_one() {
    let db = TestDb::new().await;
    let report = bench(
        &db,
        &["--mode", "ceiling", "--tasks", "2000", "--concurrency", "4"],
    )
    .await;
    assert_eq!(report["mode"], "ceiling");
    assert_eq!(report["tasks"], 2000);
    assert_eq!(report["concurrency"], 4, "the ceiling's sessions: {report}");
    assert_eq!(report["batch"], 500, "{report}");
    let (words, bytes, runes) = workload::check_totals(2000);
    let totals = serde_json::json!([words, bytes, runes]);
    assert_eq!(
        report["check_totals"], totals,
        "every task was finished SUCCEEDED with its counts"
    );
    assert!(report["tasks_per_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["daemon_cpu_s"].is_null(), "no daemon ran: {report}");
    // The same backlog drained by the daemon in the same run, and the fraction.
    let drain = &report["drain"];
    assert_eq!(drain["mode"], "drain", "{report}");
    assert_eq!(drain["tasks"], 2000, "{report}");
    assert_eq!(
        drain["concurrency"], 4,
        "--concurrency is the daemon's: {report}"
    );
    assert_eq!(drain["check_totals"], totals, "{report}");
    assert!(drain["daemon_cpu_s"].as_f64().is_some(), "{report}");
    let fraction = report["drain_over_ceiling"].as_f64().unwrap();
    let expected = drain["tasks_per_s"].as_f64().unwrap() / report["tasks_per_s"].as_f64().unwrap();
    assert!((fraction - expected).abs() < 1e-9, "{report}");
    // Two claims and two finishes of a row each write its tuple at least once.
    for run in [&report, drain] {
        let wal = run["wal_bytes_per_task"].as_f64().unwrap();
        assert!(wal > 100.0, "WAL bytes per task: {report}");
        assert!(
            run["wal_background_bytes_per_s"].as_f64().unwrap() >= 0.0,
            "{report}"
        );
        // The test's server runs on this machine.
        assert!(run["server_cpu_s"].as_f64().unwrap() > 0.0, "{report}");
    }
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_mode_reports_commits_with_and_without_the_trigger_the_idle_latency_and_enables_it_again(
) {
    let db = TestDb::new().await;
    let report = bench(
        &db,
        &[
            "--mode",
            "producers",
            "--producers",
            "2",
            "--duration",
            "2s",
        ],
    )
    .await;
    assert_eq!(report["mode"], "producers");
    let figures = &report["producers"];
    assert_eq!(figures["producers"], 2, "{report}");
    let mut total = 0;
    for half in ["with_trigger", "without_trigger"] {
        let commits = figures[half]["commits"].as_u64().unwrap();
        assert!(commits > 0, "{half}: {report}");
        assert!(
            figures[half]["commits_per_s"].as_f64().unwrap() > 0.0,
            "{report}"
        );
        total += commits;
    }
    assert!(
        figures["with_over_without"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    // The notifications are counted: none with the trigger disabled, and never more than
    // the commits.
    assert_eq!(figures["without_trigger"]["notified"], 0, "{report}");
    assert!(
        figures["with_trigger"]["notified"].as_u64().unwrap()
            <= figures["with_trigger"]["commits"].as_u64().unwrap(),
        "{report}"
    );
    // The idle latency, before and after the producers, on the same daemon, and the floor.
    for latency in [
        &figures["idle_latency_before_ms"],
        &figures["idle_latency_after_ms"],
        &report["notify_floor_ms"],
    ] {
        let p50 = latency["p50"].as_f64().unwrap();
        assert!(
            p50 > 0.0 && p50 <= latency["p99"].as_f64().unwrap(),
            "{report}"
        );
    }
    // Every commit was a task the daemon finished with the workload's counts, and so was
    // every task of the two latency measurements.
    let total = total + 2 * u64::from(pgtaskd::bench::LATENCY_MODE_TASKS);
    assert_eq!(report["tasks"].as_u64().unwrap(), total, "{report}");
    let (words, bytes, runes) = workload::check_totals(total as u32);
    assert_eq!(
        report["check_totals"],
        serde_json::json!([words, bytes, runes]),
        "{report}"
    );
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pg_trigger
              WHERE tgname = 'tasks_notify' AND tgrelid = 'pgtaskd.tasks'::regclass
                AND tgenabled = 'O'"
        )
        .await,
        1,
        "the trigger is enabled again"
    );
}

/// The processes whose parent is `pid`, from every thread's `children` list.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Gone, or a zombie nobody has reaped yet: it runs no more.
fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// A bench killed with SIGKILL runs no clean-up: the kernel tells its daemon to stop, which
/// then drains and exits, instead of serving the database on its own with a temporary
/// configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_bench_leaves_no_daemon_running() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut bench = tokio::process::Command::new(binary())
        .args([
            "bench",
            "--mode",
            "soak",
            "--rate",
            "50",
            "--duration",
            "5m",
        ])
        .env_remove("PGTASKD_CONFIG")
        .env("PGTASKD_DATABASE_URL", &db.url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("pgtaskd bench starts");
    let bench_pid = bench.id().expect("the bench runs");
    let daemon = eventually(WAIT, "the bench's daemon to start", || async move {
        children_of(bench_pid).first().copied()
    })
    .await;
    eventually(WAIT, "the daemon to finish a task", || {
        let client = &client;
        async move {
            (count(
                client,
                "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
            )
            .await
                > 0)
            .then_some(())
        }
    })
    .await;
    assert!(!has_exited(daemon), "the daemon runs while the bench does");
    bench.start_kill().unwrap();
    crate::support::within(WAIT, "the bench to die", bench.wait())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the daemon to stop after its bench was killed",
        || async move { has_exited(daemon).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_with_a_handler_drains_the_backlog_again_through_it_and_reports_both() {
    let db = TestDb::new().await;
    for handler in ["exec", "http"] {
        let report = bench(
            &db,
            &[
                "--mode",
                "drain",
                "--tasks",
                "300",
                "--concurrency",
                "4",
                "--handler",
                handler,
            ],
        )
        .await;
        let run = &report["handler"];
        assert_eq!(run["handler"], handler, "{report}");
        assert_eq!(run["tasks"], 300, "{report}");
        assert!(run["tasks_per_s"].as_f64().unwrap() > 0.0, "{report}");
        assert!(
            run["daemon_peak_rss_mib"].as_f64().unwrap() > 0.0,
            "{report}"
        );
        let ratio = run["analyzer_over_handler"].as_f64().unwrap();
        let expected =
            report["tasks_per_s"].as_f64().unwrap() / run["tasks_per_s"].as_f64().unwrap();
        assert!((ratio - expected).abs() < 1e-9, "{report}");
        assert_eq!(
            run["spawn_floor_tasks_per_s"].is_number(),
            handler == "exec",
            "{report}"
        );
    }
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
}
