//! A daemon's claims after a position while a held snapshot makes claims from the start slow
//! (docs/design.md, "Claims after a position"): a queue kept just drained keeps its position,
//! and what comes before it in claim order still runs.

use std::time::SystemTime;

use pgtaskd::queue::TaskStatus;

use crate::support::{
    eventually, hold_snapshot, insert_payloads, wait_count, wait_status, DaemonProcess, TestDb,
    WAIT,
};

/// Tasks claimed under the held snapshot: their entries stay at the front of the claim index,
/// and a claim from the start walks them all (15-20 ms here, the threshold being 5).
const CLAIMED: i64 = 80_000;

/// What the daemon logs (debug) for each claim that starts after a position.
const LOGGED: &str = "claim after a position";

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
    insert_payloads(&client, CLAIMED as usize).await;
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
    let positioned = |daemon: &DaemonProcess| daemon.log_text().matches(LOGGED).count();
    // The drain's own claims may have gone after a position (a few may still be logged): ten
    // more are claims of the trickle, each of one task, in a drained queue.
    let after_drain = positioned(&daemon);
    let mut sent = 0;
    eventually(WAIT, "claims after a position in a drained queue", || {
        sent += 1;
        let seen = positioned(&daemon);
        let trickled = trickle(sent);
        async move {
            trickled.await;
            (seen >= after_drain + 10).then_some(())
        }
    })
    .await;

    // Before the position in claim order: a higher priority, and a retried old id. Each runs
    // within the bound: the next claim from the start, at the latest one and a half poll
    // intervals (1.5 s here) and that claim.
    let urgent = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, priority) VALUES ('urgent', 10) RETURNING id, clock_timestamp()",
            &[],
        )
        .await
        .unwrap();
    let retried = client
        .query_one("SELECT pgtaskd.retry($1), clock_timestamp()", &[&early])
        .await
        .unwrap();
    assert_eq!(
        retried.get::<_, Option<String>>(0).as_deref(),
        Some("CANCELED")
    );
    for n in sent + 1..sent + 20 {
        trickle(n).await;
    }
    for (id, since) in [
        (urgent.get::<_, i64>(0), urgent.get::<_, SystemTime>(1)),
        (early, retried.get::<_, SystemTime>(1)),
    ] {
        wait_status(&client, id, TaskStatus::Succeeded).await;
        let waited: f64 = client
            .query_one(
                "SELECT extract(epoch FROM started_at - $2)::float8 FROM pgtaskd.task_view WHERE id = $1",
                &[&id, &since],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            waited < 5.0,
            "task {id} before the position started {waited:.3} s after it was due (the bound: about 1.5 s)"
        );
    }
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status <> 'SUCCEEDED'",
        0,
        "every trickled task to succeed",
    )
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    daemon.stop_cleanly().await;
}
