//! No one else's lock delays a batch (docs/design.md): a producer that requested a running
//! task's cancel inside a transaction it keeps open holds that row; the daemon's heartbeat
//! and its batched finishes go on for every other task, and only the locked task waits. And
//! one claim, one token: every claim has a fencing token of its own, even when a claim given
//! back and the next one share an attempt.

use std::time::Duration;

use pgtaskd::queue::{self, Beat, FinishError, Outcome, TaskStatus};

use crate::support::{
    count, enqueue, eventually, wait_status, within, GatedAnalyzer, InProcessDaemon, TestDb, WAIT,
};

const LEASE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_open_cancel_delays_neither_the_heartbeat_nor_the_finish_of_other_tasks() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    let config = db.config(
        "[worker]\nconcurrency = 4\nlease = \"2s\"\npoll_interval = \"200ms\"\n\
         [database]\nstatement_timeout = \"60s\"\n",
    );
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(enqueue(&client, &format!("held task {i}")).await);
    }
    analyzer.entered(4).await;

    // The producer's transaction: a cancel of the first task, left open.
    let mut producer = db.client().await;
    let tx = within(WAIT, "BEGIN", producer.transaction()).await.unwrap();
    let locked_at: String = within(
        WAIT,
        "the cancel",
        tx.query_one(
            "SELECT clock_timestamp()::text FROM pgtaskd.cancel($1)",
            &[&ids[0]],
        ),
    )
    .await
    .unwrap()
    .get(0);

    // The other tasks' leases are extended past a whole lease after the lock was taken.
    let extended_after = format!(
        "SELECT count(*) FROM pgtaskd.task_view WHERE id = ANY(ARRAY[{},{},{}]) \
           AND lease_expires_at > '{locked_at}'::timestamptz + interval '{} ms'",
        ids[1],
        ids[2],
        ids[3],
        LEASE.as_millis() + 200
    );
    eventually(
        Duration::from_secs(20),
        "the unlocked tasks' leases to be extended while the cancel is open",
        || {
            let client = &client;
            let sql = &extended_after;
            async move { (count(client, sql).await == 3).then_some(()) }
        },
    )
    .await;

    // Every analyzer returns; the three unlocked tasks finish while the cancel is still open.
    analyzer.open();
    for &id in &ids[1..] {
        wait_status(&client, id, TaskStatus::Succeeded).await;
    }
    let locked = queue::get(&client, ids[0]).await.unwrap().unwrap();
    assert_eq!(locked.status, TaskStatus::Running, "the locked task waits");

    // The producer commits: the waiting finish sees the cancel request.
    within(WAIT, "COMMIT", tx.commit()).await.unwrap();
    wait_status(&client, ids[0], TaskStatus::Canceled).await;
    daemon.stop().await;
    let claims = count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE attempt <> 1",
    )
    .await;
    assert_eq!(claims, 0, "no task was claimed twice");
}

