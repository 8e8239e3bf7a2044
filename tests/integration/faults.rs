//! Database faults (docs/design.md: "Re-read, never re-run", "Nothing lost", "Unavailable is not absent"): unknown commit outcomes through a
//! fault-injecting proxy, terminated sessions, server restarts and outages, deadlines and a
//! bounded pool.

use std::time::Duration;

use tokio_postgres::Client;

use crate::support::proxy::{Fault, Proxy};
use crate::support::{
    assert_all_succeeded, audit, count, eventually, insert_payloads, server_addr, server_user,
    wait_count, Cluster, DaemonProcess, GatedAnalyzer, InProcessDaemon, TestDb, WAIT,
};

/// Text found only in the (batched) finish statement.
const FINISH_NEEDLE: &str = "FROM pgtaskd.finish(";

/// Tasks enqueued together, so that the faulted finish commits a batch of several.
const BATCH: usize = 40;

async fn unknown_outcome_ends_succeeded_with_one_analyzer_run(fault: Fault) {
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;
    let proxy = Proxy::start(server_addr(), fault, FINISH_NEEDLE).await;
    let mut config = db.config(
        "[database]\nstatement_timeout = \"1s\"\n[worker]\nconcurrency = 16\npoll_interval = \"500ms\"\n",
    );
    config.database.url = Some(proxy.conninfo(&server_user(), &db.name));
    let analyzer = GatedAnalyzer::counting();
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;

    let texts = insert_payloads(&client, BATCH).await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED')",
        BATCH as i64,
        "every task to finish",
    )
    .await;
    daemon.stop().await;

    assert!(proxy.triggered(), "{fault:?} happened");
    assert_eq!(
        assert_all_succeeded(&client, Some(1)).await,
        BATCH,
        "{fault:?}"
    );
    for text in &texts {
        assert_eq!(
            analyzer.calls_for(text),
            1,
            "{fault:?}: the analyzer ran once per claim"
        );
    }
    assert_eq!(audit::tasks_finished_twice(&client).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_lost_before_it_reached_the_server_is_applied_again_after_a_reread() {
    unknown_outcome_ends_succeeded_with_one_analyzer_run(Fault::DropBeforeSend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_committed_but_unanswered_is_accepted_after_a_reread() {
    unknown_outcome_ends_succeeded_with_one_analyzer_run(Fault::DropAfterReply).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_on_a_half_open_connection_hits_the_deadline_and_is_resolved() {
    unknown_outcome_ends_succeeded_with_one_analyzer_run(Fault::HalfOpen).await;
}

/// Text found only in the claim statement.
const CLAIM_NEEDLE: &str = "FROM pgtaskd.claim(";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_but_unanswered_gives_its_tasks_back_without_waiting_for_the_lease() {
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;
    let texts = insert_payloads(&client, BATCH).await;
    let proxy = Proxy::start(server_addr(), Fault::DropAfterReply, CLAIM_NEEDLE).await;
    // A lease far longer than the test: the rescuer cannot be what brings the tasks back.
    let mut config = db.config(
        "[database]\nstatement_timeout = \"1s\"\n[worker]\nconcurrency = 16\npoll_interval = \"200ms\"\nlease = \"10m\"\n",
    );
    config.database.url = Some(proxy.conninfo(&server_user(), &db.name));
    let analyzer = GatedAnalyzer::counting();
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;

    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        BATCH as i64,
        "every task to succeed, those of the unanswered claim included",
    )
    .await;
    daemon.stop().await;

    assert!(proxy.triggered(), "the first claim's answer was swallowed");
    // Given back without counting an attempt, claimed again, analyzed once.
    assert_eq!(assert_all_succeeded(&client, Some(1)).await, BATCH);
    for text in &texts {
        assert_eq!(
            analyzer.calls_for(text),
            1,
            "the analyzer ran once per task"
        );
    }
    assert_eq!(audit::tasks_finished_twice(&client).await, 0);
}

async fn listener_pid(client: &Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()
               AND application_name LIKE 'pgtaskd/%' AND query LIKE 'LISTEN%'",
            &[],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_reconnects_and_rescans_before_the_poll_tick() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut daemon = DaemonProcess::start(&db, "[worker]\npoll_interval = \"60s\"\n", &[]);
    daemon.wait_for_log("listening for notifications").await;
    crate::support::daemon::wait_listening(&db, 1).await;
    let old = listener_pid(&client).await.unwrap();
    client
        .execute("SELECT pg_terminate_backend($1)", &[&old])
        .await
        .unwrap();
    // Inserted while nobody listens: only the scan after the reconnect finds it.
    client
        .execute("SELECT pgtaskd.enqueue('while deaf')", &[])
        .await
        .unwrap();
    let limit = Duration::from_secs(15); // well under the 60 s poll tick
    let done = "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'";
    eventually(limit, "the task enqueued while deaf", || async {
        (count(&client, done).await == 1).then_some(())
    })
    .await;
    let new = eventually(limit, "a new listener", || async {
        listener_pid(&client).await.filter(|pid| *pid != old)
    })
    .await;
    assert_ne!(new, old);
    client
        .execute("SELECT pgtaskd.enqueue('after reconnect')", &[])
        .await
        .unwrap();
    eventually(limit, "the task enqueued after the reconnect", || async {
        (count(&client, done).await == 2).then_some(())
    })
    .await;
    assert!(
        daemon.log_text().contains("listener connection lost"),
        "{}",
        daemon.log_text()
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0));
}

/// After a fault: every task terminal and SUCCEEDED with correct counts, none finished twice,
/// no session left idle in a transaction.
async fn assert_backlog_done(client: &Client, n: i64) {
    eventually(WAIT, "the backlog to finish", || async move {
        (count(
            client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        )
        .await
            == n)
            .then_some(())
    })
    .await;
    assert_eq!(assert_all_succeeded(client, None).await as i64, n);
    assert_eq!(audit::tasks_finished_twice(client).await, 0);
    assert_eq!(audit::transitions_out_of_terminal(client).await, 0);
    let idle_in_transaction = count(
        client,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .await;
    assert_eq!(idle_in_transaction, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_every_daemon_session_mid_backlog_loses_nothing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;
    insert_payloads(&client, 2000).await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 8\npoll_interval = \"500ms\"\n",
        &[],
    );
    daemon.wait_for_log("task finished").await;
    for _ in 0..3 {
        client
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'pgtaskd/%'",
                &[],
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_backlog_done(&client, 2000).await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_server_restart_mid_backlog_loses_nothing() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    audit::install(&client).await;
    insert_payloads(&client, 2000).await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 8\npoll_interval = \"500ms\"\n",
        &[],
    );
    daemon.wait_for_log("task finished").await;
    cluster.stop_server(true);
    cluster.start_server();
    let client = db.client().await;
    assert_backlog_done(&client, 2000).await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_waits_out_an_outage_longer_than_a_poll_interval() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    audit::install(&client).await;
    insert_payloads(&client, 100).await;
    let mut daemon = DaemonProcess::start(&db, "[worker]\npoll_interval = \"300ms\"\n", &[]);
    assert_backlog_done(&client, 100).await;
    drop(client);
    cluster.stop_server(false); // an immediate stop, as a crash would
                                // The outage itself: several poll intervals with no server.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, _, stderr) =
        crate::support::daemon::pgtaskd(Some(&db.url), &["status", "1"]).await;
    assert_eq!(
        status.code(),
        Some(69),
        "status during the outage: {stderr}"
    );
    let (status, _, _) = crate::support::daemon::pgtaskd(Some(&db.url), &["cancel", "1"]).await;
    assert_eq!(status.code(), Some(69), "cancel during the outage");
    cluster.start_server();
    let client = db.client().await;
    insert_payloads(&client, 100).await;
    assert_backlog_done(&client, 200).await;
    assert!(daemon.log_text().contains("listener connection lost"));
    daemon.signal(libc::SIGTERM);
    assert_eq!(
        daemon.wait().await.code(),
        Some(0),
        "the outage did not end the daemon:\n{}",
        daemon.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_a_database_that_is_down_at_start() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    cluster.stop_server(true);
    let mut daemon = DaemonProcess::start(&db, "", &[]);
    daemon
        .wait_for_log("database unavailable; waiting for it")
        .await;
    cluster.start_server();
    daemon.wait_for_log("listening for notifications").await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0));
}

/// A statement the server cancels for its `statement_timeout` (here behind another session's
/// lock) is "not now", as the HTTP API's 503 says it: 69, never a runtime failure.
#[tokio::test]
async fn a_statement_timeout_behind_a_lock_exits_69() {
    let db = TestDb::new().await;
    let mut holder = db.client().await;
    let lock = holder.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE pgtaskd.tasks IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let output = crate::support::within(
        WAIT,
        "pgtaskd status behind a lock",
        tokio::process::Command::new(crate::support::daemon::binary())
            .args(["status", "1"])
            .env_remove("PGTASKD_CONFIG")
            .env("PGTASKD_DATABASE_URL", &db.url)
            .env("PGTASKD_DATABASE_STATEMENT_TIMEOUT", "500ms")
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("statement timeout"), "{stderr}");
    lock.rollback().await.unwrap();
}

#[tokio::test]
async fn status_against_a_server_that_never_answers_exits_69_at_the_connect_timeout() {
    // Accepts connections and says nothing: only the connect deadline ends the wait.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let url = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=1");
    for args in [&["status", "1"][..], &["cancel", "1"]] {
        let (status, stdout, stderr) = crate::support::daemon::pgtaskd(Some(&url), args).await;
        assert_eq!(status.code(), Some(69), "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert!(stderr.contains("database unavailable"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_two_serves_concurrency_sixteen_with_at_most_three_sessions() {
    let db = TestDb::new().await;
    let client = db.client().await;
    insert_payloads(&client, 3000).await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[database]\npool_size = 2\n[worker]\nconcurrency = 16\n",
        &[],
    );
    // From the listener on: the start-up's own sessions (the schema check, the check that the
    // LISTEN session reaches PostgreSQL) are closed by then.
    daemon.wait_for_log("listening for notifications").await;
    let mut most = 0;
    let mut names = std::collections::HashSet::new();
    loop {
        let rows = client
            .query(
                "SELECT application_name FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'pgtaskd/%'",
                &[],
            )
            .await
            .unwrap();
        most = most.max(rows.len());
        names.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        if count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        )
        .await
            == 3000
        {
            break;
        }
        assert!(!daemon.log_text().contains("pgtaskd stopped"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        most <= 3,
        "at most two worker sessions and the listener, saw {most}"
    );
    assert!(most >= 2, "the sampling saw the daemon at work");
    assert_eq!(
        names.len(),
        1,
        "one instance id on every session: {names:?}"
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0));
}
