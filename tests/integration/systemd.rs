//! Running under systemd: the notification sequence of `Type=notify`, and JSON logs.

use std::time::Duration;

use pgtaskd::events::ANALYZER_RUN;
use tokio::net::UnixDatagram;

use crate::support::daemon::wait_listening;
use crate::support::{within, DaemonProcess, TestDb, WAIT};

/// A datagram socket of the test's own, standing for systemd's `NOTIFY_SOCKET`, and its path.
fn notify_socket() -> (UnixDatagram, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "pgtaskd-notify-{}-{}.sock",
        std::process::id(),
        fastrand::u32(..)
    ));
    (UnixDatagram::bind(&path).unwrap(), path)
}

/// Receive notifications until one contains `needle`; returns everything received.
async fn receive_until(socket: &UnixDatagram, needle: &str, seen: &mut Vec<String>) {
    within(WAIT, &format!("the notification {needle}"), async {
        let mut buffer = vec![0; 4096];
        loop {
            let n = socket
                .recv(&mut buffer)
                .await
                .expect("receive a notification");
            let message = String::from_utf8_lossy(&buffer[..n]).into_owned();
            let found = message.lines().any(|line| line == needle);
            seen.push(message);
            if found {
                return;
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_watchdog_and_stopping_are_sent_in_order_across_a_sigterm() {
    let db = TestDb::new().await;
    let (socket, path) = notify_socket();
    let notify_socket = path.to_string_lossy().to_string();
    let mut daemon = DaemonProcess::start_with_env(
        &db.url,
        "",
        &[],
        &[
            ("NOTIFY_SOCKET", &notify_socket),
            ("WATCHDOG_USEC", "200000"),
        ],
    );
    let mut seen = Vec::new();
    receive_until(&socket, "READY=1", &mut seen).await;
    // READY came after the listener was up: it is there now, with no waiting.
    within(
        Duration::from_secs(1),
        "the listener",
        wait_listening(&db, 1),
    )
    .await;
    let before_ready = seen.join("\n");
    assert!(!before_ready.contains("STOPPING=1"), "{before_ready}");
    receive_until(&socket, "WATCHDOG=1", &mut seen).await;
    receive_until(&socket, "WATCHDOG=1", &mut seen).await;
    daemon.signal(libc::SIGTERM);
    receive_until(&socket, "STOPPING=1", &mut seen).await;
    assert_eq!(daemon.wait().await.code(), Some(0));
    let all = seen.join("\n");
    let ready = all.find("READY=1").unwrap();
    let stopping = all.find("STOPPING=1").unwrap();
    assert!(ready < stopping, "{all}");
    assert!(all.contains("STATUS=ready"), "{all}");
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_task_id_and_attempt_on_every_task_line() {
    let db = TestDb::new().await;
    let mut daemon = DaemonProcess::start(&db, "[log]\nformat = \"json\"\n", &[]);
    daemon.wait_for_log("listening for notifications").await;
    let client = db.client().await;
    crate::support::enqueue(&client, "json logs").await;
    daemon.wait_for_log("task finished").await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0));
    let log = daemon.log_text();
    let mut task_lines = 0;
    for line in log.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"));
        let message = value["fields"]["message"].as_str().unwrap_or_default();
        if message.starts_with("task ") || message == ANALYZER_RUN {
            task_lines += 1;
            assert!(value["fields"]["id"].is_i64(), "{line}");
            assert!(value["fields"]["attempt"].is_i64(), "{line}");
        }
    }
    assert!(task_lines >= 3, "claimed, handler run, finished:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_is_ready_while_it_works_through_a_backlog() {
    // One slot, held by a child that does not end until the test says so: the backlog cannot
    // drain, so readiness can only come from the claims' answers.
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = crate::handlers::Scratch::new();
    let gate = scratch.path("gate");
    let handler = scratch.script(
        "wait.sh",
        &format!(
            "while [ ! -e {} ]; do sleep 0.05; done\necho done",
            gate.display()
        ),
    );
    within(
        WAIT,
        "the backlog",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT 'jobs', 'x' FROM generate_series(1, 5)",
        ),
    )
    .await
    .unwrap();
    let (socket, path) = notify_socket();
    let notify_socket = path.to_string_lossy().to_string();
    let config = format!(
        "[worker]\nqueues = [\"jobs\"]\n[http]\nlisten = \"127.0.0.1:0\"\n\
         [queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\nconcurrency = 1\n",
        handler.display()
    );
    let mut daemon =
        DaemonProcess::start_with_env(&db.url, &config, &[], &[("NOTIFY_SOCKET", &notify_socket)]);
    let mut seen = Vec::new();
    receive_until(&socket, "READY=1", &mut seen).await;
    let addr = daemon.http_addr().await;
    let response = within(
        WAIT,
        "GET /readyz",
        reqwest::get(format!("http://{addr}/readyz")),
    )
    .await
    .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let queued: i64 = within(
        WAIT,
        "the backlog's count",
        client.query_one(
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'QUEUED'",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    assert!(
        queued >= 4,
        "ready only once the backlog was worked through: {queued} left"
    );

    // The backlog then drains as usual.
    std::fs::write(&gate, "").unwrap();
    crate::support::wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        5,
        "the backlog to drain",
    )
    .await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    let _ = std::fs::remove_file(&path);
}

/// A daemon of many lanes is ready once each lane has scanned, all of them at once: waited
/// for one after the other, each lane's next scan came a poll tick after the one before it
/// (a hostile review: 20 s to ready with 30 lanes). Twelve lanes with a poll interval of
/// 2 s: ready within three intervals (one after the other: 8.1 s; at once: 0.08 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_of_many_lanes_is_ready_after_one_scan_of_each_at_once() {
    let db = TestDb::new().await;
    let names: Vec<String> = (0..12).map(|i| format!("lane{i}")).collect();
    let mut config = format!(
        "[worker]\nqueues = [{}]\npoll_interval = \"2s\"\n",
        names
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for name in &names {
        config.push_str(&format!(
            "[queues.{name}]\nhandler = \"exec\"\ncommand = [\"/bin/true\"]\n"
        ));
    }
    let (socket, path) = notify_socket();
    let notify_socket = path.to_string_lossy().to_string();
    let began = std::time::Instant::now();
    let mut daemon =
        DaemonProcess::start_with_env(&db.url, &config, &[], &[("NOTIFY_SOCKET", &notify_socket)]);
    let mut seen = Vec::new();
    receive_until(&socket, "READY=1", &mut seen).await;
    let took = began.elapsed();
    println!("ready after {took:?} with {} lanes", names.len());
    assert!(
        took < Duration::from_secs(6),
        "ready after {took:?}: the lanes' scans were waited for one after the other"
    );
    daemon.signal(libc::SIGTERM);
    let _ = daemon.wait().await;
    let _ = std::fs::remove_file(path);
}
