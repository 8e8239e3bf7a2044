//! Operators steering and reading their queues: pause and resume (SQL, CLI, HTTP), retry,
//! list and stats, and who may do what.

use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::support::daemon::{pgtaskd, wait_listening};
use crate::support::{
    connect, count, free_port, wait_count, within, Cluster, DaemonProcess, GatedAnalyzer,
    InProcessDaemon, TestDb, WAIT,
};

async fn exec(client: &Client, sql: &str) {
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE queue = 'default' AND status = 'SUCCEEDED'",
        3,
        "the tasks of the queue that is not paused",
    )
    .await;
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.tasks WHERE queue = 'slow' AND status = 'QUEUED' AND attempt = 0"
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE queue = 'slow' AND status = 'SUCCEEDED'",
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
            "SELECT count(*) FROM pgtaskd.tasks WHERE payload = 'three' AND status = 'QUEUED'"
        )
        .await,
        1,
        "the paused queue's new task was skipped"
    );
    analyzer.open();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
        3,
        "the running tasks to finish",
    )
    .await;

    exec(&client, "SELECT pgtaskd.resume_queue('default')").await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
        4,
        "the task enqueued while paused",
    )
    .await;
    daemon.stop().await;
}

/// Rows in each state, written as the owner: (FAILED, CANCELED, QUEUED, RUNNING, SUCCEEDED).
async fn one_task_per_state(client: &Client) -> [i64; 5] {
    let rows = within(
        WAIT,
        "the rows",
        client.query(
            "INSERT INTO pgtaskd.tasks (payload, status, attempt, cancel_requested, words, bytes,
                                        runes, error, lease_owner, lease_expires_at, started_at,
                                        finished_at)
             VALUES ('f', 'FAILED', 3, false, 0, 0, 0, 'lease lost 3 times', NULL, NULL, now(), now()),
                    ('c', 'CANCELED', 1, true, 0, 0, 0, NULL, NULL, NULL, now(), now()),
                    ('q', 'QUEUED', 0, false, 0, 0, 0, NULL, NULL, NULL, NULL, NULL),
                    ('r', 'RUNNING', 1, false, 0, 0, 0, NULL, 'someone', now() + interval '1h', now(), NULL),
                    ('s', 'SUCCEEDED', 1, false, 1, 1, 1, NULL, NULL, NULL, now(), now())
             RETURNING id",
            &[],
        ),
    )
    .await
    .unwrap();
    let ids: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    ids.try_into().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_puts_failed_and_canceled_tasks_back_as_new_and_refuses_the_rest() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let [failed, canceled, queued, running, succeeded] = one_task_per_state(&client).await;

    for (id, was) in [(failed, "FAILED"), (canceled, "CANCELED")] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["retry", &id.to_string()]).await;
        assert!(status.success(), "{stdout}{stderr}");
        assert_eq!(stdout.trim(), format!("QUEUED (was {was})"));
        let row = client
            .query_one(
                "SELECT status, attempt, cancel_requested, error, started_at IS NULL,
                        finished_at IS NULL, run_at <= now()
                   FROM pgtaskd.tasks WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), "QUEUED");
        assert_eq!(row.get::<_, i32>(1), 0, "attempt is reset");
        assert!(!row.get::<_, bool>(2), "no cancel request");
        assert_eq!(row.get::<_, Option<&str>>(3), None, "no error");
        assert!(
            row.get::<_, bool>(4) && row.get::<_, bool>(5),
            "no start or finish"
        );
        assert!(row.get::<_, bool>(6), "due now");
    }
    for (id, what) in [
        (queued, "QUEUED"),
        (running, "RUNNING"),
        (succeeded, "SUCCEEDED"),
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["retry", &id.to_string()]).await;
        assert_eq!(status.code(), Some(4), "{what}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains(what), "{stderr}");
    }
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["retry", "999999"]).await;
    assert_eq!(status.code(), Some(3), "{stderr}");
    let running_row: (String, i32) = client
        .query_one(
            "SELECT status, attempt FROM pgtaskd.tasks WHERE id = $1",
            &[&running],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(
        running_row,
        ("RUNNING".to_string(), 1),
        "a refused retry changes nothing"
    );

    // The retried tasks run again.
    let daemon = InProcessDaemon::start(&db, db.config(""), GatedAnalyzer::counting()).await;
    wait_count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.tasks WHERE id IN ({failed}, {canceled}) \
               AND status = 'SUCCEEDED' AND attempt = 1"
        ),
        2,
        "the retried tasks",
    )
    .await;
    daemon.stop().await;
}

