//! Two-phase shutdown (docs/design.md): a shutdown stops claiming at once, lets running tasks finish within the grace,
//! then stops the analyzers, waits for each, commits what finished and releases the rest.
//! A log pipe closed or full at the stop is in `log_pipe`.

use std::time::Duration;

use pgtaskd::queue::{self, TaskStatus};

use crate::support::{
    enqueue, eventually, expected_counts, insert_payloads, wait_status, within, Cluster,
    DaemonProcess, GatedAnalyzer, InProcessDaemon, TestDb, WAIT,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_held_analyzer_and_commits_its_result_within_the_grace() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    let mut daemon = InProcessDaemon::start(
        &db,
        db.config("[shutdown]\ngrace = \"60s\"\n"),
        analyzer.clone(),
    )
    .await;
    let id = enqueue(&client, "finish me during shutdown").await;
    analyzer.entered(1).await;
    daemon.shutdown.trigger();
    // Nothing lets the daemon return while the analyzer is held: give it the chance.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !daemon.is_finished(),
        "shutdown returned while an analyzer was held"
    );
    assert_eq!(
        queue::get(&client, id).await.unwrap().unwrap().status,
        TaskStatus::Running
    );
    analyzer.open();
    daemon.join().await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Succeeded);
    assert_eq!(
        (task.words, task.bytes, task.runes),
        expected_counts("finish me during shutdown")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_short_grace_the_claim_goes_back_to_queued_and_another_daemon_finishes_it() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let held = GatedAnalyzer::closed();
    let mut first = InProcessDaemon::start(
        &db,
        db.config("[shutdown]\ngrace = \"100ms\"\n"),
        held.clone(),
    )
    .await;
    let id = enqueue(&client, "hand me over").await;
    held.entered(1).await;
    first.shutdown.trigger();
    first.join().await;
    assert_eq!(
        held.returned_now(),
        1,
        "the analyzer returned before shutdown did"
    );
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued);
    assert_eq!(
        (task.attempt, task.lease_owner, task.lease_expires_at),
        (0, None, None)
    );
    assert_eq!(task.words, 0);

    let counting = GatedAnalyzer::counting();
    let second = InProcessDaemon::start(&db, db.config(""), counting.clone()).await;
    let task = eventually(WAIT, "the second daemon to finish the task", || {
        let client = &client;
        async move {
            queue::get(client, id)
                .await
                .unwrap()
                .filter(|t| t.status == TaskStatus::Succeeded)
        }
    })
    .await;
    second.stop().await;
    assert_eq!(task.attempt, 1, "a release does not count as an attempt");
    assert_eq!(
        (task.words, task.bytes, task.runes),
        expected_counts("hand me over")
    );
    assert_eq!(counting.calls_for("hand me over"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_inserted_after_shutdown_began_stay_queued() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    let mut daemon = InProcessDaemon::start(
        &db,
        db.config("[shutdown]\ngrace = \"60s\"\n"),
        analyzer.clone(),
    )
    .await;
    let held = enqueue(&client, "held").await;
    analyzer.entered(1).await;
    daemon.shutdown.trigger();
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'late ' || i FROM generate_series(1, 50) i",
            &[],
        )
        .await
        .unwrap();
    analyzer.open();
    daemon.join().await;
    assert_eq!(
        analyzer.calls(),
        1,
        "nothing was claimed after the shutdown began"
    );
    assert_eq!(
        queue::get(&client, held).await.unwrap().unwrap().status,
        TaskStatus::Succeeded
    );
    let row = client
        .query_one(
            "SELECT count(*) FROM pgtaskd.task_view
              WHERE payload LIKE 'late %' AND status = 'QUEUED' AND attempt = 0 AND lease_owner IS NULL",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_request_skips_the_grace_and_triggering_many_times_is_safe() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    let mut daemon = InProcessDaemon::start(
        &db,
        db.config("[shutdown]\ngrace = \"1h\"\n"),
        analyzer.clone(),
    )
    .await;
    let id = enqueue(&client, "interrupted").await;
    analyzer.entered(1).await;
    daemon.shutdown.trigger();
    daemon.shutdown.trigger();
    daemon.shutdown.trigger();
    daemon.join().await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!((task.status, task.attempt), (TaskStatus::Queued, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_task_released_by_shutdown_ends_canceled() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed_ignoring_cancel();
    let mut daemon = InProcessDaemon::start(
        &db,
        db.config("[shutdown]\ngrace = \"1h\"\n"),
        analyzer.clone(),
    )
    .await;
    let id = enqueue(&client, "canceled and stopped").await;
    analyzer.entered(1).await;
    queue::cancel(&client, id).await.unwrap();
    analyzer.saw_cancel(1).await;
    daemon.shutdown.trigger();
    daemon.shutdown.trigger();
    analyzer.open();
    daemon.join().await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!((task.status, task.words), (TaskStatus::Canceled, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_backlog_exits_0_leaving_every_row_terminal_or_queued_without_a_lease() {
    let db = TestDb::new().await;
    let client = db.client().await;
    insert_payloads(&client, 20_000).await;
    let mut daemon = DaemonProcess::start(&db, "[worker]\nconcurrency = 16\n", &[]);
    daemon.wait_for_log("task finished").await;
    daemon.signal(libc::SIGTERM);
    daemon.signal(libc::SIGTERM);
    daemon.signal(libc::SIGINT);
    let status = daemon.wait().await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());

    let rows = client
        .query(
            "SELECT payload, status, words, bytes, runes, attempt, lease_owner FROM pgtaskd.task_view",
            &[],
        )
        .await
        .unwrap();
    let mut succeeded = 0;
    let mut queued = 0;
    for row in &rows {
        let text: &str = row.get(0);
        match row.get::<_, &str>(1) {
            "SUCCEEDED" => {
                succeeded += 1;
                let got = (
                    row.get::<_, i64>(2),
                    row.get::<_, i64>(3),
                    row.get::<_, i64>(4),
                );
                assert_eq!(got, expected_counts(text));
            }
            "QUEUED" => {
                queued += 1;
                assert_eq!(row.get::<_, i32>(5), 0);
                assert_eq!(row.get::<_, Option<&str>>(6), None);
            }
            other => panic!("row left {other} after a clean shutdown"),
        }
    }
    assert_eq!(succeeded + queued, 20_000);
    assert!(succeeded > 0);
}

/// Tasks in each status.
pub(crate) async fn status_counts(client: &tokio_postgres::Client) -> Vec<(String, i64)> {
    client
        .query(
            "SELECT status::text, count(*) FROM pgtaskd.task_view GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Stopped while the database is down, a daemon does not wait for it forever: its last
/// claim's finish retries for the settle bound (one more grace, at least 5 s), then the
/// daemon returns (exit 69 for the binary), the row left RUNNING under its lease. Once the server is back and the lease has
/// expired, another daemon runs the task: nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_the_database_is_down_gives_up_after_the_grace_and_leaves_the_claim_to_its_lease(
) {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    let held = GatedAnalyzer::closed();
    let config = "[shutdown]\ngrace = \"1s\"\n[worker]\nlease = \"2s\"\n";
    let mut first = InProcessDaemon::start(&db, db.config(config), held.clone()).await;
    let id = enqueue(&client, "finished while the server is down").await;
    held.entered(1).await;
    drop(client);
    cluster.stop_server(true);
    first.shutdown.trigger();
    // The analyzer returns within the grace; its finish cannot reach the server.
    held.open();
    let result = within(
        Duration::from_secs(30),
        "the daemon to give up on the database",
        first.join_result(),
    )
    .await;
    assert!(
        matches!(result, Err(pgtaskd::daemon::DaemonError::Unsettled(1))),
        "one claim left unsettled: {result:?}"
    );

    cluster.start_server();
    let client = db.client().await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running, "left to its lease");
    // The daemon's row stays listed with the claim unsettled: the view names the lease's
    // holder by its whole instance id, not by the key the state row holds (schema 41).
    let key: String = client
        .query_one(
            "SELECT lease_owner FROM pgtaskd.task_state WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    let holder = task.lease_owner.expect("a RUNNING task has a lease owner");
    assert_eq!(holder.rsplit(':').next(), Some(key.as_str()));
    assert_eq!(holder.split(':').count(), 3, "{holder}");
    let second = InProcessDaemon::start(&db, db.config(config), GatedAnalyzer::counting()).await;
    let task = wait_status(&client, id, TaskStatus::Succeeded).await;
    assert_eq!(task.attempt, 2, "run again after the lease expired");
    second.stop().await;
}

/// A stop during a short outage commits the result once the database is back within the
/// stop's bound, rather than sleeping through it on the outage's grown backoff and giving
/// the claim back (its work then ran again). The server is away from before the result until
/// 3 s into the stop's 6 s (1 s of grace, then 5 s to settle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_held_through_a_short_outage_is_committed_by_the_stop() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    let held = GatedAnalyzer::closed();
    let config = "[shutdown]\ngrace = \"1s\"\n[worker]\nlease = \"30s\"\n";
    let mut first = InProcessDaemon::start(&db, db.config(config), held.clone()).await;
    let id = enqueue(&client, "finished while the server is down").await;
    held.entered(1).await;
    drop(client);
    cluster.stop_server(true);
    // The result is held while the server is away, long enough for the retries' delays to
    // grow to seconds.
    held.open();
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.shutdown.trigger();
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.start_server();
    let result = within(Duration::from_secs(30), "the stop", first.join_result()).await;
    assert!(result.is_ok(), "every claim settled: {result:?}");
    let client = db.client().await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!((task.status, task.attempt), (TaskStatus::Succeeded, 1));
    assert_eq!(held.calls(), 1, "the analyzer ran once");
}

/// `shutdown.grace = "0s"` means "do not wait for the analyzers", not "do not wait for the
/// database to take the tasks back": stopped while two large texts are being analyzed and the
/// rest of the backlog is claimed ahead, the daemon stops the analyzers at once, gives every
/// claim back and exits 0, leaving no row RUNNING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_zero_grace_while_analyzers_run_gives_every_claim_back_and_exits_0() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // Four texts of 60 MB first in claim order, then 2,000 short ones.
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload)
             SELECT repeat('large text ', 6000000) FROM generate_series(1, 4)",
            &[],
        )
        .await
        .unwrap();
    insert_payloads(&client, 2_000).await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 2\n[shutdown]\ngrace = \"0s\"\n",
        &[],
    );
    // An analyzer has started on a large text: SIGTERM lands while it runs.
    daemon.wait_for_log("bytes=66000000").await;
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait().await;
    let log = daemon.log_text();
    assert!(
        log.contains("stopping the handlers running=1")
            || log.contains("stopping the handlers running=2"),
        "the analyzers were running at the stop:\n{log}"
    );
    let counts = within(WAIT, "the status counts", status_counts(&client)).await;
    assert!(
        counts.iter().all(|(status, _)| status != "RUNNING"),
        "{counts:?}\n{log}"
    );
    assert_eq!(status.code(), Some(0), "{counts:?}\n{log}");
    let leftover = client
        .query_one(
            "SELECT count(*) FROM pgtaskd.task_view
              WHERE status = 'QUEUED' AND (attempt <> 0 OR lease_owner IS NOT NULL)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        leftover.get::<_, i64>(0),
        0,
        "released claims keep no lease"
    );
}

/// A release the stop gave up on may still land: the daemon counts what is really left
/// RUNNING, not what it stopped waiting for. The row is locked while the analyzer is stopped,
/// so that the release waits past the settle bound; the lock is let go once the daemon has
/// given up, the release lands, and the daemon exits 0 with the task QUEUED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_given_up_on_that_lands_anyway_counts_as_settled_and_exits_0() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) SELECT repeat('large text ', 6000000) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 1\n[shutdown]\ngrace = \"0s\"\n",
        &[],
    );
    daemon.wait_for_log("bytes=66000000").await;
    let locker = db.client().await;
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM pgtaskd.task_view WHERE id = {id} FOR UPDATE"
        ))
        .await
        .unwrap();
    daemon.signal(libc::SIGTERM);
    daemon.wait_for_log("giving up on them").await;
    locker.batch_execute("COMMIT").await.unwrap();
    let status = daemon.wait().await;
    let log = daemon.log_text();
    assert!(
        log.contains("stopping the handlers running=1"),
        "the analyzer was running at the stop:\n{log}"
    );
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(
        (task.status, task.attempt),
        (TaskStatus::Queued, 0),
        "{log}"
    );
    assert_eq!(status.code(), Some(0), "{log}");
}
