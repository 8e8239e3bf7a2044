//! Operators steering their queues: pause and resume (SQL, CLI, HTTP), who may pause, resume
//! and retry, and queue names over 128 bytes refused everywhere. Retry is in `retry`, list and
//! stats in `list_and_stats`.

use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::support::daemon::{pgtaskd, wait_listening};
use crate::support::{
    connect, count, free_port, wait_count, within, Cluster, DaemonProcess, GatedAnalyzer,
    InProcessDaemon, TestDb, WAIT,
};

pub(crate) async fn exec(client: &Client, sql: &str) {
    within(WAIT, sql, client.batch_execute(sql))
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_is_skipped_while_another_is_served_and_resume_wakes_the_daemon() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["pause", "slow"]).await;
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("queue slow paused"), "{stdout}");
    let (status, stdout, _) = pgtaskd(Some(&db.url), &["pause", "slow"]).await;
    assert!(status.success());
    assert!(stdout.contains("already paused"), "{stdout}");

    // Only a notification can make this daemon claim: its poll tick is an hour.
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nqueues = [\"default\", \"slow\"]\npoll_interval = \"1h\"\n",
        &[],
    );
    wait_listening(&db, 1).await;
    // One statement, one notification: the claim it causes sees both queues.
    exec(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue)
         SELECT 'task ' || i, CASE WHEN i % 2 = 0 THEN 'slow' ELSE 'default' END
           FROM generate_series(1, 6) AS i",
    )
    .await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'default' AND status = 'SUCCEEDED'",
        3,
        "the tasks of the queue that is not paused",
    )
    .await;
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'slow' AND status = 'QUEUED' AND attempt = 0"
        )
        .await,
        3,
        "a paused queue is not claimed from"
    );

    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["resume", "slow"]).await;
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("queue slow resumed"), "{stdout}");
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'slow' AND status = 'SUCCEEDED'",
        3,
        "the resumed queue's tasks, woken by the resume's notification",
    )
    .await;
    let (status, stdout, _) = pgtaskd(Some(&db.url), &["resume", "slow"]).await;
    assert!(status.success());
    assert!(stdout.contains("was not paused"), "{stdout}");

    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_tasks_of_a_paused_queue_finish_and_producers_keep_enqueueing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    let _open = analyzer.open_on_drop();
    let config = db.config("[worker]\nqueues = [\"default\", \"probe\"]\npoll_interval = \"1h\"\n");
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;
    exec(
        &client,
        "INSERT INTO pgtaskd.tasks (payload) VALUES ('one'), ('two')",
    )
    .await;
    within(WAIT, "both tasks at the gate", analyzer.entered(2)).await;

    exec(&client, "SELECT pgtaskd.pause_queue('default')").await;
    // Producers keep enqueueing. The claim that takes the probe (of a queue that is not
    // paused) sees 'three' first in claim order, and must skip it.
    exec(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('three', 'default'), ('probe', 'probe')",
    )
    .await;
    within(WAIT, "the probe at the gate", analyzer.entered(3)).await;
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE payload = 'three' AND status = 'QUEUED'"
        )
        .await,
        1,
        "the paused queue's new task was skipped"
    );
    analyzer.open();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        3,
        "the running tasks to finish",
    )
    .await;

    exec(&client, "SELECT pgtaskd.resume_queue('default')").await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        4,
        "the task enqueued while paused",
    )
    .await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_retry_need_an_operator_or_daemon_role() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    exec(
        &owner,
        "CREATE ROLE producer LOGIN; SELECT pgtaskd.grant_producer('producer');
         CREATE ROLE operator LOGIN; SELECT pgtaskd.grant_operator('operator');
         CREATE ROLE worker LOGIN; SELECT pgtaskd.grant_daemon('worker');",
    )
    .await;
    let as_role = |role: &str| db.url.replace("user=postgres", &format!("user={role}"));

    let producer = connect(&as_role("producer")).await;
    for sql in [
        "SELECT pgtaskd.pause_queue('default')",
        "SELECT pgtaskd.resume_queue('default')",
        "SELECT pgtaskd.retry(1)",
        "INSERT INTO pgtaskd.paused_queues (queue) VALUES ('default')",
    ] {
        let err = producer.batch_execute(sql).await.expect_err(sql);
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {err}"
        );
    }
    let (status, _, stderr) = pgtaskd(Some(&as_role("producer")), &["pause", "default"]).await;
    assert_eq!(
        status.code(),
        Some(78),
        "a role without the right: {stderr}"
    );
    assert!(stderr.contains("permission denied"), "{stderr}");

    for role in ["operator", "worker"] {
        let (status, stdout, stderr) = pgtaskd(Some(&as_role(role)), &["pause", "q"]).await;
        assert!(status.success(), "{role}: {stdout}{stderr}");
        let (status, stdout, stderr) = pgtaskd(Some(&as_role(role)), &["stats", "--json"]).await;
        assert!(status.success(), "{role}: {stdout}{stderr}");
        assert!(stdout.contains("\"paused\": true"), "{stdout}");
        let (status, stdout, stderr) = pgtaskd(Some(&as_role(role)), &["resume", "q"]).await;
        assert!(status.success(), "{role}: {stdout}{stderr}");
        let (status, _, stderr) = pgtaskd(Some(&as_role(role)), &["retry", "1"]).await;
        assert_eq!(status.code(), Some(3), "{role}: {stderr}");
    }
    let operator = connect(&as_role("operator")).await;
    let err = operator
        .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('x')")
        .await
        .expect_err("an operator does not enqueue");
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_pauses_and_resumes_a_queue_and_metrics_show_it_per_queue() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let port = free_port();
    let config = db.config(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n\
         [worker]\nqueues = [\"default\", \"probe\"]\npoll_interval = \"1h\"\n"
    ));
    let daemon = InProcessDaemon::start(&db, config, GatedAnalyzer::counting()).await;
    let http = reqwest::Client::new();
    let post = |path: &str| {
        let request = http.post(format!("http://127.0.0.1:{port}{path}")).send();
        async move {
            let response = within(WAIT, "an HTTP response", request).await.unwrap();
            let status = response.status().as_u16();
            let body: Value = within(WAIT, "an HTTP body", response.json()).await.unwrap();
            (status, body)
        }
    };

    let (status, body) = post("/queues/default/pause").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        serde_json::json!({"queue": "default", "paused": true, "changed": true})
    );
    let (_, body) = post("/queues/default/pause").await;
    assert_eq!(body["changed"], false);
    let (status, body) = post("/queues/a%00b/pause").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post("/queues/with%20space/pause").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["queue"], "with space");

    exec(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('held', 'default'), ('probe', 'probe')",
    )
    .await;
    // The claim that took the probe saw 'held' first in claim order, and skipped it.
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'probe' AND status = 'SUCCEEDED'",
        1,
        "the probe",
    )
    .await;
    let metrics = get_text(&http, port, "/metrics").await;
    for line in [
        "pgtaskd_queue_paused{queue=\"default\"} 1",
        "pgtaskd_queue_paused{queue=\"with space\"} 1",
        "pgtaskd_queue_tasks{queue=\"default\",status=\"QUEUED\"} 1",
        "pgtaskd_queue_due_tasks{queue=\"default\"} 1",
        "pgtaskd_tasks{status=\"QUEUED\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
    let (status, body) = post("/queues/default/resume").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        serde_json::json!({"queue": "default", "paused": false, "changed": true})
    );
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        2,
        "the task of the resumed queue",
    )
    .await;
    let metrics = get_text(&http, port, "/metrics").await;
    for line in [
        "pgtaskd_queue_paused{queue=\"default\"} 0",
        "pgtaskd_queue_tasks{queue=\"default\",status=\"QUEUED\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
    daemon.stop().await;
}

