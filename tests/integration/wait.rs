//! Completion notifications and waiting: `NOTIFY pgtaskd_done` from every commit that ends
//! tasks, `pgtaskd wait` and `enqueue --wait` with their exit codes, and `GET /tasks/{id}?wait=`
//! served from the daemon's one LISTEN session. Notifications are hints: a waiter whose
//! notification is lost still returns, on its poll tick.

use std::time::{Duration, Instant};

use pgtaskd::db::listen::{forward_messages, DONE_CHANNEL};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use crate::support::daemon::{pgtaskd, tempfile_path::TempPath};
use crate::support::{
    count, enqueue, eventually, free_port, nowhere, within, Cluster, GatedAnalyzer,
    InProcessDaemon, TestDb, WAIT,
};

/// A session of the test's own that LISTENs on `pgtaskd_done`, and its notifications.
async fn listening(db: &TestDb) -> (Client, mpsc::Receiver<AsyncMessage>, impl Drop) {
    let (client, connection) = within(
        WAIT,
        "a connection",
        tokio_postgres::connect(&db.url, NoTls),
    )
    .await
    .unwrap();
    let (messages, guard) = forward_messages(connection);
    client
        .batch_execute(&format!("LISTEN {DONE_CHANNEL}"))
        .await
        .unwrap();
    (client, messages, guard)
}

/// The ids of the next `pgtaskd_done` notification.
async fn next_done(messages: &mut mpsc::Receiver<AsyncMessage>) -> (Vec<i64>, usize) {
    loop {
        match within(WAIT, "a pgtaskd_done notification", messages.recv()).await {
            Some(AsyncMessage::Notification(n)) if n.channel() == DONE_CHANNEL => {
                let ids = pgtaskd::queue::wait::done_ids(n.payload()).collect();
                return (ids, n.payload().len());
            }
            Some(_) => {}
            None => panic!("the listening session closed"),
        }
    }
}

/// Claim every QUEUED task as `me` (attempt 1), as a daemon would.
async fn claim_all(client: &Client) {
    client
        .batch_execute(
            "SELECT * FROM pgtaskd.claim(ARRAY['default'], 1000, 'me', 600000, 1000000000, true, NULL, NULL, NULL)",
        )
        .await
        .unwrap();
}

/// Finish `ids` (claimed by `me`) SUCCEEDED with zero counts.
async fn finish(client: &Client, ids: &[i64]) {
    let n = ids.len();
    client
        .execute(
            "SELECT * FROM pgtaskd.finish(
                 ARRAY(SELECT t.claim_token FROM unnest($1::int8[]) WITH ORDINALITY AS i(id, n)
                         JOIN pgtaskd.task_view AS t ON t.id = i.id ORDER BY i.n),
                 $1, $2, $3, $3, $3, $4, $4, $5, false)",
            &[
                &ids,
                &vec!["SUCCEEDED"; n],
                &vec![0i64; n],
                &vec![None::<&str>; n],
                &vec![None::<f64>; n],
            ],
        )
        .await
        .unwrap();
}

