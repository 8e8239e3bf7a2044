//! The HTTP API does what the CLI does (docs/http.md): `POST /tasks` with `priority`, `run_at`
//! and `max_attempts` checked by `pgtaskd enqueue`'s rules and with `?wait=`, `POST
//! /tasks/{id}/retry`, `GET /tasks` paged by key, and `pgtaskd probe` for exec probes. Each
//! test runs `pgtaskd run` as a process of its own, with the HTTP server and a bearer token,
//! and sends real requests.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::daemon::pgtaskd;
use crate::support::daemon::tempfile_path::TempPath;
use crate::support::probe::wait_answer;
use crate::support::{count, free_port, within, Cluster, DaemonProcess, TestDb, WAIT};

const TOKEN: &str = "parity-token";

/// A daemon process with HTTP on a free port and a token, and a client that sends the token.
struct Served {
    daemon: DaemonProcess,
    port: u16,
    http: reqwest::Client,
    /// The daemon's configuration, also given to `pgtaskd probe`.
    config: TempPath,
    token: TempPath,
}

impl Served {
    /// Start `pgtaskd run` on `db` with `extra` configuration, and wait until it is ready.
    async fn start(db: &TestDb, extra: &str) -> Served {
        let port = free_port();
        let token = TempPath::write(&format!("{TOKEN}\n"));
        let toml = format!(
            "{extra}\n[http]\nlisten = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n",
            token.path().display()
        );
        let daemon = DaemonProcess::start(db, &toml, &[]);
        let served = Served {
            daemon,
            port,
            http: reqwest::Client::new(),
            config: TempPath::write(&toml),
            token,
        };
        wait_answer(port, "/healthz", StatusCode::OK, "the HTTP listener").await;
        served
    }

    /// Send `method path` with the token and `body` as JSON (when given); the status, the
    /// `Location` header and the body as JSON.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = self
            .http
            .request(method, format!("http://127.0.0.1:{}{path}", self.port))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = within(WAIT, &format!("an answer to {path}"), request.send())
            .await
            .expect("an HTTP answer");
        let status = response.status();
        let location = response
            .headers()
            .get("location")
            .map(|value| value.to_str().unwrap().to_string());
        let text = within(WAIT, "an HTTP body", response.text()).await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, location, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, _, body) = self.send(reqwest::Method::GET, path, None).await;
        (status, body)
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Option<String>, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    /// `pgtaskd probe ARGS --config <this daemon's file>`: (exit code, stderr).
    async fn probe(&self, args: &[&str]) -> (Option<i32>, String) {
        let config = self.config.path().display().to_string();
        let mut all = vec!["probe"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--config", &config]);
        let (status, _, stderr) = pgtaskd(None, &all).await;
        (status.code(), stderr)
    }

    /// Stop the daemon (SIGTERM) and wait for it; the files it was given are kept until the
    /// answer is dropped.
    async fn stop(mut self) -> (TempPath, TempPath) {
        self.daemon.signal(libc::SIGTERM);
        let status = self.daemon.wait().await;
        assert!(status.success(), "{status:?}:\n{}", self.daemon.log_text());
        (self.config, self.token)
    }
}

