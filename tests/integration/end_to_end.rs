//! End to end through the real binary: `migrate`, `run`, plain `INSERT`s from a client.

use std::time::Duration;

use crate::support::daemon::pgtaskd;
use crate::support::{eventually, expected_counts, insert_payloads, DaemonProcess, TestDb, WAIT};

/// Shorter than the poll interval below: a task done within it was woken by NOTIFY.
const NOTIFY_PATH_LIMIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserted_rows_are_analyzed_and_committed_by_the_daemon_process() {
    let db = TestDb::empty().await;
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["migrate"]).await;
    assert!(status.success(), "migrate failed: {stderr}");
    assert!(stdout.contains("applied migration 1"), "{stdout}");

    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 8\npoll_interval = \"60s\"\n",
        &[],
    );
    daemon.wait_for_log("listening for notifications").await;
    let client = db.client().await;

    // One plain INSERT while the daemon is idle: only NOTIFY can wake it in time.
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('naïve 日本語 text')",
            &[],
        )
        .await
        .unwrap();
    let (words, bytes, runes) = eventually(NOTIFY_PATH_LIMIT, "the first task, woken by NOTIFY", || {
        let client = &client;
        async move {
            let row = client
                .query_opt(
                    "SELECT words, bytes, runes FROM pgtaskd.task_view WHERE payload = 'naïve 日本語 text' AND status = 'SUCCEEDED'",
                    &[],
                )
                .await
                .unwrap()?;
            Some((row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)))
        }
    })
    .await;
    assert_eq!((words, bytes, runes), (3, 21, 14));

    // A producer's transaction that rolls back leaves nothing behind.
    client
        .batch_execute(
            "BEGIN; INSERT INTO pgtaskd.tasks (payload) VALUES ('rolled back'); ROLLBACK;",
        )
        .await
        .unwrap();

    // One INSERT ... SELECT of 10,000 rows: one statement, one notification.
    let payloads = insert_payloads(&client, 10_000).await;
    eventually(WAIT, "10,000 tasks to succeed", || {
        let client = &client;
        async move {
            let row = client
                .query_one(
                    "SELECT count(*) FROM pgtaskd.task_view WHERE status <> 'SUCCEEDED'",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0) == 0).then_some(())
        }
    })
    .await;

    let rows = client
        .query(
            "SELECT payload, words, bytes, runes, attempt, error FROM pgtaskd.task_view WHERE id > 1 ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 10_000, "the rolled-back row never existed");
    for (row, want) in rows.iter().zip(&payloads) {
        let text: &str = row.get(0);
        assert_eq!(text, want);
        let got = (
            row.get::<_, i64>(1),
            row.get::<_, i64>(2),
            row.get::<_, i64>(3),
        );
        assert_eq!(got, expected_counts(text), "payload {text:?}");
        assert_eq!(row.get::<_, i32>(4), 1);
        assert_eq!(row.get::<_, Option<&str>>(5), None);
    }

    daemon.signal(libc::SIGTERM);
    let status = daemon.wait().await;
    assert_eq!(
        status.code(),
        Some(0),
        "clean exit after SIGTERM:\n{}",
        daemon.log_text()
    );
    let log = daemon.log_text();
    assert!(log.contains("task claimed"), "claims are logged");
    assert!(log.contains("task finished"), "finishes are logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_migrate_installs_the_schema_first() {
    let db = TestDb::empty().await;
    let mut daemon = DaemonProcess::start(&db, "", &["--migrate"]);
    daemon.wait_for_log("listening for notifications").await;
    let client = db.client().await;
    let id: i64 = client
        .query_one("SELECT pgtaskd.enqueue('hello world')", &[])
        .await
        .unwrap()
        .get(0);
    let (status, stdout, _) = eventually(WAIT, "the task to succeed", || {
        let url = db.url.clone();
        async move {
            let out = pgtaskd(Some(&url), &["status", &id.to_string()]).await;
            out.1.contains("SUCCEEDED").then_some(out)
        }
    })
    .await;
    assert!(status.success());
    assert!(stdout.contains("words=2 bytes=11 runes=11"), "{stdout}");
    daemon.signal(libc::SIGINT);
    assert_eq!(daemon.wait().await.code(), Some(0));
}

/// At info level a drain writes no line per task: the lifecycle, and a summary with the
/// counts (each task's lines are at debug level).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_info_level_a_drain_logs_a_summary_and_no_line_per_task() {
    const TASKS: usize = 2_000;
    let db = TestDb::new().await;
    let client = db.client().await;
    crate::support::insert_payloads(&client, TASKS).await;
    let mut daemon = DaemonProcess::start_with_env(
        &db.url,
        "[worker]\nconcurrency = 4\n",
        &[],
        &[("RUST_LOG", "pgtaskd=info")],
    );
    crate::support::wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        TASKS as i64,
        "the drain",
    )
    .await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(!log.contains("task claimed"), "{log}");
    assert!(!log.contains("task finished"), "{log}");
    let summaries: Vec<&str> = log
        .lines()
        .filter(|line| {
            line.contains("tasks since the last summary")
                || line.contains("tasks in the last minute")
        })
        .collect();
    let succeeded: u64 = summaries
        .iter()
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("succeeded=")?.parse::<u64>().ok())
        })
        .sum();
    assert_eq!(succeeded, TASKS as u64, "{log}");
    assert!(
        log.lines().count() < 40,
        "{} lines for {TASKS} tasks:\n{log}",
        log.lines().count()
    );
}