/// Completions notifications no longer sent: what a lost notification looks like to waiters.
async fn silence_completions(client: &Client) {
    client
        .batch_execute(
            "CREATE OR REPLACE FUNCTION pgtaskd.notify_done(ids bigint[]) RETURNS void
             LANGUAGE sql AS ''",
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_batched_finish_sends_one_notification_with_its_ids_and_a_rolled_back_one_none() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (_listener, mut messages, _guard) = listening(&db).await;
    let ids: Vec<i64> = client
        .query(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'p' || i FROM generate_series(1, 5) i RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    claim_all(&client).await;

    // Rolled back: nothing is announced.
    client.batch_execute("BEGIN").await.unwrap();
    finish(&client, &ids[..2]).await;
    client.batch_execute("ROLLBACK").await.unwrap();

    finish(&client, &ids).await;
    let (got, _) = next_done(&mut messages).await;
    assert_eq!(got, ids, "one notification, every id, in the same order");

    // A cancel of a QUEUED task announces it too; the rescuer's FAILED as well.
    let queued = enqueue(&client, "cancel me").await;
    client
        .execute("SELECT pgtaskd.cancel($1)", &[&queued])
        .await
        .unwrap();
    assert_eq!(next_done(&mut messages).await.0, vec![queued]);
    let lost = enqueue(&client, "lease lost").await;
    client
        .batch_execute(
            "UPDATE pgtaskd.tasks SET max_attempts = 1 WHERE payload = 'lease lost';
             SELECT * FROM pgtaskd.claim(ARRAY['default'], 10, 'gone', 1, 1000000, true, NULL, NULL, NULL);",
        )
        .await
        .unwrap();
    eventually(WAIT, "the lease to expire", || async {
        let rescued = pgtaskd::queue::rescue(&client, 10, "rescuer")
            .await
            .unwrap();
        (!rescued.is_empty()).then_some(())
    })
    .await;
    assert_eq!(next_done(&mut messages).await.0, vec![lost]);
}

#[tokio::test]
async fn ids_over_the_payload_limit_are_split_into_notifications_under_8000_bytes() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (_listener, mut messages, _guard) = listening(&db).await;
    let ids: Vec<i64> = (0..3000).map(|i| 1_000_000_000_000_000 + i).collect();
    client
        .execute("SELECT pgtaskd.notify_done($1)", &[&ids])
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < ids.len() {
        let (got, len) = next_done(&mut messages).await;
        assert!(len < 8000, "a payload of {len} bytes");
        seen.extend(got);
    }
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn wait_exits_0_1_3_75_and_69_for_a_task_that_finished_before_it_started() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let succeeded = enqueue(&client, "done before the wait").await;
    claim_all(&client).await;
    finish(&client, &[succeeded]).await;
    let canceled = enqueue(&client, "canceled").await;
    client
        .execute("SELECT pgtaskd.cancel($1)", &[&canceled])
        .await
        .unwrap();
    let queued = enqueue(&client, "nobody runs me").await;
    let (s, c, q) = (
        succeeded.to_string(),
        canceled.to_string(),
        queued.to_string(),
    );

    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["wait", &s]).await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stdout.starts_with(&format!("task {s}: SUCCEEDED")),
        "{stdout}"
    );

    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["wait", &s, &c, "--json"]).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!(rows[1]["status"], "CANCELED");
    assert!(stderr.contains("1 of 2 tasks did not succeed"), "{stderr}");

    let (status, _, stderr) = pgtaskd(Some(&db.url), &["wait", &s, "987654"]).await;
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("no such task: 987654"), "{stderr}");

    let started = Instant::now();
    let (status, stdout, stderr) =
        pgtaskd(Some(&db.url), &["wait", &q, "--timeout", "300ms"]).await;
    assert_eq!(status.code(), Some(75), "{stderr}");
    assert!(stdout.contains("QUEUED"), "{stdout}");
    assert!(started.elapsed() < Duration::from_secs(20));

    let (status, stdout, stderr) = pgtaskd(Some(&nowhere()), &["wait", "1"]).await;
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert!(stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_waiter_whose_notification_is_lost_returns_on_its_poll_tick() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = enqueue(&client, "finished silently").await;
    claim_all(&client).await;
    silence_completions(&client).await;
    let config = TempPath::write("[worker]\npoll_interval = \"300ms\"\n");
    let config_path = config.path().to_string_lossy().to_string();
    let url = db.url.clone();
    let waiter = tokio::spawn(async move {
        pgtaskd(
            Some(&url),
            &["wait", &id.to_string(), "--config", &config_path],
        )
        .await
    });
    // Finish only once the waiter has read the row (RUNNING) and waits.
    eventually(WAIT, "the waiter's first read", || async {
        let n = count(
            &client,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
               AND application_name LIKE 'pgtaskd/%' AND query LIKE '%WITH ORDINALITY%'",
        )
        .await;
        (n > 0).then_some(())
    })
    .await;
    finish(&client, &[id]).await;
    let (status, stdout, stderr) = within(WAIT, "the waiter", waiter).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("SUCCEEDED"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_wait_returns_the_finished_row_with_the_options_stored() {
    let db = TestDb::new().await;
    let daemon = InProcessDaemon::start(&db, db.config(""), GatedAnalyzer::counting()).await;
    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &[
            "enqueue",
            "two words",
            "--priority",
            "-2",
            "--max-attempts",
            "7",
            "--wait",
            "--timeout",
            "50s",
            "--json",
        ],
    )
    .await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    let row: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(row["status"], "SUCCEEDED");
    assert_eq!(row["words"], 2);
    assert_eq!(row["priority"], -2);
    assert_eq!(row["max_attempts"], 7);
    daemon.stop().await;

    let (status, stdout, stderr) =
        pgtaskd(Some(&db.url), &["enqueue", "later", "--run-at", "10m"]).await;
    assert!(status.success(), "{stderr}");
    let id: i64 = stdout.trim().parse().unwrap();
    let client = db.client().await;
    let delay: f64 = client
        .query_one(
            "SELECT extract(epoch FROM run_at - created_at)::float8 FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!((599.0..=601.0).contains(&delay), "{delay}");
    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &["enqueue", "at a time", "--run-at", "2030-01-02T03:04:05Z"],
    )
    .await;
    assert!(status.success(), "{stderr}");
    let id: i64 = stdout.trim().parse().unwrap();
    let at: String = client
        .query_one(
            "SELECT to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(at, "2030-01-02 03:04:05");
    let (status, _, _) = pgtaskd(Some(&db.url), &["enqueue", "x", "--run-at", "soon"]).await;
    assert_eq!(status.code(), Some(2));
}

async fn get_json(client: &reqwest::Client, url: &str) -> (reqwest::StatusCode, serde_json::Value) {
    let response = within(WAIT + WAIT, "an HTTP answer", client.get(url).send())
        .await
        .expect("HTTP request");
    let status = response.status();
    let body = within(WAIT, "an HTTP body", response.json()).await.unwrap();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_waiter_whose_notification_is_lost_returns_on_the_poll_tick_and_bad_waits_are_400()
{
    let db = TestDb::new().await;
    let port = free_port();
    let config = db.config(&format!(
        "[worker]\npoll_interval = \"300ms\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    let analyzer = GatedAnalyzer::closed();
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;
    let client = db.client().await;
    silence_completions(&client).await;
    let id = enqueue(&client, "held").await;
    analyzer.entered(1).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for wait in ["61s", "2m", "soon"] {
        let (status, body) = get_json(&http, &format!("{base}/tasks/{id}?wait={wait}")).await;
        assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{wait}: {body}");
        assert!(body["error"].is_string());
    }
    let (status, body) = get_json(&http, &format!("{base}/tasks/987654?wait=5s")).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "{body}");
    // At the end of a short wait: the row as it is.
    let (status, body) = get_json(&http, &format!("{base}/tasks/{id}?wait=200ms")).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(body["status"], "RUNNING");

    let started = Instant::now();
    let waiter = tokio::spawn({
        let url = format!("{base}/tasks/{id}?wait=59s");
        async move { get_json(&reqwest::Client::new(), &url).await }
    });
    analyzer.open();
    let (status, body) = within(WAIT, "the waiter", waiter).await.unwrap();
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(body["status"], "SUCCEEDED", "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "answered by the poll tick, not the end of the wait"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_http_waiters_are_all_answered_without_growing_the_pool() {
    const WAITERS: usize = 1000;
    const POOL: i64 = 4;
    let db = TestDb::new().await;
    let port = free_port();
    // A poll tick longer than the test: the notification is what answers them.
    let config = db.config(&format!(
        "[database]\npool_size = {POOL}\n[worker]\npoll_interval = \"5m\"\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\nmax_connections = 2000\n"
    ));
    let analyzer = GatedAnalyzer::closed();
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;
    let client = db.client().await;
    let id = enqueue(&client, "awaited by a thousand").await;
    analyzer.entered(1).await;

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/tasks/{id}?wait=50s");
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move { get_json(&http, &url).await })
        })
        .collect();
    let sessions = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                      AND application_name LIKE 'pgtaskd/%'";
    // While they wait, the daemon holds its pool and its listener, nothing more.
    let mut most = 0;
    for _ in 0..10 {
        most = most.max(count(&client, sessions).await);
    }
    analyzer.open();
    let started = Instant::now();
    for waiter in waiters {
        let (status, body) = within(WAIT, "a waiter", waiter).await.unwrap();
        assert_eq!(status, reqwest::StatusCode::OK, "{body}");
        assert_eq!(body["status"], "SUCCEEDED", "{body}");
    }
    most = most.max(count(&client, sessions).await);
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "answered at the notification, not at the end of their wait"
    );
    assert!(
        most <= POOL + 1,
        "{most} daemon sessions for a pool of {POOL}"
    );
    daemon.stop().await;
}

/// Unavailable is not absent, and not late either: `GET /tasks/{id}?wait=60s` of a task no
/// daemon serves, with the database stopped a moment into the wait, is answered 503 once the
/// daemon's listener has lost the database (checked every 5 s), not at the end of the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_wait_through_an_outage_is_answered_503_before_its_end() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let (daemon, port) = crate::http_limits::daemon_with_http(&db, "").await;
    let client = db.client().await;
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('x', 'elsewhere') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    drop(client);
    let started = Instant::now();
    let waiting = tokio::spawn(
        reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/tasks/{id}?wait=60s"))
            .send(),
    );
    // Not a synchronization: the request is most likely in its wait by then, and either way
    // it must be answered 503 well before its 60 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.stop_server(true);
    let response = within(Duration::from_secs(30), "the wait's answer", waiting)
        .await
        .unwrap()
        .expect("an answer");
    assert_eq!(response.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(30));
    cluster.start_server();
    daemon.stop().await;
}