/// Insert `n` finished rows as the owner, one task a time: `(queue, status)` by turns. Each
/// task is inserted, then its state row (`pgtaskd.task_state`, schema 36) set.
async fn insert_finished(client: &tokio_postgres::Client, n: i64, kinds: &[(&str, &str)]) {
    for chunk in 0..n {
        let (queue, status) = kinds[(chunk % kinds.len() as i64) as usize];
        let id: i64 = within(
            WAIT,
            "a finished row",
            client.query_one(
                "INSERT INTO pgtaskd.tasks (queue, payload)
                 VALUES ($1, 'row ' || $2::bigint || repeat('.', 300))
                 RETURNING id",
                &[&queue, &chunk],
            ),
        )
        .await
        .unwrap()
        .get(0);
        within(
            WAIT,
            "a finished row's state",
            client.execute(
                "UPDATE pgtaskd.task_state
                    SET status = $2, attempt = 1, cancel_requested = $2 = 'CANCELED',
                        error = CASE WHEN $2 = 'FAILED' THEN 'it failed' END,
                        started_at = now(), finished_at = now()
                  WHERE id = $1",
                &[&id, &status],
            ),
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_takes_priority_run_at_and_max_attempts_and_refuses_bad_ones_by_name() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let served = Served::start(&db, "").await;
    let task = json!({"payload": "later", "queue": "parked", "priority": -7,
                      "run_at": "2030-01-02T03:04:05Z", "max_attempts": 5});
    let (status, location, body) = served.post("/tasks", task).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_i64().unwrap();
    assert_eq!(location.as_deref(), Some(format!("/tasks/{id}").as_str()));
    let row = client
        .query_one(
            "SELECT priority, run_at = '2030-01-02T03:04:05Z', max_attempts
               FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i16>(0), -7);
    assert!(row.get::<_, bool>(1), "run_at as sent");
    assert_eq!(row.get::<_, i32>(2), 5);
    // A delay, as `pgtaskd enqueue --run-at 10m` takes it; nulls are the defaults.
    let task = json!({"payload": "in ten minutes", "queue": "parked", "run_at": "10m",
                      "priority": null, "max_attempts": null});
    let (status, _, body) = served.post("/tasks", task).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let row = client
        .query_one(
            "SELECT run_at > now() + interval '9 minutes', priority, max_attempts
               FROM pgtaskd.task_view WHERE id = $1",
            &[&body["id"].as_i64().unwrap()],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "due in ten minutes");
    assert_eq!((row.get::<_, i16>(1), row.get::<_, i32>(2)), (0, 3));
    // A null queue is the default queue, as the other nulls are their defaults.
    let (status, _, body) = served
        .post(
            "/tasks",
            json!({"payload": "queue null", "queue": null, "run_at": "10m"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let queue: String = client
        .query_one(
            "SELECT queue FROM pgtaskd.task_view WHERE id = $1",
            &[&body["id"].as_i64().unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(queue, "default");

    let before = count(&client, "SELECT count(*) FROM pgtaskd.task_view").await;
    for (field, value) in [
        ("priority", json!(40000)),
        ("priority", json!("high")),
        ("priority", json!(1.5)),
        ("max_attempts", json!(0)),
        ("max_attempts", json!(1_u64 << 31)),
        ("run_at", json!("soon")),
        ("run_at", json!("2030-01-02")),
        ("run_at", json!(5)),
    ] {
        let mut task = json!({"payload": "refused", "queue": "parked"});
        task[field] = value.clone();
        let (status, _, body) = served.post("/tasks", task).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}={value}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(field), "{field}={value}: {body}");
    }
    let after = count(&client, "SELECT count(*) FROM pgtaskd.task_view").await;
    assert_eq!(before, after, "a refused task is not inserted");
    let _ = served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_with_wait_answers_the_finished_task_and_refuses_a_bad_wait() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let served = Served::start(&db, "").await;
    let (status, location, task) = served
        .post("/tasks?wait=30s", json!({"payload": "wait for me"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{task}");
    let id = task["id"].as_i64().unwrap();
    assert_eq!(location.as_deref(), Some(format!("/tasks/{id}").as_str()));
    assert_eq!(task["status"], "SUCCEEDED", "{task}");
    assert_eq!(task["words"], 3, "{task}");
    assert_eq!(task["payload"], "wait for me", "the row, as GET answers it");
    let (_, read) = served.get(&format!("/tasks/{id}")).await;
    assert_eq!(read, task, "the same shape as GET /tasks/{{id}}");

    // A queue no daemon serves: the wait ends with the row as it is, 202.
    let (status, _, task) = served
        .post(
            "/tasks?wait=300ms",
            json!({"payload": "nobody", "queue": "parked"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{task}");
    assert_eq!(task["status"], "QUEUED", "{task}");

    let before = count(&client, "SELECT count(*) FROM pgtaskd.task_view").await;
    for wait in ["61s", "2m", "soon", ""] {
        let (status, _, body) = served
            .post(&format!("/tasks?wait={wait}"), json!({"payload": "x"}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "wait={wait}: {body}");
        assert!(body["error"].as_str().unwrap().contains("wait"), "{body}");
    }
    let after = count(&client, "SELECT count(*) FROM pgtaskd.task_view").await;
    assert_eq!(before, after, "nothing inserted for a bad wait");
    let _ = served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_requeues_a_failed_task_refuses_a_queued_one_and_an_unknown_id() {
    let db = TestDb::new().await;
    let client = db.client().await;
    insert_finished(&client, 1, &[("parked", "FAILED")]).await;
    let failed = count(&client, "SELECT max(id) FROM pgtaskd.task_view").await;
    let served = Served::start(&db, "").await;

    let (status, _, body) = served
        .post(&format!("/tasks/{failed}/retry"), json!(null))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"id": failed, "status": "QUEUED", "previous_status": "FAILED"})
    );
    let row = client
        .query_one(
            "SELECT status, attempt, error IS NULL FROM pgtaskd.task_view WHERE id = $1",
            &[&failed],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "QUEUED");
    assert_eq!(row.get::<_, i32>(1), 0, "as new");
    assert!(row.get::<_, bool>(2), "no error");

    // Now QUEUED: refused, as `pgtaskd retry` refuses it (exit 4), and left as it is.
    let (status, _, body) = served
        .post(&format!("/tasks/{failed}/retry"), json!(null))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["status"], "QUEUED", "{body}");
    let (status, _, body) = served.post("/tasks/987654/retry", json!(null)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"], "no such task");
    let (status, _, _) = served.post("/tasks/abc/retry", json!(null)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let _ = served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_stopped_retry_and_list_answer_503_never_404() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    insert_finished(&client, 1, &[("parked", "FAILED")]).await;
    let failed = count(&client, "SELECT max(id) FROM pgtaskd.task_view").await;
    drop(client);
    let served = Served::start(&db, "[database]\nconnect_timeout = \"1s\"\n").await;
    cluster.stop_server(true);
    for id in [failed, 987654] {
        let (status, _, body) = served
            .post(&format!("/tasks/{id}/retry"), json!(null))
            .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{id}: {body}");
        assert_eq!(body["error"], "database unavailable");
    }
    let (status, body) = served.get("/tasks?status=failed").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (code, stderr) = served.probe(&["--ready", "--timeout", "20s"]).await;
    assert_eq!(code, Some(1), "answered, not ready: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("503"), "{stderr}");
    cluster.start_server();
    let _ = served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_tasks_pages_by_key_without_duplicate_or_gap_and_filters() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // 120 rows of each kind, interleaved, so that every filter skips the others' rows.
    insert_finished(
        &client,
        360,
        &[
            ("listed", "SUCCEEDED"),
            ("listed", "FAILED"),
            ("other", "FAILED"),
        ],
    )
    .await;
    let served = Served::start(&db, "").await;
    let expected = |queue: &str, statuses: &str| {
        let client = &client;
        let sql = format!(
            "SELECT id FROM pgtaskd.task_view WHERE queue = '{queue}' AND status IN ({statuses})
              ORDER BY id DESC"
        );
        async move {
            let rows = client.query(&sql, &[]).await.unwrap();
            rows.iter().map(|row| row.get(0)).collect::<Vec<i64>>()
        }
    };
    let three_pages = [50, 50, 20];
    for (filter, want, sizes) in [
        (
            "queue=listed&status=succeeded",
            expected("listed", "'SUCCEEDED'").await,
            &three_pages[..],
        ),
        (
            "status=Failed&queue=other",
            expected("other", "'FAILED'").await,
            &three_pages[..],
        ),
        (
            "queue=listed&status=FAILED",
            expected("listed", "'FAILED'").await,
            &three_pages[..],
        ),
        // A queue alone is read one branch per status, merged: still one order.
        (
            "queue=listed",
            expected("listed", "'SUCCEEDED', 'FAILED'").await,
            &[50, 50, 50, 50, 40][..],
        ),
    ] {
        let mut seen = Vec::new();
        let mut pages = Vec::new();
        let mut after: Option<i64> = None;
        loop {
            let cursor = after.map_or_else(String::new, |id| format!("&after={id}"));
            let (status, page) = served
                .get(&format!("/tasks?{filter}&limit=50{cursor}"))
                .await;
            assert_eq!(status, StatusCode::OK, "{filter}: {page}");
            let tasks = page["tasks"].as_array().expect("tasks");
            pages.push(tasks.len());
            for task in tasks {
                assert!(task.get("payload").is_none(), "no payload: {task}");
                let preview = task["payload_preview"].as_str().unwrap();
                assert!(preview.starts_with("row ") && preview.chars().count() == 200);
                assert!(task["payload_bytes"].as_i64().unwrap() > 300, "{task}");
                seen.push(task["id"].as_i64().unwrap());
            }
            match page["next"].as_i64() {
                Some(next) => after = Some(next),
                None => {
                    assert!(page["next"].is_null(), "{page}");
                    break;
                }
            }
            assert!(pages.len() < 10, "{filter}: no end in sight");
        }
        assert_eq!(pages, sizes, "{filter}");
        assert_eq!(seen, want, "{filter}: every row once, newest first");
    }
    let (status, page) = served.get("/tasks").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["tasks"].as_array().unwrap().len(), 50, "50 by default");
    for (bad, field) in [
        ("status=done", "status"),
        ("limit=501", "limit"),
        ("limit=0", "limit"),
        ("after=x", "after"),
    ] {
        let (status, body) = served.get(&format!("/tasks?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body["error"].as_str().unwrap().contains(field), "{body}");
    }
    let _ = served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_exits_0_with_a_token_and_non_zero_when_refused_or_down() {
    let db = TestDb::new().await;
    let served = Served::start(&db, "").await;
    let (code, stderr) = served.probe(&[]).await;
    assert_eq!(code, Some(0), "{stderr}");
    wait_answer(served.port, "/healthz", StatusCode::OK, "liveness").await;
    // Ready once started and listening: poll the probe itself.
    crate::support::eventually(WAIT, "probe --ready to pass", || async {
        (served.probe(&["--ready"]).await.0 == Some(0)).then_some(())
    })
    .await;

    // The token is what makes /readyz answer: a wrong one is refused, in one line.
    let wrong_token = TempPath::write("not-the-token\n");
    let wrong = TempPath::write(&format!(
        "[http]\nlisten = \"127.0.0.1:{}\"\ntoken_file = \"{}\"\n",
        served.port,
        wrong_token.path().display()
    ));
    let config = wrong.path().display().to_string();
    let (status, _, stderr) = pgtaskd(None, &["probe", "--ready", "--config", &config]).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("401"), "{stderr}");

    let port = served.port;
    let (config, _token) = served.stop().await;
    let path = config.path().display().to_string();
    let (status, _, stderr) = pgtaskd(None, &["probe", "--config", &path]).await;
    assert_eq!(
        status.code(),
        Some(69),
        "nothing listens on {port}: {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(&port.to_string()), "{stderr}");
}
