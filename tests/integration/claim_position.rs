//! A daemon's claims after a position while a held snapshot makes claims from the start slow
//! (docs/design.md, "Claims after a position"): a queue kept just drained keeps its position,
//! and what comes before it in claim order still runs.

use pgtaskd::queue::TaskStatus;

use crate::support::{
    eventually, hold_snapshot, wait_count, wait_status, DaemonProcess, TestDb, WAIT,
};

/// Tasks claimed under the held snapshot: their entries stay at the front of the claim index,
/// and a claim from the start walks them all (15-20 ms here, the threshold being 5).
const CLAIMED: i64 = 80_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_queue_under_a_held_snapshot_claims_after_its_position_and_still_runs_what_comes_before_it(
) {
    let db = TestDb::new().await;
    let client = db.client().await;
    // The lowest id, canceled before the hold: retried later, it is before every position.
    let early: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, run_at) VALUES ('early', now() + interval '1 day') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    client
        .execute("SELECT pgtaskd.cancel($1)", &[&early])
        .await
        .unwrap();
    let holder = hold_snapshot(&db).await;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'claimed ' || i FROM generate_series(1, $1::int8) i",
            &[&CLAIMED],
        )
        .await
        .unwrap();
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 8\npoll_interval = \"1s\"\n",
        &[],
    );
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        CLAIMED,
        "the tasks claimed under the snapshot to succeed",
    )
    .await;

    // One task at a time, each waking the daemon into a drained queue: once a claim from the
    // start has been slow, the next ones start after the position and it stays.
    let trickle = |n: i64| {
        let client = &client;
        async move {
            client
                .execute(
                    "INSERT INTO pgtaskd.tasks (payload) VALUES ('trickle ' || $1::int8)",
                    &[&n],
                )
                .await
                .unwrap();
        }
    };
    let mut sent = 0;
    eventually(WAIT, "a claim after a position", || {
        sent += 1;
        let log = daemon.log_text();
        let trickled = trickle(sent);
        async move {
            trickled.await;
            log.contains("claim after a position").then_some(())
        }
    })
    .await;
    let positioned_before = daemon.log_text().matches("claim after a position").count();

    // Before the position in claim order: a higher priority, and a retried old id.
    let urgent: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, priority) VALUES ('urgent', 10) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let retried: Option<String> = client
        .query_one("SELECT pgtaskd.retry($1)", &[&early])
        .await
        .unwrap()
        .get(0);
    assert_eq!(retried.as_deref(), Some("CANCELED"));
    for n in sent + 1..sent + 20 {
        trickle(n).await;
    }
    wait_status(&client, urgent, TaskStatus::Succeeded).await;
    wait_status(&client, early, TaskStatus::Succeeded).await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status <> 'SUCCEEDED'",
        0,
        "every trickled task to succeed",
    )
    .await;
    let log = daemon.log_text();
    assert!(
        log.matches("claim after a position").count() > positioned_before,
        "the claims after the first positioned one went on after a position"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    daemon.stop_cleanly().await;
}
