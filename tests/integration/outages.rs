//! Outages of the database longer than the lease (docs/design.md, "Settle before rescuing"):
//! when the database is back, each daemon extends its leases and commits what it holds before
//! any rescuer takes a lease back, so no finished work runs again. And the log of an outage
//! is bounded: each kind of failure said once (finish batches failing too), and its recovery
//! once.

use std::time::Duration;

use crate::support::{
    count, eventually, insert_payloads, wait_count, within, DaemonProcess, TestDb, WAIT,
};

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
                "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
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
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
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

/// The log of an outage is bounded (docs/operations.md, "Logs"): a daemon running tasks whose
/// rows someone else holds locked, so that its heartbeat is extending their leases one by one
/// when the database goes, and whose claims find no database either. Each kind of failure is
/// said once at WARN however many tasks it touches and however many times it repeats, and
/// each is followed by one line when it works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_logged_once_whatever_the_tasks() {
    const TASKS: usize = 40;
    // Room for more tasks than there are: claims run at every poll through the outage.
    const CONFIG: &str = "[worker]\nconcurrency = 50\nlease = \"2s\"\npoll_interval = \"300ms\"\n\
                          [database]\nconnect_timeout = \"1s\"\n[shutdown]\ngrace = \"1s\"\n\
                          [queues.default]\nhandler = \"exec\"\n\
                          command = [\"/bin/sh\", \"-c\", \"exec sleep 600\"]\nkill_after = \"1s\"\n";
    let cluster = crate::support::Cluster::start();
    let db = TestDb::on(&cluster).await;
    let mut client = db.client().await;
    insert_payloads(&client, TASKS).await;
    // The default level (`info`), as an operator runs it.
    let mut daemon = DaemonProcess::start_with_env(&db.url, CONFIG, &[], &[("RUST_LOG", "")]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'",
        TASKS as i64,
        "every task to be running",
    )
    .await;
    let locks = client.transaction().await.unwrap();
    locks
        .execute(
            "SELECT id FROM pgtaskd.task_view WHERE status = 'RUNNING' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let watcher = db.client().await;
    eventually(WAIT, "the heartbeat to wait for a locked row", || {
        let watcher = &watcher;
        async move {
            let waiting = count(
                watcher,
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'pgtaskd/%'
                    AND wait_event_type = 'Lock'",
            )
            .await;
            (waiting > 0).then_some(())
        }
    })
    .await;
    let before_outage = daemon.log_text().lines().count();
    cluster.stop_server(false);
    drop(locks);
    // The outage's length is the scenario, not a wait for anything: a dozen heartbeats and
    // claims, and two of the listener's reconnects.
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.start_server();
    within(
        WAIT,
        "the heartbeat's recovery line",
        daemon.wait_for_log("lease heartbeat working again"),
    )
    .await;
    within(
        WAIT,
        "the claims' recovery line",
        daemon.wait_for_log("claims working again"),
    )
    .await;
    let log = daemon.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .skip(before_outage)
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        warnings.len() <= 10,
        "{} warnings for one outage:\n{}",
        warnings.len(),
        warnings.join("\n")
    );
    assert!(
        !log.contains("locked row"),
        "an outage is not a locked row:\n{log}"
    );
    daemon.signal(libc::SIGTERM);
    daemon.wait().await;
}

/// Tasks that finish while the database is away fail their finish batches one after another:
/// the first failure is said at WARN, the others at debug level, and one line says when
/// batches work again (each batch's failure at WARN made dozens of lines of one outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_batches_failing_through_an_outage_are_said_once() {
    const TASKS: usize = 300;
    const CONFIG: &str = "[worker]\nconcurrency = 30\nlease = \"30s\"\npoll_interval = \"300ms\"\n\
                          [database]\nconnect_timeout = \"1s\"\n\
                          [queues.default]\nhandler = \"exec\"\n\
                          command = [\"/bin/sh\", \"-c\", \"sleep 1\"]\n";
    let (cluster, db, mut daemon) = running(TASKS, 30, CONFIG).await;
    cluster.stop_server(false);
    // The outage's length is the scenario: every running task's command ends within it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.start_server();
    within(
        WAIT,
        "the finish batches' recovery line",
        daemon.wait_for_log("finish batches working again"),
    )
    .await;
    let log = daemon.log_text();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("finish batch"))
        .collect();
    assert_eq!(said.len(), 1, "one WARN line:\n{}", said.join("\n"));
    all_succeed_then_stop(&db, TASKS, &mut daemon).await;
}

