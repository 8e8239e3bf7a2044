//! The worker driven directly, one claim at a time: never more claimed than free permits.

use std::sync::Arc;

use pgtaskd::config::Config;
use pgtaskd::metrics::Metrics;
use pgtaskd::worker::Worker;

use crate::support::{count, wait_count, within, GatedAnalyzer, TestDb, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_claims_no_more_tasks_than_free_permits() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'w ' || i FROM generate_series(1, 10) i",
            &[],
        )
        .await
        .unwrap();
    let mut config = Config::from_toml("[worker]\nconcurrency = 4\n", "test").unwrap();
    config.database.url = Some(db.url.clone());
    let analyzer = GatedAnalyzer::closed();
    let worker = Worker::new(
        db.pool(2),
        analyzer.clone(),
        "run-once".to_string(),
        config.worker.clone(),
        Arc::new(Metrics::new()),
    );
    let claimed = within(WAIT, "a claim", worker.run_once()).await.unwrap();
    assert_eq!(claimed, 4, "one task per permit");
    analyzer.entered(4).await;
    // Every permit is held by a task at the gate: nothing more is claimed.
    assert_eq!(within(WAIT, "a claim", worker.run_once()).await.unwrap(), 0);
    let running = "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'";
    assert_eq!(count(&client, running).await, 4);
    analyzer.open();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        4,
        "the first four",
    )
    .await;
    let mut total = 4;
    while total < 10 {
        let claimed = within(WAIT, "a claim", worker.run_once()).await.unwrap();
        assert!(claimed <= 4, "{claimed} claimed with 4 permits");
        total += claimed;
        let done = total as i64;
        wait_count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
            done,
            "a batch",
        )
        .await;
    }
    assert_eq!(
        within(WAIT, "a claim", worker.run_once()).await.unwrap(),
        0,
        "the queue is empty"
    );
}
