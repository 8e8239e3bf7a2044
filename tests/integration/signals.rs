//! The signals a service receives, against a real `pgtaskd run` process with a task running
//! (README "Signals"): SIGHUP, SIGUSR1, SIGUSR2 and SIGPIPE leave it running and its work
//! going on; SIGQUIT is a fast stop that skips the grace and still gives every task back.

use pgtaskd::queue::TaskStatus;

use crate::support::{eventually, within, DaemonProcess, TestDb, WAIT};

/// Insert `n` texts of 66 MB, each taking the analyzer long enough that a signal sent when it
/// starts lands while it runs; returns their ids in claim order.
async fn large_tasks(client: &tokio_postgres::Client, n: i32) -> Vec<i64> {
    client
        .query(
            "INSERT INTO pgtaskd.tasks (payload)
             SELECT repeat('large text ', 6000000) FROM generate_series(1, $1) RETURNING id",
            &[&n],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// How many tasks are in `status`.
async fn in_status(client: &tokio_postgres::Client, status: &str) -> i64 {
    within(
        WAIT,
        "a status count",
        client.query_one(
            "SELECT count(*) FROM pgtaskd.task_view WHERE status::text = $1",
            &[&status],
        ),
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_sigusr1_sigusr2_and_sigpipe_leave_the_daemon_running_its_tasks() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids = large_tasks(&client, 4).await;
    let mut daemon = DaemonProcess::start(&db, "[worker]\nconcurrency = 1\n", &[]);
    let signals = [
        (
            libc::SIGHUP,
            Some("SIGHUP: the configuration is not reloaded"),
        ),
        (libc::SIGUSR1, Some("signal=\"SIGUSR1\"")),
        (libc::SIGUSR2, Some("signal=\"SIGUSR2\"")),
        // Nothing is logged: the daemon is alive if it goes on finishing tasks.
        (libc::SIGPIPE, None),
    ];
    for (id, (signal, logged)) in ids.iter().zip(signals) {
        // One signal while each task's analyzer runs.
        daemon.wait_for_log(&format!("handler run id={id} ")).await;
        daemon.signal(signal);
        if let Some(line) = logged {
            daemon.wait_for_log(line).await;
        }
    }
    eventually(WAIT, "every task to finish", || {
        let client = &client;
        async move { (in_status(client, "SUCCEEDED").await == 4).then_some(()) }
    })
    .await;
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait().await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());
    assert_eq!(in_status(&client, "RUNNING").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_skips_the_grace_gives_the_running_task_back_and_exits_0() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids = large_tasks(&client, 2).await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 1\n[shutdown]\ngrace = \"1h\"\n",
        &[],
    );
    daemon
        .wait_for_log(&format!("handler run id={} ", ids[0]))
        .await;
    daemon.signal(libc::SIGQUIT);
    let status = daemon.wait().await;
    let log = daemon.log_text();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        log.contains("stopping the handlers running=1"),
        "the analyzer was running and was stopped:\n{log}"
    );
    let rows = client
        .query(
            "SELECT status, attempt, lease_owner FROM pgtaskd.task_view ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    for row in rows {
        let status: TaskStatus = row.get::<_, &str>(0).parse().unwrap();
        assert_eq!(
            (status, row.get::<_, i32>(1), row.get::<_, Option<&str>>(2)),
            (TaskStatus::Queued, 0, None),
            "{log}"
        );
    }
}