/// Claims settled alone through an outage take turns, not each a backoff of its own: sixty
/// claims whose commands end while the database is away cost a connection attempt each, then
/// one try per delay of a shared backoff, until it is back. A listener on
/// the server's port counts the attempts meanwhile (accepted and closed at once, as a
/// server that is not there yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_settled_alone_through_an_outage_take_turns() {
    const TASKS: usize = 60;
    const CONFIG: &str = "[worker]\nconcurrency = 60\nlease = \"60s\"\n\
                          [database]\nconnect_timeout = \"1s\"\n\
                          [queues.default]\nhandler = \"exec\"\n\
                          command = [\"/bin/sh\", \"-c\", \"sleep 1\"]\n";
    let (cluster, db, mut daemon) = running(TASKS, TASKS, CONFIG).await;
    cluster.stop_server(false);
    let listener = within(WAIT, "the server's port to be free", async {
        loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", cluster.port)).await {
                Ok(listener) => return listener,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    // The outage's length is the scenario: every command ends within its first second.
    let window = Duration::from_secs(10);
    let mut attempts = 0usize;
    let _ = tokio::time::timeout(window, async {
        loop {
            if let Ok((socket, _)) = listener.accept().await {
                attempts += 1;
                drop(socket);
            }
        }
    })
    .await;
    drop(listener);
    cluster.start_server();
    all_succeed_then_stop(&db, TASKS, &mut daemon).await;
    eprintln!(
        "connection attempts in {} s of outage: {attempts}",
        window.as_secs()
    );
    // A try each (60), a try per turn (about 8 in 10 s), the heartbeat, claims and listener
    // (about 20): each claim on its own backoff made about 8 tries more each (over 400).
    assert!(
        attempts < 200,
        "{attempts} connection attempts in {} s",
        window.as_secs()
    );
}

/// A cluster of its own with `tasks` tasks, and a daemon of `config` at the default log
/// level (`info`, as an operator runs it) once `running` of them run.
async fn running(
    tasks: usize,
    running: usize,
    config: &str,
) -> (crate::support::Cluster, TestDb, DaemonProcess) {
    let cluster = crate::support::Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    insert_payloads(&client, tasks).await;
    let daemon = DaemonProcess::start_with_env(&db.url, config, &[], &[("RUST_LOG", "")]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'",
        running as i64,
        "the tasks to run",
    )
    .await;
    (cluster, db, daemon)
}

/// Every one of `tasks` SUCCEEDED once the database is back; then the daemon stops.
async fn all_succeed_then_stop(db: &TestDb, tasks: usize, daemon: &mut DaemonProcess) {
    let client = db.client().await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        tasks as i64,
        "every task to succeed",
    )
    .await;
    daemon.signal(libc::SIGTERM);
    within(WAIT, "the daemon to stop", daemon.wait()).await;
}

/// A server that gives sessions but refuses every write as read-only (a standby at the
/// daemon's address, simulated by a trigger that refuses the finishes with SQLSTATE 25006)
/// is an outage for the claims settled alone: they take turns, one try per delay of a shared
/// backoff growing to 5 s, not a retry per claim each time a session opens. Counted by the
/// server's own count of sessions; a try discards its session, as after any outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_refused_as_read_only_are_tried_once_a_turn_not_once_a_claim() {
    const TASKS: usize = 40;
    const CONFIG: &str = "[worker]\nconcurrency = 40\nlease = \"60s\"\n\
                          [database]\nconnect_timeout = \"1s\"\n\
                          [queues.default]\nhandler = \"exec\"\n\
                          command = [\"/bin/sh\", \"-c\", \"sleep 1\"]\n";
    let (_cluster, db, mut daemon) = running(TASKS, TASKS, CONFIG).await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE FUNCTION public.read_only() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING' THEN
                     RAISE EXCEPTION 'cannot execute UPDATE in a read-only transaction'
                         USING ERRCODE = '25006';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER read_only BEFORE UPDATE ON pgtaskd.task_state
                 FOR EACH ROW EXECUTE FUNCTION public.read_only();",
        )
        .await
        .unwrap();
    let sessions = "SELECT sessions FROM pg_stat_database WHERE datname = current_database()";
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let before = count(&client, sessions).await;
    // The length of the refusal is the scenario: every command ends within its first second.
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let opened = count(&client, sessions).await - before;
    client
        .batch_execute("DROP TRIGGER read_only ON pgtaskd.task_state")
        .await
        .unwrap();
    drop(client);
    all_succeed_then_stop(&db, TASKS, &mut daemon).await;
    eprintln!(
        "sessions opened in {} s of refused writes: {opened}",
        window.as_secs()
    );
    // A batch or two, a try per turn (about 8 in 10 s), the heartbeat and claims' own: a
    // retry per claim at every opened session made hundreds.
    assert!(
        opened < 100,
        "{opened} sessions in {} s of refused writes",
        window.as_secs()
    );
}

