//! Outages of the database longer than the lease (docs/design.md, "Settle before rescuing"):
//! when the database is back, each daemon extends its leases and commits what it holds before
//! any rescuer takes a lease back, so no finished work runs again.

use std::time::Duration;

use crate::support::{count, eventually, insert_payloads, wait_count, DaemonProcess, TestDb, WAIT};

/// Settle before rescuing (docs/design.md): the database away for three leases while two
/// daemons hold claims and results. When it is back, each daemon extends its leases and
/// commits what it holds before any rescuer takes a lease back: no task's analyzer runs
/// twice, and every task ends SUCCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_lease_reruns_no_finished_work() {
    const TASKS: usize = 4_000;
    const CONFIG: &str = "[worker]\nconcurrency = 4\nlease = \"2s\"\npoll_interval = \"500ms\"\n\
                          [database]\nconnect_timeout = \"1s\"\n";
    let cluster = crate::support::Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    insert_payloads(&client, TASKS).await;
    let mut daemons = [
        DaemonProcess::start(&db, CONFIG, &[]),
        DaemonProcess::start(&db, CONFIG, &[]),
    ];
    eventually(WAIT, "a few hundred tasks to succeed", || {
        let client = &client;
        async move {
            let done = count(
                client,
                "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
            )
            .await;
            (done >= 300).then_some(())
        }
    })
    .await;
    cluster.stop_server(false);
    // The outage's length is the scenario, not a wait for anything: three leases.
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster.start_server();
    let client = db.client().await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
        TASKS as i64,
        "every task to succeed after the outage",
    )
    .await;
    for daemon in &mut daemons {
        daemon.signal(libc::SIGTERM);
        assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    }
    let mut runs: std::collections::HashMap<i64, usize> = Default::default();
    for daemon in &daemons {
        for line in daemon.log_text().lines() {
            if !line.contains(pgtaskd::events::ANALYZER_RUN) {
                continue;
            }
            let id = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("id=")?.parse::<i64>().ok());
            *runs.entry(id.expect("an id")).or_default() += 1;
        }
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} tasks ran more than once, e.g. {:?}",
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    let rescued: usize = daemons
        .iter()
        .map(|d| d.log_text().matches("lease expired; task rescued").count())
        .sum();
    assert_eq!(rescued, 0, "no live claim was rescued");
}
