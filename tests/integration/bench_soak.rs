//! `pgtaskd bench --mode soak`: a report of each period with every inserted task read back
//! SUCCEEDED once, a snapshot held in the middle and reported, and a hold as long as the run
//! refused.

use pgtaskd::bench::workload;

use crate::bench::bench;
use crate::support::daemon::pgtaskd;
use crate::support::{count, TestDb};

/// A soak's report: its periods, and every inserted task read back SUCCEEDED once.
fn check_soak(report: &serde_json::Value, periods: usize) -> &serde_json::Value {
    assert_eq!(report["mode"], "soak");
    let soak = &report["soak"];
    assert_eq!(soak["rate_source"], "given", "{report}");
    let inserted = soak["inserted"].as_u64().unwrap();
    assert!(inserted > 0, "{report}");
    assert_eq!(soak["finished"].as_u64(), Some(inserted), "{report}");
    assert_eq!(soak["succeeded"].as_u64(), Some(inserted), "{report}");
    assert_eq!(report["tasks"].as_u64(), Some(inserted), "{report}");
    let (words, bytes, runes) = workload::check_totals(inserted as u32);
    assert_eq!(
        report["check_totals"],
        serde_json::json!([words, bytes, runes]),
        "{report}"
    );
    let figures = soak["periods"].as_array().unwrap();
    assert_eq!(figures.len(), periods, "{report}");
    for period in figures {
        assert!(period["tasks_per_s"].as_f64().unwrap() > 0.0, "{period}");
        assert!(period["inserted_per_s"].as_f64().unwrap() > 0.0, "{period}");
        let (p50, p99) = (
            period["p50_ms"].as_f64().unwrap(),
            period["p99_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99, "{period}");
        assert!(period["table_mib"].as_f64().unwrap() > 0.0, "{period}");
        assert!(period["index_mib"].as_f64().unwrap() > 0.0, "{period}");
        assert!(period["dead_tuples"].as_i64().is_some(), "{period}");
        assert!(period["autovacuums"].as_i64().is_some(), "{period}");
        assert!(period["backlog"].as_f64().is_some(), "{period}");
    }
    let summary = &soak["summary"];
    assert!(
        summary["tasks_per_s_last_over_first"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        summary["p99_last_over_first"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        summary["growth_mib_per_min"].is_null(),
        "no period ends two retention windows in: {report}"
    );
    soak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mode_reports_each_period_and_reads_every_task_back_succeeded() {
    let db = TestDb::new().await;
    let report = bench(
        &db,
        &[
            "--mode",
            "soak",
            "--duration",
            "6s",
            "--rate",
            "300",
            "--report-every",
            "2s",
            "--concurrency",
            "2",
        ],
    )
    .await;
    let soak = check_soak(&report, 3);
    assert_eq!(soak["rate"], 300.0, "{report}");
    assert_eq!(soak["retention_s"], 60.0, "{report}");
    assert!(soak["hold"].is_null(), "{report}");
    let inserted = soak["inserted"].as_f64().unwrap();
    assert!(
        (inserted - 1800.0).abs() <= 3.0,
        "300 tasks/s for 6 s: {report}"
    );
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mode_holds_a_snapshot_in_the_middle_and_reports_what_it_did() {
    let db = TestDb::new().await;
    let report = bench(
        &db,
        &[
            "--mode",
            "soak",
            "--duration",
            "8s",
            "--rate",
            "200",
            "--report-every",
            "2s",
            "--hold-snapshot",
            "2s",
            "--concurrency",
            "2",
        ],
    )
    .await;
    let soak = check_soak(&report, 4);
    let hold = &soak["hold"];
    let (start, end) = (
        hold["start_s"].as_f64().unwrap(),
        hold["end_s"].as_f64().unwrap(),
    );
    // Opened at (8 s - 2 s) / 2, held 2 s.
    assert!((3.0..3.5).contains(&start), "{report}");
    assert!((end - start - 2.0).abs() < 0.5, "{report}");
    let held: Vec<f64> = soak["periods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["held"] == true)
        .map(|p| p["end_s"].as_f64().unwrap())
        .collect();
    assert_eq!(held, [4.0, 6.0], "{report}");
    for figure in ["p99_before_ms", "p99_worst_ms"] {
        assert!(hold[figure].as_f64().unwrap() > 0.0, "{figure}: {report}");
    }
    assert!(
        hold["dead_tuples_worst"].as_i64().unwrap() >= hold["dead_tuples_before"].as_i64().unwrap(),
        "{report}"
    );
    assert!(hold["total_mib_worst"].as_f64().unwrap() > 0.0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mode_refuses_a_hold_as_long_as_the_run() {
    let db = TestDb::new().await;
    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &[
            "bench",
            "--mode",
            "soak",
            "--duration",
            "2s",
            "--hold-snapshot",
            "2s",
        ],
    )
    .await;
    assert_eq!(status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("--hold-snapshot"), "{stderr}");
}
