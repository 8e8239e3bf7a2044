//! The database's and the role's own defaults do not change what pgtaskd's sessions rely on
//! (docs/design.md, "Sessions set what they rely on"): transactions are read committed,
//! read-write and not deferrable whatever `ALTER DATABASE ... SET` says. A server that really
//! does not accept writes (a hot standby) is not ready, and `check-config --connect` says why.
//! A producer that prepares its transaction (two-phase commit) can enqueue.

use reqwest::StatusCode;

use pgtaskd::queue::TaskStatus;

use crate::support::daemon::pgtaskd;
use crate::support::probe::{get, wait_answer};
use crate::support::{
    eventually, free_port, insert_payloads, wait_count, wait_status, within, Cluster,
    DaemonProcess, GatedAnalyzer, InProcessDaemon, TestDb, WAIT,
};

/// Wait until every task of `db` has succeeded.
async fn wait_all_succeeded(client: &tokio_postgres::Client, tasks: i64) {
    eventually(WAIT, "every task to succeed", || async move {
        let row = client
            .query_one(
                "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
                &[],
            )
            .await
            .ok()?;
        (row.get::<_, i64>(0) == tasks).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_database_default_does_not_reach_the_daemons_sessions() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation = serializable;
             ALTER DATABASE {} SET default_transaction_deferrable = on",
            db.name, db.name
        ))
        .await
        .unwrap();
    let pool = db.pool(1);
    let session = within(WAIT, "a pooled session", pool.get()).await.unwrap();
    let row = session
        .query_one(
            "SELECT current_setting('default_transaction_isolation'),
                    current_setting('transaction_isolation'),
                    current_setting('default_transaction_deferrable')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, &str>(0),
            row.get::<_, &str>(1),
            row.get::<_, &str>(2)
        ),
        ("read committed", "read committed", "off")
    );
    drop(session);

    // A drain under that default: no claim or finish conflicts with another.
    insert_payloads(&client, 5_000).await;
    let mut daemon = DaemonProcess::start(&db, "[worker]\nconcurrency = 8\n", &[]);
    wait_all_succeeded(&client, 5_000).await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    let log = daemon.log_text();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(warnings.is_empty(), "{}", warnings.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_default_does_not_stop_the_daemon_from_writing() {
    let db = TestDb::new().await;
    // Opened before the default changes: this session still writes.
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .await
        .unwrap();
    insert_payloads(&client, 100).await;
    let port = free_port();
    let mut daemon = DaemonProcess::start(
        &db,
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"),
        &[],
    );
    wait_all_succeeded(&client, 100).await;
    wait_answer(port, "/readyz", StatusCode::OK, "/readyz ready").await;
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["check-config", "--connect"]).await;
    assert_eq!(status.code(), Some(0), "{stdout}{stderr}");
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_standby_is_not_ready_and_check_config_says_why() {
    let primary = Cluster::start_primary();
    let db = TestDb::on(&primary).await;
    let standby = Cluster::start_standby_of(&primary);
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=5",
        standby.port, db.name
    );
    let (status, stdout, stderr) = pgtaskd(Some(&url), &["check-config", "--connect"]).await;
    assert_eq!(status.code(), Some(69), "{stdout}{stderr}");
    assert!(
        stderr.contains("does not accept writes") && stderr.contains("pg_is_in_recovery()"),
        "{stderr}"
    );
    assert!(!stdout.contains("configuration is valid"), "{stdout}");

    let port = free_port();
    let mut daemon = DaemonProcess::start_url(
        &url,
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"),
        &[],
    );
    // 503 "starting" first, then 503 with the reason once the start-up has read the server.
    let body = eventually(WAIT, "/readyz on a standby to say why", || async move {
        get(port, "/readyz")
            .await
            .filter(|(status, body)| {
                *status == StatusCode::SERVICE_UNAVAILABLE && body["reason"] != "starting"
            })
            .map(|(_, body)| body)
    })
    .await;
    let reason = body["reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains("does not accept writes") && reason.contains("pg_is_in_recovery()"),
        "{body}"
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

/// A producer that prepares its transaction (two-phase commit) enqueues with
/// `SET LOCAL pgtaskd.notify = off`: the insert trigger does not notify, so PREPARE succeeds
/// even while a daemon is idle, and the daemon finds the task at its poll tick. Without it,
/// the insert notifies while a daemon is idle, and PostgreSQL refuses the PREPARE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_producer_enqueues_with_pgtaskd_notify_off_while_a_daemon_is_idle() {
    let cluster = Cluster::start_with(&[("max_prepared_transactions", "2")], &[]);
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    let daemon = InProcessDaemon::start(
        &db,
        db.config("[worker]\npoll_interval = \"1s\"\n"),
        GatedAnalyzer::counting(),
    )
    .await;
    let idle = "SELECT count(*) FROM pgtaskd.idle_daemons WHERE expires_at > now()";
    wait_count(&client, idle, 1, "the daemon's idle flag").await;

    let refused = client
        .batch_execute(
            "BEGIN;
             INSERT INTO pgtaskd.tasks (payload) VALUES ('prepared, notifying');
             PREPARE TRANSACTION 'pgtaskd-notifying'",
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("NOTIFY") || format!("{refused:?}").contains("NOTIFY"),
        "{refused:?}"
    );
    client.batch_execute("ROLLBACK").await.unwrap();
    wait_count(&client, idle, 1, "the daemon still idle").await;

    within(
        WAIT,
        "a prepared enqueue",
        client.batch_execute(
            "BEGIN;
             SET LOCAL pgtaskd.notify = off;
             INSERT INTO pgtaskd.tasks (payload) VALUES ('prepared');
             PREPARE TRANSACTION 'pgtaskd-prepared'",
        ),
    )
    .await
    .unwrap();
    client
        .batch_execute("COMMIT PREPARED 'pgtaskd-prepared'")
        .await
        .unwrap();
    let id: i64 = client
        .query_one(
            "SELECT id FROM pgtaskd.task_view WHERE payload = 'prepared'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    wait_status(&client, id, TaskStatus::Succeeded).await;
    daemon.stop().await;
}