#[tokio::test]
async fn a_heartbeat_and_a_batched_finish_skip_a_locked_row_and_say_so() {
    let db = TestDb::new().await;
    let client = db.client().await;
    for i in 0..3 {
        enqueue(&client, &format!("task {i}")).await;
    }
    let queues = vec!["default".to_string()];
    let claimed = queue::claim(&client, "me", &queues, 3, Duration::from_secs(30))
        .await
        .unwrap();
    let ids: Vec<i64> = claimed.iter().map(|c| c.id).collect();
    let tokens: Vec<i64> = claimed.iter().map(|c| c.token).collect();

    // The state row (pgtaskd.task_state, schema 36) is the one the daemon writes: holding it
    // is what makes the heartbeat and the finish pass over the task.
    let mut other = db.client().await;
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "UPDATE pgtaskd.task_state SET cancel_requested = true WHERE id = $1",
        &[&ids[1]],
    )
    .await
    .unwrap();

    let beats = within(
        WAIT,
        "a heartbeat that does not wait",
        queue::heartbeat(&client, &ids, &tokens, Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let beat = |id: i64| beats.iter().find(|b| b.id == id).map(|b| b.beat);
    assert_eq!(
        beat(ids[0]),
        Some(Beat::Extended {
            cancel_requested: false
        })
    );
    assert_eq!(beat(ids[1]), Some(Beat::Busy));
    assert_eq!(
        beat(ids[2]),
        Some(Beat::Extended {
            cancel_requested: false
        })
    );

    let finishes: Vec<queue::Finish> = claimed
        .iter()
        .map(|c| queue::Finish {
            id: c.id,
            token: c.token,
            outcome: Outcome::Failed("done".into()),
        })
        .collect();
    let answers = within(
        WAIT,
        "a batched finish that does not wait",
        queue::finish_many(&client, &finishes),
    )
    .await
    .unwrap();
    assert!(matches!(answers[0], Ok(TaskStatus::Failed)), "{answers:?}");
    assert!(
        matches!(answers[1], Err(FinishError::Locked)),
        "{answers:?}"
    );
    assert!(matches!(answers[2], Ok(TaskStatus::Failed)), "{answers:?}");
    tx.commit().await.unwrap();
    let status = within(
        WAIT,
        "the locked task's own finish",
        queue::finish(&client, tokens[1], ids[1], &finishes[1].outcome, true),
    )
    .await
    .unwrap();
    assert_eq!(
        status,
        TaskStatus::Canceled,
        "its cancel was committed first"
    );
}

#[tokio::test]
async fn a_claim_given_back_and_the_next_claim_share_an_attempt_but_not_a_token() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = enqueue(&client, "claimed twice").await;
    let queues = vec!["default".to_string()];
    let first = queue::claim(&client, "a", &queues, 1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        queue::release(&client, first.token, id, true)
            .await
            .unwrap(),
        TaskStatus::Queued
    );
    let second = queue::claim(&client, "a", &queues, 1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    assert_eq!((first.id, second.id), (id, id));
    assert_eq!(first.attempt, second.attempt, "a release is not an attempt");
    assert_ne!(first.token, second.token, "one claim, one token");

    // Every write of the first claim is refused; the second claim's lands.
    let outcome = Outcome::Failed("stale".into());
    let stale = queue::finish(&client, first.token, id, &outcome, true).await;
    assert!(
        matches!(stale, Err(FinishError::NotRunning { .. })),
        "{stale:?}"
    );
    let stale = queue::release(&client, first.token, id, true).await;
    assert!(
        matches!(stale, Err(FinishError::NotRunning { .. })),
        "{stale:?}"
    );
    let beats = queue::heartbeat(&client, &[id], &[first.token], Duration::from_secs(30))
        .await
        .unwrap();
    assert!(beats.is_empty(), "{beats:?}");
    assert_eq!(
        queue::finish(&client, second.token, id, &outcome, true)
            .await
            .unwrap(),
        TaskStatus::Failed
    );
}

/// Lock order: the heartbeat and the batched finish never wait for a row while holding
/// others, so repeated drains by two daemons with the fastest heartbeat (a third of a 300 ms
/// lease) leave no "deadlock detected" in the server's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_with_the_fastest_heartbeat_never_deadlock() {
    const TASKS: usize = 3_000;
    const FAST: &str = "[worker]\nconcurrency = 4\nlease = \"300ms\"\npoll_interval = \"200ms\"\n";
    let cluster = crate::support::Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    let mut daemons = [
        crate::support::DaemonProcess::start(&db, FAST, &[]),
        crate::support::DaemonProcess::start(&db, FAST, &[]),
    ];
    for drain in 1..=3 {
        crate::support::insert_payloads(&client, TASKS).await;
        crate::support::wait_count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
            (drain * TASKS) as i64,
            "the drain",
        )
        .await;
    }
    for daemon in &mut daemons {
        daemon.signal(libc::SIGTERM);
        assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    }
    let log = cluster.server_log();
    assert!(
        !log.contains("deadlock detected"),
        "the server saw a deadlock:\n{}",
        log.lines()
            .filter(|l| l.contains("deadlock") || l.contains("DETAIL") || l.contains("CONTEXT"))
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A lock on the whole table held longer than a lease (a `LOCK TABLE`, an index built in an
/// open transaction) blocks every daemon's heartbeat and finish, and every rescue. The table
/// is the state rows' (`pgtaskd.task_state`, schema 36), the only one the daemon writes; a
/// lock on `pgtaskd.tasks` no longer blocks any of them. Another daemon's rescuer must not
/// take back the finished tasks the moment the lock goes, before their finishes, blocked as
/// long, land. Their work ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lock_longer_than_a_lease_makes_no_finished_task_run_again() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let config = "[worker]\nconcurrency = 8\nlease = \"2s\"\npoll_interval = \"200ms\"\n\
                  [database]\nstatement_timeout = \"3s\"\n";
    let held = GatedAnalyzer::closed();
    let first = InProcessDaemon::start(&db, db.config(config), held.clone()).await;
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(enqueue(&client, &format!("finished behind a lock {i}")).await);
    }
    held.entered(8).await;
    // The second daemon comes only now: the tasks are the first one's, and its rescuer runs
    // every second.
    let other = GatedAnalyzer::counting();
    let second = InProcessDaemon::start(&db, db.config(config), other.clone()).await;

    let mut locker = db.client().await;
    let lock = within(WAIT, "BEGIN", locker.transaction()).await.unwrap();
    within(
        WAIT,
        "the table lock",
        lock.batch_execute("LOCK TABLE pgtaskd.task_state IN SHARE MODE"),
    )
    .await
    .unwrap();
    // The work returns while the table is locked, held past a statement timeout and a
    // lease after it: long enough for a rescuer that counts a mere answer as the database
    // being back to start a rescue that waits for the lock.
    held.open();
    held.returned(8).await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    within(WAIT, "COMMIT", lock.commit()).await.unwrap();

    for &id in &ids {
        let task = wait_status(&client, id, TaskStatus::Succeeded).await;
        assert_eq!(task.attempt, 1, "task {id} was claimed again");
    }
    assert_eq!(
        other.calls(),
        0,
        "the second daemon ran a finished task again"
    );
    second.stop().await;
    first.stop().await;
}

