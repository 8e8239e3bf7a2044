//! Batches from the command line and over HTTP (docs/dependencies.md, "Batches";
//! docs/cli.md; docs/http.md): `pgtaskd batch open|seal|status` and `enqueue --batch`
//! through the real binary, and `POST /batches`, `POST /batches/{id}/seal`, `GET
//! /batches/{id}` and `POST /tasks` with `batch_id` from a `pgtaskd run` process with a
//! bearer token. The members go to a queue no daemon serves, so that they stay QUEUED and
//! the batch sealed, not ended, whatever the machine's speed.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::daemon::pgtaskd;
use crate::support::daemon::tempfile_path::TempPath;
use crate::support::probe::wait_answer;
use crate::support::{count, free_port, nowhere, within, DaemonProcess, TestDb, WAIT};

/// A queue no daemon of these tests serves.
const UNSERVED: &str = "batch-members";

/// `pgtaskd ARGS` on `db`: (exit code, stdout, stderr).
async fn run(db: &TestDb, args: &[&str]) -> (Option<i32>, String, String) {
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), args).await;
    (status.code(), stdout, stderr)
}

#[tokio::test]
async fn a_batch_opened_from_the_cli_takes_three_members_and_is_sealed_with_their_counts() {
    let db = TestDb::new().await;
    let client = db.client().await;

    let (code, stdout, stderr) = run(
        &db,
        &[
            "batch",
            "open",
            "--callback-queue",
            "reports",
            "--on",
            "success",
            "all done",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    // The id alone, as `enqueue` prints a task's.
    let batch: i64 = stdout
        .trim_end_matches('\n')
        .parse()
        .unwrap_or_else(|_| panic!("batch open prints the id alone: {stdout:?}"));
    let batch_arg = batch.to_string();

    let mut members = Vec::new();
    for payload in ["one", "two", "three"] {
        let (code, stdout, stderr) = run(
            &db,
            &[
                "enqueue", "--queue", UNSERVED, "--batch", &batch_arg, payload,
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{stderr}");
        members.push(stdout.trim().parse::<i64>().expect("enqueue prints the id"));
    }
    let in_batch = count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE batch_id = {batch}"),
    )
    .await;
    assert_eq!(in_batch, 3, "each enqueue --batch made a member");
    let (code, stdout, stderr) = run(&db, &["status", &members[0].to_string()]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!("\n  batch: {batch}\n")),
        "{stdout}"
    );

    let (code, stdout, stderr) = run(&db, &["batch", "status", &batch_arg]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with(&format!("batch {batch}: open\n")),
        "{stdout}"
    );
    assert!(stdout.contains("  members: 3 (QUEUED 3)\n"), "{stdout}");
    assert!(stdout.contains("WAITING  runs on: success"), "{stdout}");

    let (code, stdout, stderr) = run(&db, &["batch", "seal", &batch_arg]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "sealed\n", "its members have not ended");

    let (code, stdout, stderr) = run(&db, &["batch", "status", &batch_arg, "--json"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout}");
    let status: Value = serde_json::from_str(&stdout).expect("batch status --json prints JSON");
    let callback: i64 = client
        .query_one(
            "SELECT callback FROM pgtaskd.batches WHERE id = $1",
            &[&batch],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status["id"], batch);
    assert_eq!(status["state"], "sealed");
    assert_eq!(status["on"], "success");
    assert_eq!(status["callback_id"], callback);
    assert_eq!(status["callback_status"], "WAITING");
    assert_eq!(
        status["members"],
        json!({"WAITING": 0, "QUEUED": 3, "RUNNING": 0, "SUCCEEDED": 0, "FAILED": 0,
               "CANCELED": 0})
    );
    assert!(status["sealed_at"].is_string(), "{status}");
    assert_eq!(status["ended_at"], Value::Null);
    assert_eq!(status["succeeded"], Value::Null, "counted only at the end");

    // Sealed: no member can join, and the refusal says why, naming the batch.
    let (code, stdout, stderr) = run(
        &db,
        &[
            "enqueue", "--queue", UNSERVED, "--batch", &batch_arg, "late",
        ],
    )
    .await;
    assert_eq!(code, Some(4), "refused for the batch's state: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(&format!("batch {batch} is sealed: no task can join it")),
        "{stderr}"
    );
    let tasks = count(&client, "SELECT count(*) FROM pgtaskd.task_view").await;
    assert_eq!(tasks, 4, "the callback and three members; nothing inserted");

    // Sealing again changes nothing.
    let (code, stdout, _) = run(&db, &["batch", "seal", &batch_arg]).await;
    assert_eq!((code, stdout.as_str()), (Some(0), "sealed\n"));
}

#[tokio::test]
async fn an_unknown_batch_is_exit_3_a_bad_on_a_usage_error_and_an_outage_69() {
    let db = TestDb::new().await;
    for args in [
        &["batch", "status", "424242"][..],
        &["batch", "status", "424242", "--json"],
        &["batch", "seal", "424242"],
    ] {
        let (code, stdout, stderr) = run(&db, args).await;
        assert_eq!(code, Some(3), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains("no such batch: 424242"), "{stderr}");
    }
    let (code, stdout, stderr) = run(&db, &["enqueue", "--batch", "424242", "x"]).await;
    assert_eq!(code, Some(3), "an unknown id: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("batch 424242 does not exist"), "{stderr}");
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0,
        "nothing inserted"
    );

    let (code, _, stderr) = run(&db, &["batch", "open", "--on", "maybe", "x"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("'maybe'") && stderr.contains("success") && stderr.contains("finish"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&db, &["batch", "open", "x"]).await;
    assert_eq!(code, Some(2), "--on is required: {stderr}");
    assert!(stderr.contains("--on"), "{stderr}");

    for args in [
        &["batch", "status", "1"][..],
        &["batch", "seal", "1"],
        &["batch", "open", "--on", "finish", "x"],
    ] {
        let (status, _, stderr) = pgtaskd(Some(&nowhere()), args).await;
        assert_eq!(
            status.code(),
            Some(69),
            "{args:?}: unavailable, never 3: {stderr}"
        );
    }
}

const TOKEN: &str = "batch-token";

/// `pgtaskd run` with HTTP on a free port and a token, serving the default queue only.
struct Served {
    daemon: DaemonProcess,
    port: u16,
    http: reqwest::Client,
    _token: TempPath,
}

impl Served {
    async fn start(db: &TestDb) -> Served {
        let port = free_port();
        let token = TempPath::write(&format!("{TOKEN}\n"));
        let toml = format!(
            "[http]\nlisten = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n",
            token.path().display()
        );
        let daemon = DaemonProcess::start(db, &toml, &[]);
        wait_answer(port, "/healthz", StatusCode::OK, "the HTTP listener").await;
        Served {
            daemon,
            port,
            http: reqwest::Client::new(),
            _token: token,
        }
    }

    /// `method path` with `body` as JSON (when given) and the token unless `anonymous`:
    /// the status, the `Location` header and the body as JSON.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        anonymous: bool,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = self
            .http
            .request(method, format!("http://127.0.0.1:{}{path}", self.port));
        if !anonymous {
            request = request.bearer_auth(TOKEN);
        }
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

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let (status, _, body) = self
            .send(reqwest::Method::POST, path, Some(body), false)
            .await;
        (status, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, _, body) = self.send(reqwest::Method::GET, path, None, false).await;
        (status, body)
    }

    async fn stop(mut self) {
        self.daemon.signal(libc::SIGTERM);
        let status = self.daemon.wait().await;
        assert!(status.success(), "{status:?}:\n{}", self.daemon.log_text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_http_open_take_members_seal_and_answer_404_and_422() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let served = Served::start(&db).await;

    // Behind the token, as every write route.
    let opening = json!({"callback_queue": "reports", "on": "finish", "payload": "all done"});
    let (status, _, _) = served
        .send(
            reqwest::Method::POST,
            "/batches",
            Some(opening.clone()),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.batches").await,
        0
    );

    let (status, location, body) = served
        .send(reqwest::Method::POST, "/batches", Some(opening), false)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let batch = body["id"].as_i64().expect("the batch's id");
    let callback: i64 = client
        .query_one(
            "SELECT callback FROM pgtaskd.batches WHERE id = $1",
            &[&batch],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        body,
        json!({"id": batch, "callback_id": callback, "state": "open"})
    );
    assert_eq!(location, Some(format!("/batches/{batch}")));

    for payload in ["one", "two", "three"] {
        let (status, body) = served
            .post(
                "/tasks",
                json!({"payload": payload, "queue": UNSERVED, "batch_id": batch}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        // The member's own row names its batch.
        let (status, task) = served.get(&format!("/tasks/{}", body["id"])).await;
        assert_eq!(status, StatusCode::OK, "{task}");
        assert_eq!(task["batch_id"], batch, "{task}");
    }
    let (status, body) = served.get(&format!("/batches/{batch}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "open");
    assert_eq!(body["on"], "finish");
    assert_eq!(body["callback_id"], callback);
    assert_eq!(body["callback_status"], "WAITING");
    assert_eq!(body["members"]["QUEUED"], 3, "{body}");
    assert_eq!(body["sealed_at"], Value::Null);

    let (status, body) = served
        .post(&format!("/batches/{batch}/seal"), json!(null))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"id": batch, "state": "sealed"}));

    // The same object as `pgtaskd batch status --json` prints, read at the same time.
    let (status, over_http) = served.get(&format!("/batches/{batch}")).await;
    assert_eq!(status, StatusCode::OK);
    let (code, stdout, stderr) = run(&db, &["batch", "status", &batch.to_string(), "--json"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let from_cli: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(over_http, from_cli);
    assert_eq!(over_http["state"], "sealed");
    assert!(over_http["sealed_at"].is_string(), "{over_http}");
    for key in ["ended_at", "succeeded", "failed", "canceled"] {
        assert_eq!(over_http[key], Value::Null, "{key}: {over_http}");
    }

    // A sealed batch and an unknown one refuse a member with 422, naming the batch, as a
    // JSON body's field and as a text body's query parameter; nothing is inserted.
    let tasks = count(&client, "SELECT count(*) FROM pgtaskd.task_view").await;
    for (batch_id, words) in [
        (
            batch,
            format!("batch {batch} is sealed: no task can join it"),
        ),
        (424242, "batch 424242 does not exist".to_string()),
    ] {
        let (status, body) = served
            .post("/tasks", json!({"payload": "late", "batch_id": batch_id}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(body["error"].as_str().unwrap().contains(&words), "{body}");
        let response = within(
            WAIT,
            "a text body with batch_id",
            served
                .http
                .post(format!(
                    "http://127.0.0.1:{}/tasks?batch_id={batch_id}",
                    served.port
                ))
                .bearer_auth(TOKEN)
                .header("content-type", "text/plain")
                .body("late")
                .send(),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        tasks,
        "nothing inserted"
    );

    // Unknown batches are 404; ids and bodies that cannot be read 400.
    for (method, path) in [
        (reqwest::Method::GET, "/batches/424242"),
        (reqwest::Method::POST, "/batches/424242/seal"),
    ] {
        let (status, _, body) = served.send(method, path, None, false).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body, json!({"error": "no such batch"}));
    }
    let (status, body) = served.get("/batches/abc").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    for bad in [
        json!({"on": "sometimes", "payload": "p"}),
        json!({"payload": "p"}),
        json!({"on": "success", "payload": "p", "queue": "misspelt"}),
        json!({"on": "success", "payload": "p", "callback_queue": ""}),
    ] {
        let (status, body) = served.post("/batches", bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (status, body) = served
        .post("/tasks", json!({"payload": "p", "batch_id": "seven"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.batches").await,
        1,
        "no batch opened by a bad request"
    );
    served.stop().await;
}

/// A database that refuses new sessions (`ALLOW_CONNECTIONS false`, every session ended) is
/// an outage: the batch routes answer 503, never 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_refusing_sessions_the_batch_routes_answer_503_never_404() {
    let db = TestDb::new().await;
    let served = Served::start(&db).await;
    let (status, body) = served
        .post("/batches", json!({"on": "success", "payload": "p"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let batch = body["id"].as_i64().unwrap();

    let refusal = db.refuse_connections().await;
    for (method, path) in [
        (reqwest::Method::GET, format!("/batches/{batch}")),
        (reqwest::Method::GET, "/batches/424242".to_string()),
        (reqwest::Method::POST, format!("/batches/{batch}/seal")),
    ] {
        let (status, _, body) = served.send(method, &path, None, false).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert_eq!(body["error"], "database unavailable");
    }
    let (status, body) = served
        .post("/batches", json!({"on": "success", "payload": "p"}))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    refusal.allow().await;
    let (status, body) = crate::support::eventually(WAIT, "the database to come back", || async {
        let (status, body) = served.get(&format!("/batches/{batch}")).await;
        (status == StatusCode::OK).then_some((status, body))
    })
    .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("open"))
    );
    served.stop().await;
}

/// An idempotency key already held by a task of another batch is a conflict, not a repeat:
/// the second batch would otherwise end without the member its producer meant to add. A
/// batch opened with `-` reads its payload from standard input.
#[tokio::test]
async fn a_key_held_in_another_batch_is_a_conflict() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut batches = Vec::new();
    for _ in 0..2 {
        let (code, stdout, stderr) = run(&db, &["batch", "open", "--on", "finish", "report"]).await;
        assert_eq!(code, Some(0), "{stderr}");
        batches.push(stdout.trim().to_owned());
    }
    let enqueue = |batch: String| {
        let db = &db;
        async move {
            run(
                db,
                &[
                    "enqueue", "--queue", UNSERVED, "--key", "k-1", "--batch", &batch, "same",
                ],
            )
            .await
        }
    };
    let (code, first, stderr) = enqueue(batches[0].clone()).await;
    assert_eq!(code, Some(0), "{stderr}");
    let (code, again, _) = enqueue(batches[0].clone()).await;
    assert_eq!((code, again.clone()), (Some(0), first.clone()), "a repeat");
    let (code, _, stderr) = enqueue(batches[1].clone()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("payload or batch is another"), "{stderr}");
    let members = count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.task_view WHERE batch_id = {}",
            batches[1]
        ),
    )
    .await;
    assert_eq!(members, 0);

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgtaskd"))
        .args(["batch", "open", "--on", "finish", "-"])
        .env_remove("PGTASKD_CONFIG")
        .env("PGTASKD_DATABASE_URL", &db.url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"from stdin").await.unwrap();
    }
    let output = within(WAIT, "batch open -", child.wait_with_output())
        .await
        .unwrap();
    assert!(output.status.success());
    let batch = String::from_utf8(output.stdout).unwrap();
    let payload: String = client
        .query_one(
            &format!(
                "SELECT payload FROM pgtaskd.task_view AS t JOIN pgtaskd.batches AS b \
                  ON b.callback = t.id WHERE b.id = {}",
                batch.trim()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(payload, "from stdin");
}
