//! Bounded memory (docs/design.md, "Bounded memory"): a daemon holds at most
//! `worker.max_inflight_bytes` of payload (one larger payload aside), so tasks behind large
//! ones stay free for a daemon that can start them; and a payload over
//! `worker.max_payload_bytes` ends FAILED without being loaded.

use pgtaskd::queue::{self, TaskStatus};

use crate::support::daemon::wait_listening;
use crate::support::{
    count, enqueue, wait_count, wait_status, DaemonProcess, GatedAnalyzer, InProcessDaemon, TestDb,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_at_its_byte_budget_leaves_the_tasks_behind_to_another_daemon() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // Three payloads of 2 MiB, each larger than the whole budget of 1 MiB, then small ones.
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload)
               SELECT 'BIG ' || repeat('w ', 1048576) FROM generate_series(1, 3);
             INSERT INTO pgtaskd.tasks (payload)
               SELECT 'small ' || i FROM generate_series(1, 20) i;",
        )
        .await
        .unwrap();
    let held = GatedAnalyzer::holding_only("BIG");
    let budgeted = db.config(
        "[worker]\nconcurrency = 4\nmax_inflight_bytes = \"1MiB\"\npoll_interval = \"200ms\"\n",
    );
    let first = InProcessDaemon::start(&db, budgeted, held.clone()).await;
    // It takes one large payload, alone, although four workers are free.
    held.entered(1).await;

    let counting = GatedAnalyzer::counting();
    let second = InProcessDaemon::start(&db, db.config(""), counting.clone()).await;
    wait_listening(&db, 2).await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        22,
        "the other daemon to do every task the first one could not start",
    )
    .await;
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'"
        )
        .await,
        1,
        "the first daemon holds one task only"
    );
    assert_eq!(held.calls(), 1);

    held.open();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED' AND words = 1048577",
        3,
        "the large tasks, analyzed in full",
    )
    .await;
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_over_max_payload_bytes_fails_without_reaching_the_analyzer() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let large = enqueue(&client, &"x".repeat(5000)).await;
    let small = enqueue(&client, "small enough").await;
    let analyzer = GatedAnalyzer::counting();
    let daemon = InProcessDaemon::start(
        &db,
        db.config("[worker]\nmax_payload_bytes = \"1KiB\"\n"),
        analyzer.clone(),
    )
    .await;
    let failed = wait_status(&client, large, TaskStatus::Failed).await;
    let error = failed.error.unwrap();
    assert!(
        error.contains("5000 bytes") && error.contains("worker.max_payload_bytes (1024)"),
        "{error}"
    );
    assert_eq!((failed.words, failed.bytes, failed.runes), (0, 0, 0));
    wait_status(&client, small, TaskStatus::Succeeded).await;
    assert_eq!(analyzer.calls(), 1, "only the small payload was analyzed");
    let task = queue::get(&client, large).await.unwrap().unwrap();
    assert_eq!(task.attempt, 1, "failed once, not retried");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_with_less_room_than_the_next_payload_waits_for_it_and_drains_everything() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // A budget of 3 MiB: after one payload of 2 MiB, 1 MiB is left, less than the next one
    // needs. The real binary runs its worker on one thread: a claim loop that spun there would
    // starve the analysis it waits for.
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload)
               SELECT 'BIG ' || repeat('w ', 1048576) FROM generate_series(1, 4);
             INSERT INTO pgtaskd.tasks (payload)
               SELECT 'small ' || i FROM generate_series(1, 10) i;",
        )
        .await
        .unwrap();
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 4\nmax_inflight_bytes = \"3MiB\"\npoll_interval = \"1h\"\n",
        &[],
    );
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        14,
        "every task, each large one claimed as soon as the bytes it needs were free",
    )
    .await;
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE words = 1048577 AND attempt = 1"
        )
        .await,
        4
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

/// A session that carried a large payload is closed when given back, not pooled again: its
/// connection would keep buffers as large as that payload for as long as it lived (a daemon's
/// resident memory rose by one payload per pooled session: 108 to 396 MiB after eight tasks
/// of 100 MB, 12 MiB with this rule). A session that carried a small one is reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_carried_a_large_payload_is_closed_not_pooled_again() {
    use crate::support::{within, WAIT};
    use pgtaskd::db::RETIRE_AFTER_BYTES;
    let db = TestDb::new().await;
    let pool = db.pool(1);
    let session = within(WAIT, "a session", pool.get()).await.unwrap();
    let first = backend(&session).await;
    session.carried(RETIRE_AFTER_BYTES);
    drop(session);
    let session = within(WAIT, "a session", pool.get()).await.unwrap();
    assert_eq!(
        backend(&session).await,
        first,
        "a small payload: the same session"
    );
    session.carried(RETIRE_AFTER_BYTES + 1);
    drop(session);
    let session = within(WAIT, "a session", pool.get()).await.unwrap();
    assert_ne!(
        backend(&session).await,
        first,
        "a large payload: a new session"
    );
}

/// The server's process id of `session`.
async fn backend(session: &pgtaskd::db::Session) -> i32 {
    crate::support::within(
        crate::support::WAIT,
        "a backend pid",
        session.query_one("SELECT pg_backend_pid()", &[]),
    )
    .await
    .expect("a backend pid")
    .get(0)
}
