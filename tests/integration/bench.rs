//! `pgtaskd bench` as a user runs it: the workload against a real database, with the daemon
//! as a process of its own; the JSON report's figures, the check totals, and the rows
//! removed afterwards.

use pgtaskd::bench::workload;

use crate::support::daemon::pgtaskd;
use crate::support::{count, TestDb};

async fn bench(db: &TestDb, args: &[&str]) -> serde_json::Value {
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
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
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
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
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
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_mode_reports_commits_with_and_without_the_trigger_and_enables_it_again() {
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
    // Every commit was a task the daemon finished with the workload's counts.
    assert_eq!(report["tasks"].as_u64().unwrap(), total, "{report}");
    let (words, bytes, runes) = workload::check_totals(total as u32);
    assert_eq!(
        report["check_totals"],
        serde_json::json!([words, bytes, runes]),
        "{report}"
    );
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
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