async fn get_text(http: &reqwest::Client, port: u16, path: &str) -> String {
    let request = http.get(format!("http://127.0.0.1:{port}{path}")).send();
    let response = within(WAIT, "an HTTP response", request).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    within(WAIT, "an HTTP body", response.text()).await.unwrap()
}

/// A pause NOTIFYs the queue's name, whose payload must be under 8,000 bytes: names are
/// 1 to 128 bytes, refused with the same words by the CLI (2), the HTTP API (400) and, for
/// every other writer, the table's constraints (23514). Nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_names_over_128_bytes_are_refused_by_the_cli_http_and_the_tables() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let huge = "q".repeat(8000);
    let over = "é".repeat(64) + "q";
    let limit = "q".repeat(128);
    let said = |bytes: usize| format!("the queue name is {bytes} bytes long; the limit is 128");

    for (args, bytes) in [
        (vec!["pause", huge.as_str()], 8000),
        (vec!["resume", over.as_str()], 129),
        (vec!["enqueue", "text", "--queue", over.as_str()], 129),
        (vec!["list", "--queue", over.as_str()], 129),
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &args).await;
        assert_eq!(status.code(), Some(2), "{}: {stderr}", args[0]);
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains(&said(bytes)), "{}: {stderr}", args[0]);
    }
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["pause", &limit]).await;
    assert!(status.success(), "a name of exactly 128 bytes: {stderr}");

    let port = free_port();
    let config = db.config(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n[worker]\npoll_interval = \"1h\"\n"
    ));
    let daemon = InProcessDaemon::start(&db, config, GatedAnalyzer::counting()).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for (request, bytes) in [
        (http.post(format!("{base}/queues/{huge}/pause")), 8000),
        (http.post(format!("{base}/queues/{over}/resume")), 129),
        (
            http.post(format!("{base}/tasks"))
                .header("content-type", "application/json")
                .body(serde_json::json!({"payload": "x", "queue": over}).to_string()),
            129,
        ),
        (http.get(format!("{base}/tasks?queue={over}")), 129),
    ] {
        let response = within(WAIT, "an HTTP response", request.send())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = within(WAIT, "an HTTP body", response.json()).await.unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(body, serde_json::json!({ "error": said(bytes) }));
    }
    daemon.stop().await;

    for sql in [
        format!("INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('x', '{over}')"),
        "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('x', '')".to_string(),
        format!("SELECT pgtaskd.enqueue('x', queue => '{over}')"),
        format!("SELECT pgtaskd.pause_queue('{huge}')"),
    ] {
        let err = within(WAIT, "a refused statement", client.batch_execute(&sql))
            .await
            .expect_err(&sql);
        assert_eq!(err.code(), Some(&SqlState::CHECK_VIOLATION), "{err:?}");
    }
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.paused_queues").await,
        1,
        "only the name of 128 bytes"
    );
}