/// A row lock across a stop ("Parked results" in docs/design.md): a producer holds a finished
/// task's row while its daemon is told to stop. The stop cannot write the result; it parks it
/// and ends cleanly. Once the row is free, another daemon's rescuer writes the parked result:
/// the task ends SUCCEEDED with the counts the first daemon computed, on its first attempt,
/// its work never run again. Until then the stopped daemon stays listed in `pgtaskd.daemons`,
/// so that the view names the parked lease's holder by its whole instance id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_across_a_stop_parks_the_result_and_a_rescuer_writes_it() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // The statement timeout ends the stopped daemon's own wait for the row on the server (a
    // statement it sent before it stopped), so that only a rescuer can write the result.
    let config = "[worker]\nconcurrency = 2\nlease = \"2s\"\npoll_interval = \"200ms\"\n\
                  [shutdown]\ngrace = \"1s\"\n[database]\nstatement_timeout = \"2s\"\n";
    let held = GatedAnalyzer::closed();
    let mut first = InProcessDaemon::start(&db, db.config(config), held.clone()).await;
    let id = enqueue(&client, "one two three").await;
    held.entered(1).await;

    // The producer's transaction holds the task's row, and stays open across the stop: its
    // state row (pgtaskd.task_state, schema 36), the one the daemon writes.
    let mut producer = db.client().await;
    let tx = within(WAIT, "BEGIN", producer.transaction()).await.unwrap();
    within(
        WAIT,
        "the row lock",
        tx.execute(
            "SELECT 1 FROM pgtaskd.task_state WHERE id = $1 FOR UPDATE",
            &[&id],
        ),
    )
    .await
    .unwrap();
    held.open();
    held.returned(1).await;
    first.shutdown.trigger();
    let stopped = first.join_result().await;
    assert!(
        stopped.is_ok(),
        "the stop parks the result and ends cleanly: {stopped:?}"
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.parked_results").await,
        1,
        "the result is parked"
    );
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running, "the row was held");
    // The task is still RUNNING under the stopped daemon's lease key: its row in
    // pgtaskd.daemons stays (to turn stale), so that the view names the lease's holder by
    // its whole instance id, not by the key the state row holds (schema 41).
    let key: String = client
        .query_one(
            "SELECT lease_owner FROM pgtaskd.task_state WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    let holder = task.lease_owner.expect("a RUNNING task has a lease owner");
    assert_eq!(holder.split(':').count(), 3, "the whole id: {holder}");
    assert_eq!(holder.rsplit(':').next(), Some(key.as_str()));
    assert_eq!(
        count(
            &client,
            &format!("SELECT count(*) FROM pgtaskd.daemons WHERE instance = '{holder}'")
        )
        .await,
        1,
        "the stopped daemon stays listed while its lease holds a parked result"
    );
    eventually(
        WAIT,
        "no statement of the stopped daemon waiting for the row",
        || async {
            let waiting = count(
                &client,
                "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await;
            (waiting == 0).then_some(())
        },
    )
    .await;

    let other = GatedAnalyzer::counting();
    let second = InProcessDaemon::start(&db, db.config(config), other.clone()).await;
    within(WAIT, "COMMIT", tx.commit()).await.unwrap();
    let task = wait_status(&client, id, TaskStatus::Succeeded).await;
    assert_eq!(
        (task.attempt, task.words, task.bytes, task.runes),
        (1, 3, 13, 13),
        "the parked result, written on the first attempt"
    );
    assert_eq!(other.calls(), 0, "the second daemon ran the task again");
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.parked_results").await,
        0,
        "a written result is no longer parked"
    );
    second.stop().await;
}