/// HTTP requests through an outage: each is 503 "database unavailable", the log says so once
/// at WARN (not once per request: a dashboard polling through a long outage filled the log),
/// and says once when a request is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_through_an_outage_are_said_once_and_so_is_the_recovery() {
    let cluster = crate::support::Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    let id = crate::support::enqueue(&client, "a few words").await;
    let mut daemon = DaemonProcess::start_with_env(
        &db.url,
        "[http]\nlisten = \"127.0.0.1:0\"\n[database]\nconnect_timeout = \"1s\"\n",
        &[],
        &[("RUST_LOG", "")],
    );
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the task to succeed",
    )
    .await;
    drop(client);
    let addr = daemon.http_addr().await;
    let url = format!("http://{addr}/tasks/{id}");
    let get = || async {
        within(WAIT, "GET /tasks/{id}", reqwest::get(&url))
            .await
            .expect("an answer")
            .status()
            .as_u16()
    };
    assert_eq!(get().await, 200);
    cluster.stop_server(false);
    for _ in 0..10 {
        assert_eq!(get().await, 503, "an outage is unavailable");
    }
    let said = daemon
        .log_text()
        .matches("HTTP requests cannot be served by the database")
        .count();
    assert_eq!(said, 1, "{}", daemon.log_text());
    cluster.start_server();
    eventually(WAIT, "a read served again", || async {
        (get().await == 200).then_some(())
    })
    .await;
    within(
        WAIT,
        "the recovery line",
        daemon.wait_for_log("HTTP requests served by the database again"),
    )
    .await;
    daemon.signal(libc::SIGTERM);
    let _ = daemon.wait().await;
}

/// A wait that the database's outage ends, after the task was enqueued, names the task:
/// `enqueue --wait` prints its id and exits 69, `POST /tasks?wait=` answers 503 with its id
/// and `Location`, so that a client retrying on either does not enqueue it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ended_by_an_outage_still_names_the_task_it_enqueued() {
    let cluster = crate::support::Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    let mut daemon = DaemonProcess::start_with_env(
        &db.url,
        "[http]\nlisten = \"127.0.0.1:0\"\n[database]\nconnect_timeout = \"1s\"\n",
        &[],
        &[],
    );
    let addr = daemon.http_addr().await;
    // Neither task's queue is served: both wait until the database goes.
    let mut cli = tokio::process::Command::new(crate::support::daemon::binary())
        .args([
            "enqueue",
            "--queue",
            "parked",
            "--wait",
            "--timeout",
            "60s",
            "by-cli",
        ])
        .env_remove("PGTASKD_CONFIG")
        .env("PGTASKD_DATABASE_URL", &db.url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("pgtaskd enqueue starts");
    let http = tokio::spawn({
        let url = format!("http://{addr}/tasks?queue=parked&wait=30s");
        async move {
            reqwest::Client::new()
                .post(url)
                .header("content-type", "text/plain")
                .body("by-http")
                .send()
                .await
        }
    });
    let ids = "SELECT count(*) FROM pgtaskd.tasks WHERE payload IN ('by-cli', 'by-http')";
    wait_count(&client, ids, 2, "both tasks enqueued").await;
    let cli_id = count(
        &client,
        "SELECT id FROM pgtaskd.tasks WHERE payload = 'by-cli'",
    )
    .await;
    let http_id = count(
        &client,
        "SELECT id FROM pgtaskd.tasks WHERE payload = 'by-http'",
    )
    .await;
    drop(client);
    cluster.stop_server(true);

    let response = within(WAIT, "the waiting POST to end", http)
        .await
        .unwrap()
        .expect("an answer");
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some(format!("/tasks/{http_id}").as_str())
    );
    let body: serde_json::Value = within(WAIT, "its body", response.json()).await.unwrap();
    assert_eq!(body["id"], http_id, "{body}");
    assert_eq!(body["error"], "database unavailable", "{body}");

    let mut stdout = String::new();
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    let (mut out, mut err) = (cli.stdout.take().unwrap(), cli.stderr.take().unwrap());
    let status = within(WAIT, "the waiting enqueue to end", async {
        out.read_to_string(&mut stdout).await.unwrap();
        err.read_to_string(&mut stderr).await.unwrap();
        cli.wait().await.unwrap()
    })
    .await;
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert_eq!(stdout.trim(), cli_id.to_string(), "{stderr}");
    assert!(
        stderr.contains(&format!("task {cli_id} was enqueued")),
        "{stderr}"
    );
    daemon.signal(libc::SIGKILL);
}