/// `pgtaskd ARGS --json`, one object per line.
async fn json_lines(url: &str, args: &[&str]) -> Vec<Value> {
    let (status, stdout, stderr) = pgtaskd(Some(url), args).await;
    assert!(status.success(), "{args:?}: {stderr}");
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn ids(rows: &[Value]) -> Vec<i64> {
    rows.iter().map(|row| row["id"].as_i64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_the_latest_tasks_newest_first_with_its_filters() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let [failed, canceled, queued, running, succeeded] = one_task_per_state(&client).await;
    let other: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('elsewhere', 'other') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    let all = json_lines(&db.url, &["list", "--json"]).await;
    assert_eq!(
        ids(&all),
        vec![other, succeeded, running, queued, canceled, failed]
    );
    assert_eq!(all[0]["queue"], "other");
    assert_eq!(all[0]["payload_bytes"], 9);
    assert!(all[0].get("payload").is_none(), "payloads are not listed");
    assert_eq!(all[5]["error"], "lease lost 3 times");

    let limited = json_lines(&db.url, &["list", "--json", "--limit", "2"]).await;
    assert_eq!(ids(&limited), vec![other, succeeded]);
    let default_queue = json_lines(&db.url, &["list", "--json", "--queue", "default"]).await;
    assert_eq!(ids(&default_queue).len(), 5);
    assert!(!ids(&default_queue).contains(&other));
    let failed_only = json_lines(&db.url, &["list", "--json", "--status", "failed"]).await;
    assert_eq!(ids(&failed_only), vec![failed]);
    let queued_other = json_lines(
        &db.url,
        &["list", "--json", "--status", "QUEUED", "--queue", "other"],
    )
    .await;
    assert_eq!(ids(&queued_other), vec![other]);
    let none = json_lines(&db.url, &["list", "--json", "--queue", "nowhere"]).await;
    assert!(none.is_empty());

    let (status, stdout, _) = pgtaskd(Some(&db.url), &["list"]).await;
    assert!(status.success());
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 7, "a header and six tasks: {stdout}");
    assert!(lines[0].contains("STATUS"), "{stdout}");
    assert!(
        lines[2].contains("SUCCEEDED") && lines[2].contains("words=1"),
        "{stdout}"
    );

    let (status, _, stderr) = pgtaskd(Some(&db.url), &["list", "--status", "done"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["list", "--limit", "0"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_counts_each_queue_from_a_known_table_and_names_the_daemons() {
    let db = TestDb::new().await;
    let client = db.client().await;
    exec(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue, run_at, created_at)
              VALUES ('due', 'a', now() - interval '90 seconds', now() - interval '2 minutes'),
                     ('due', 'a', now(), now()),
                     ('later', 'a', now() + interval '1 hour', now());
         INSERT INTO pgtaskd.tasks (payload, queue, status, attempt, lease_owner,
                                    lease_expires_at, started_at)
              VALUES ('r', 'a', 'RUNNING', 1, 'x', now() + interval '1h', now());
         INSERT INTO pgtaskd.tasks (payload, queue, status, attempt, words, bytes, runes, error,
                                    cancel_requested, finished_at)
              VALUES ('s', 'a', 'SUCCEEDED', 1, 1, 1, 1, NULL, false, now() - interval '30 seconds'),
                     ('s', 'a', 'SUCCEEDED', 1, 1, 1, 1, NULL, false, now() - interval '10 minutes'),
                     ('f', 'a', 'FAILED', 3, 0, 0, 0, 'e', false, now() - interval '10 minutes'),
                     ('c', 'a', 'CANCELED', 0, 0, 0, 0, NULL, true, now() - interval '20 seconds'),
                     ('old', 'a', 'SUCCEEDED', 1, 1, 1, 1, NULL, false, now() - interval '2 hours'),
                     ('old', 'gone', 'FAILED', 1, 0, 0, 0, 'e', false, now() - interval '2 hours');
         SELECT pgtaskd.pause_queue('b');",
    )
    .await;

    let stats = stats_json(&db.url).await;
    let queues = stats["queues"].as_array().unwrap();
    assert_eq!(
        queues
            .iter()
            .map(|q| q["queue"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["a", "b"],
        "a queue with only old finished rows is not shown"
    );
    let a = &queues[0];
    assert_eq!(a["paused"], false);
    assert_eq!(a["queued"], 3);
    assert_eq!(a["due"], 2);
    let age = a["oldest_due_age_s"].as_f64().unwrap();
    assert!((90.0..120.0).contains(&age), "{age}");
    assert_eq!(a["running"], 1);
    assert_eq!(
        a["finished_last_minute"],
        serde_json::json!({"succeeded": 1, "failed": 0, "canceled": 1})
    );
    assert_eq!(
        a["finished_last_hour"],
        serde_json::json!({"succeeded": 2, "failed": 1, "canceled": 1})
    );
    let b = &queues[1];
    assert_eq!(b["paused"], true);
    assert!(b["paused_at"].is_string());
    assert_eq!(b["queued"], 0);
    assert_eq!(b["oldest_due_age_s"], Value::Null);
    assert_eq!(stats["daemons"], serde_json::json!([]));

    // A daemon serving another queue leaves these figures alone and is named.
    let config = db.config("[worker]\nqueues = [\"elsewhere\"]\n");
    let daemon = InProcessDaemon::start(&db, config, GatedAnalyzer::counting()).await;
    let stats = stats_json(&db.url).await;
    let daemons = stats["daemons"].as_array().unwrap();
    assert_eq!(daemons.len(), 1, "{stats}");
    assert!(daemons[0]["sessions"].as_i64().unwrap() >= 1);
    assert!(daemons[0]["instance"].as_str().unwrap().contains(':'));

    let (status, stdout, _) = pgtaskd(Some(&db.url), &["stats"]).await;
    assert!(status.success());
    assert!(stdout.contains("paused"), "{stdout}");
    assert!(stdout.contains("daemons: 1"), "{stdout}");
    daemon.stop().await;
}

/// `pgtaskd stats --json`: one pretty-printed object.
async fn stats_json(url: &str) -> Value {
    let (status, stdout, stderr) = pgtaskd(Some(url), &["stats", "--json"]).await;
    assert!(status.success(), "{stderr}");
    serde_json::from_str(&stdout).unwrap()
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
    assert_eq!(status.code(), Some(1), "{stderr}");
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE queue = 'probe' AND status = 'SUCCEEDED'",
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
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
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
        0
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.paused_queues").await,
        1,
        "only the name of 128 bytes"
    );
}

/// A queue name with an escape sequence (any producer may choose one) is shown escaped by
/// `list`, `stats` and `status`, so that it cannot drive the operator's terminal; the JSON
/// forms keep it exact.
#[tokio::test]
async fn list_stats_and_status_show_control_characters_of_a_queue_name_escaped() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let name = "evil\u{1b}[2J\u{7}";
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('x', $1) RETURNING id",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    for args in [&["list"][..], &["stats"], &["status", &id.to_string()]] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), args).await;
        assert!(status.success(), "{args:?}: {stderr}");
        assert!(
            !stdout.contains(|c: char| c.is_control() && c != '\n'),
            "{args:?}: {stdout:?}"
        );
        assert!(
            stdout.contains("evil\\u{1b}[2J\\u{7}"),
            "{args:?}: {stdout}"
        );
    }
    let rows = json_lines(&db.url, &["list", "--json"]).await;
    assert_eq!(rows[0]["queue"], name);
    assert_eq!(stats_json(&db.url).await["queues"][0]["queue"], name);
}
