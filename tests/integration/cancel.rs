//! Cancel is a request (docs/design.md): a canceled QUEUED task is never analyzed; a canceled RUNNING task stays
//! RUNNING until its analyzer has returned, then commits CANCELED with zero counts.

use std::time::Duration;

use pgtaskd::queue::{self, CancelOutcome, TaskStatus};

use crate::support::{enqueue, wait_status, within, GatedAnalyzer, InProcessDaemon, TestDb, WAIT};

#[tokio::test]
async fn a_canceled_queued_task_is_never_analyzed() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let canceled = enqueue(&client, "never analyze me").await;
    assert_eq!(
        queue::cancel(&client, canceled).await.unwrap(),
        CancelOutcome::Canceled
    );
    let analyzer = GatedAnalyzer::counting();
    let daemon = InProcessDaemon::start(&db, db.config(""), analyzer.clone()).await;
    // A task enqueued after the canceled one, done by the same daemon: by then the canceled
    // one had every chance to be claimed.
    let later = enqueue(&client, "analyze me").await;
    wait_status(&client, later, TaskStatus::Succeeded).await;
    daemon.stop().await;
    assert_eq!(analyzer.calls_for("never analyze me"), 0);
    assert_eq!(analyzer.calls_for("analyze me"), 1);
    let task = queue::get(&client, canceled).await.unwrap().unwrap();
    assert_eq!(
        (task.status, task.attempt, task.words),
        (TaskStatus::Canceled, 0, 0)
    );
    assert!(task.finished_at.is_some());
}

#[tokio::test]
async fn a_cancel_that_lands_before_the_claim_makes_the_claim_match_nothing() {
    let db = TestDb::new().await;
    let mut canceler = db.client().await;
    let claimer = db.client().await;
    let id = enqueue(&claimer, "raced").await;
    let queues = vec!["default".to_string()];
    let tx = canceler.transaction().await.unwrap();
    let row = tx
        .query_one("SELECT pgtaskd.cancel($1)", &[&id])
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "CANCELED");
    // The cancel holds the row: the claim steps around it rather than wait.
    let claimed = within(
        WAIT,
        "a claim",
        queue::claim(&claimer, "me", &queues, 10, Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert!(claimed.is_empty(), "{claimed:?}");
    tx.commit().await.unwrap();
    let claimed = queue::claim(&claimer, "me", &queues, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        claimed.is_empty(),
        "a CANCELED task is never claimed: {claimed:?}"
    );
    let task = queue::get(&claimer, id).await.unwrap().unwrap();
    assert_eq!((task.status, task.attempt), (TaskStatus::Canceled, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_running_task_stays_running_until_an_analyzer_that_ignores_the_signal_returns() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed_ignoring_cancel();
    let daemon = InProcessDaemon::start(&db, db.config(""), analyzer.clone()).await;
    let id = enqueue(&client, "held words").await;
    analyzer.entered(1).await;
    assert_eq!(
        queue::cancel(&client, id).await.unwrap(),
        CancelOutcome::Requested
    );
    // The worker got the request (the analyzer saw its token fire) and still the row is
    // RUNNING, because the analyzer has not returned.
    analyzer.saw_cancel(1).await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running);
    assert!(task.cancel_requested);
    assert_eq!(analyzer.returned_now(), 0);
    analyzer.open();
    let task = wait_status(&client, id, TaskStatus::Canceled).await;
    assert_eq!(
        (task.words, task.bytes, task.runes),
        (0, 0, 0),
        "the analyzer's counts are not stored"
    );
    assert_eq!(task.error, None);
    assert_eq!(analyzer.calls_for("held words"), 1);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_running_task_whose_analyzer_stops_commits_canceled_after_it_returned() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    let daemon = InProcessDaemon::start(&db, db.config(""), analyzer.clone()).await;
    let id = enqueue(&client, "stop early").await;
    analyzer.entered(1).await;
    let (status, _, _) =
        crate::support::daemon::pgtaskd(Some(&db.url), &["cancel", &id.to_string()]).await;
    assert!(status.success());
    let task = wait_status(&client, id, TaskStatus::Canceled).await;
    assert_eq!(
        analyzer.returned_now(),
        1,
        "CANCELED only after the analyzer returned"
    );
    assert_eq!((task.words, task.bytes, task.runes), (0, 0, 0));
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cancel_notification_is_caught_by_the_heartbeat() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    // A short lease makes the heartbeat (a third of it) come quickly.
    let config = db.config("[worker]\nlease = \"600ms\"\n");
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;
    let id = enqueue(&client, "no notification").await;
    analyzer.entered(1).await;
    // What pgtaskd.cancel does, minus its NOTIFY.
    client
        .execute(
            "UPDATE pgtaskd.task_state SET cancel_requested = true WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let task = wait_status(&client, id, TaskStatus::Canceled).await;
    assert_eq!(task.words, 0);
    daemon.stop().await;
}

#[tokio::test]
async fn canceling_a_finished_task_changes_nothing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::counting();
    let daemon = InProcessDaemon::start(&db, db.config(""), analyzer.clone()).await;
    let id = enqueue(&client, "done already").await;
    let before = wait_status(&client, id, TaskStatus::Succeeded).await;
    daemon.stop().await;
    assert_eq!(
        queue::cancel(&client, id).await.unwrap(),
        CancelOutcome::AlreadyFinished(TaskStatus::Succeeded)
    );
    let sql: Option<String> = client
        .query_one("SELECT pgtaskd.cancel($1)", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(sql.as_deref(), Some("SUCCEEDED"));
    let after = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(after, before, "the row is untouched");
    assert_eq!(
        queue::cancel(&client, 999_999).await.unwrap(),
        CancelOutcome::NotFound
    );
}