/// Parked results whose rows someone holds do not keep the others from being written (schema
/// 34): the pick locks the rows it takes and passes over the held ones before its limit. A
/// parked result `finish` declines (CANCELED with no cancel request) is dropped, and its
/// claim is rescued like any other expired lease instead of being passed over for ever.
#[tokio::test]
async fn parked_results_on_held_rows_leave_the_rest_to_be_written_and_declined_ones_to_the_rescue()
{
    let db = TestDb::new().await;
    let client = db.client().await;
    for i in 0..6 {
        enqueue(&client, &format!("parked {i}")).await;
    }
    let queues = vec!["default".to_string()];
    let mut claimed = queue::claim(&client, "gone", &queues, 6, Duration::from_secs(30))
        .await
        .unwrap();
    claimed.sort_by_key(|c| c.id);
    let ids: Vec<i64> = claimed.iter().map(|c| c.id).collect();
    let tokens: Vec<i64> = claimed.iter().map(|c| c.token).collect();
    // Parked oldest first: the first two on rows a producer holds, the last one declined.
    let statuses = [
        "SUCCEEDED",
        "SUCCEEDED",
        "SUCCEEDED",
        "SUCCEEDED",
        "SUCCEEDED",
        "CANCELED",
    ];
    for (n, ((id, token), status)) in ids.iter().zip(&tokens).zip(statuses).enumerate() {
        within(
            WAIT,
            "a parked result",
            client.execute(
                "INSERT INTO pgtaskd.parked_results
                        (task_id, claim_token, status, words, bytes, runes, parked_at)
                 VALUES ($1, $2, $3, 1, 1, 1, now() - interval '1 minute' + $4 * interval '1 s')",
                &[id, token, &status, &(n as f64)],
            ),
        )
        .await
        .unwrap();
    }
    within(
        WAIT,
        "the leases expired",
        client.execute(
            "UPDATE pgtaskd.task_state SET lease_expires_at = now() - interval '1 s' WHERE id = ANY ($1)",
            &[&ids],
        ),
    )
    .await
    .unwrap();
    // Their state rows (pgtaskd.task_state, schema 36): the ones the daemon writes.
    let mut holder = db.client().await;
    let held = holder.transaction().await.unwrap();
    within(
        WAIT,
        "the rows held",
        held.execute(
            "SELECT 1 FROM pgtaskd.task_state WHERE id = ANY ($1) FOR UPDATE",
            &[&ids[..2].to_vec()],
        ),
    )
    .await
    .unwrap();

    let write = |max: i64| {
        let client = &client;
        async move {
            let rows = within(
                WAIT,
                "write_parked",
                client.query(
                    "SELECT task_id, task_status FROM pgtaskd.write_parked($1, 'me') ORDER BY 1",
                    &[&max],
                ),
            )
            .await
            .unwrap();
            rows.iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)))
                .collect::<Vec<_>>()
        }
    };
    let succeeded = |id: i64| (id, "SUCCEEDED".to_string());
    assert_eq!(
        write(2).await,
        [succeeded(ids[2]), succeeded(ids[3])],
        "the two oldest parked results not held are written"
    );
    assert_eq!(write(2).await, [succeeded(ids[4])]);
    let parked: Vec<i64> = within(
        WAIT,
        "the parked results left",
        client.query("SELECT task_id FROM pgtaskd.parked_results ORDER BY 1", &[]),
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(
        parked,
        ids[..2],
        "the declined result is dropped, the held kept"
    );
    let rescued: Vec<(i64, String)> = within(
        WAIT,
        "a rescue",
        client.query(
            "SELECT task_id, task_status FROM pgtaskd.rescue(10, 'me') ORDER BY 1",
            &[],
        ),
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    assert_eq!(
        rescued,
        [(ids[5], "QUEUED".to_string())],
        "the declined claim is rescued; the held ones are still parked"
    );

    held.commit().await.unwrap();
    assert_eq!(write(10).await, [succeeded(ids[0]), succeeded(ids[1])]);
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.parked_results").await,
        0
    );
}
