//! Notifications are hints (docs/design.md, "Cancel is a request"): any role that can connect
//! may send one, on any channel the daemon listens to, with any payload. None changes a row by
//! itself, crashes the daemon or fills its log.

use pgtaskd::queue::{self, CancelOutcome, TaskStatus};
use tokio_postgres::Client;

use crate::support::{
    connect, count, enqueue, wait_status, Cluster, DaemonProcess, GatedAnalyzer, InProcessDaemon,
    TestDb,
};

/// A client of role `name`, which may log in and has no rights on the pgtaskd schema.
async fn intruder(db: &TestDb, owner: &Client, name: &str) -> Client {
    owner
        .batch_execute(&format!("CREATE ROLE {name} LOGIN"))
        .await
        .unwrap();
    let url = db.url.replace("user=postgres", &format!("user={name}"));
    assert_ne!(url, db.url, "the test URL names the user");
    let client = connect(&url).await;
    let denied = client
        .query("SELECT count(*) FROM pgtaskd.task_view", &[])
        .await
        .expect_err("the intruder cannot read the table");
    assert_eq!(
        denied.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{denied:?}"
    );
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_cancel_notifications_stop_no_analyzer() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    let intruder = intruder(&db, &owner, "intruder").await;
    let analyzer = GatedAnalyzer::closed();
    let daemon = InProcessDaemon::start(&db, db.config(""), analyzer.clone()).await;
    let forged = enqueue(&owner, "forged at").await;
    let real = enqueue(&owner, "really canceled").await;
    analyzer.entered(2).await;

    // The intruder names the running task, many times and in several spellings.
    intruder
        .batch_execute(&format!(
            "SELECT pg_notify('pgtaskd_cancel', '{forged}');
             SELECT pg_notify('pgtaskd_cancel', ' {forged} ');
             SELECT pg_notify('pgtaskd_cancel', '{forged}' || repeat(' ', i)) FROM generate_series(1, 500) i;"
        ))
        .await
        .unwrap();
    // Then a real cancel of the other task: once its analyzer saw it, the forged hints that
    // came before it on the same connection were handled too.
    assert_eq!(
        queue::cancel(&owner, real).await.unwrap(),
        CancelOutcome::Requested
    );
    analyzer.saw_cancel(1).await;
    wait_status(&owner, real, TaskStatus::Canceled).await;
    assert_eq!(
        analyzer.saw_cancel_now(),
        1,
        "only the requested cancel stopped an analyzer"
    );

    analyzer.open();
    let task = wait_status(&owner, forged, TaskStatus::Succeeded).await;
    assert!(!task.cancel_requested);
    assert_eq!(task.words, 2);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_notifications_with_any_payload_changes_no_row_and_leaves_the_log_quiet() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    let intruder = intruder(&db, &owner, "flooder").await;
    let elsewhere: i64 = owner
        .query_one("SELECT pgtaskd.enqueue('not served here', 'other')", &[])
        .await
        .unwrap()
        .get(0);
    let mut daemon = DaemonProcess::start(&db, "", &[]);
    daemon.wait_for_log("listening for notifications").await;
    let lines_before = daemon.log_text().lines().count();

    // 100,000 distinct payloads on each channel (identical ones would be folded into one by
    // the server): garbage, numbers that are no task, the id of a task of another queue,
    // negative and overflowing numbers; and payloads at the server's size limit.
    intruder
        .batch_execute(&format!(
            "SELECT pg_notify('pgtaskd_cancel', 'garbage ' || i) FROM generate_series(1, 40000) i;
             SELECT pg_notify('pgtaskd_cancel', i::text) FROM generate_series(1, 40000) i;
             SELECT pg_notify('pgtaskd_cancel', '-' || i) FROM generate_series(1, 10000) i;
             SELECT pg_notify('pgtaskd_cancel', '99999999999999999999' || i) FROM generate_series(1, 9000) i;
             SELECT pg_notify('pgtaskd_cancel', '{elsewhere}' || repeat(' ', i)) FROM generate_series(1, 1000) i;
             SELECT pg_notify('pgtaskd_cancel', repeat('x', 7990) || i) FROM generate_series(1, 500) i;
             SELECT pg_notify('pgtaskd_tasks', 'wake ' || i) FROM generate_series(1, 100000) i;
             SELECT pg_notify('pgtaskd_tasks', repeat('y', 7990) || i) FROM generate_series(1, 500) i;"
        ))
        .await
        .unwrap();

    // Still serving: a task enqueued after the flood is done.
    let after = enqueue(&owner, "after the flood").await;
    wait_status(&owner, after, TaskStatus::Succeeded).await;
    let task = queue::get(&owner, elsewhere).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued);
    assert!(!task.cancel_requested);
    assert_eq!(
        count(
            &owner,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status <> 'QUEUED'"
        )
        .await,
        1
    );
    let new_lines = daemon.log_text().lines().count() - lines_before;
    assert!(
        new_lines < 20,
        "{new_lines} log lines for a flood of notifications:\n{}",
        daemon.log_text()
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}
