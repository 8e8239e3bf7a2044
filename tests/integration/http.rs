//! The HTTP API with a real HTTP client against a running daemon (docs/design.md, "HTTP").

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::daemon::tempfile_path::TempPath;
use crate::support::{
    count, enqueue, eventually, expected_counts, free_port, within, Cluster, GatedAnalyzer,
    InProcessDaemon, TestDb, WAIT,
};

struct Api {
    base: String,
    client: reqwest::Client,
    token: Option<String>,
}

impl Api {
    fn new(port: u16) -> Api {
        Api {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            token: None,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> (StatusCode, reqwest::header::HeaderMap, String) {
        let response = within(WAIT, "an HTTP response", request.send())
            .await
            .expect("HTTP request");
        let status = response.status();
        let headers = response.headers().clone();
        let body = within(WAIT, "an HTTP body", response.text()).await.unwrap();
        (status, headers, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, _, body) = self.send(self.request(reqwest::Method::GET, path)).await;
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }

    async fn post(
        &self,
        path: &str,
        body: &str,
        json: bool,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let content_type = if json {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        };
        let request = self
            .request(reqwest::Method::POST, path)
            .header("content-type", content_type)
            .body(body.to_string());
        let (status, headers, body) = self.send(request).await;
        (
            status,
            headers,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }
}

async fn daemon_with_http(
    db: &TestDb,
    analyzer: std::sync::Arc<GatedAnalyzer>,
    extra: &str,
) -> (InProcessDaemon, Api) {
    let port = free_port();
    let config = db.config(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n{extra}"));
    let daemon = InProcessDaemon::start(db, config, analyzer).await;
    (daemon, Api::new(port))
}

async fn wait_task(api: &Api, id: i64, status: &str) -> Value {
    eventually(
        WAIT,
        &format!("task {id} to be {status} over HTTP"),
        || async move {
            let (code, task) = api.get(&format!("/tasks/{id}")).await;
            (code == StatusCode::OK && task["status"] == status).then_some(task)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_submitted_over_http_is_finished_by_the_daemon() {
    let db = TestDb::new().await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "").await;

    let (status, headers, body) = api.post("/tasks", "naïve 日本語 text", false).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_i64().unwrap();
    assert_eq!(body["status"], "QUEUED");
    assert_eq!(headers["location"], format!("/tasks/{id}").as_str());
    let task = wait_task(&api, id, "SUCCEEDED").await;
    assert_eq!(
        (
            task["words"].as_i64(),
            task["bytes"].as_i64(),
            task["runes"].as_i64()
        ),
        (Some(3), Some(21), Some(14))
    );

    let (status, _, body) = api
        .post("/tasks", r#"{"payload": "hello json world"}"#, true)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let task = wait_task(&api, body["id"].as_i64().unwrap(), "SUCCEEDED").await;
    let (w, b, r) = expected_counts("hello json world");
    assert_eq!(
        (
            task["words"].as_i64(),
            task["bytes"].as_i64(),
            task["runes"].as_i64()
        ),
        (Some(w), Some(b), Some(r))
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400_404_and_413_with_a_json_error() {
    let db = TestDb::new().await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "max_body = 64\n").await;
    for body in [
        "{not json",
        r#"{"text": "x"}"#,
        r#"{"payload": 5}"#,
        r#"{"payload": "x", "queue": ""}"#,
    ] {
        let (status, _, error) = api.post("/tasks", body, true).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert!(error["error"].is_string(), "{error}");
    }
    let (status, error) = api.get("/tasks/abc").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"].is_string());
    let (status, _, _) = api.post("/tasks/abc/cancel", "", false).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, error) = api.get("/tasks/987654").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error["error"], "no such task");
    // A misspelt filter lists nothing rather than everything.
    for query in ["staus=failed", "tags=nightly", "status=failed&limt=3"] {
        let (status, error) = api.get(&format!("/tasks?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
        assert!(
            error["error"]
                .as_str()
                .unwrap_or("")
                .contains("unknown query parameter"),
            "{query}: {error}"
        );
    }
    let (status, _, _) = api.post("/tasks/987654/cancel", "", false).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = api.post("/tasks", &"x".repeat(65), false).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _, _) = api.post("/tasks", &"x".repeat(64), false).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "a body of exactly max_body is accepted"
    );
    let (status, _, error) = api.post("/tasks", "nul \u{0} inside", false).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let untyped = api
        .request(reqwest::Method::POST, "/tasks")
        .body("no content type");
    let (status, _, _) = api.send(untyped).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_payload_may_be_an_object_or_an_array_stored_as_its_json_text() {
    let db = TestDb::new().await;
    // Queues no daemon serves: the tasks stay QUEUED with their payload as stored.
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "").await;
    for (body, stored) in [
        (
            r#"{"payload": {"to": "ada@example.com", "ids": [3, 1, 12345678901234567890]}, "queue": "mail"}"#,
            r#"{"to":"ada@example.com","ids":[3,1,12345678901234567890]}"#,
        ),
        (
            r#"{"payload": [ {"b": 1, "a": 2} ], "queue": "mail"}"#,
            r#"[{"b":1,"a":2}]"#,
        ),
        (
            r#"{"payload": "{ text that stays }", "queue": "mail"}"#,
            "{ text that stays }",
        ),
    ] {
        let (status, _, accepted) = api.post("/tasks", body, true).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}: {accepted}");
        let (_, task) = api.get(&format!("/tasks/{}", accepted["id"])).await;
        assert_eq!(task["payload"], stored, "{body}");
        assert_eq!(task["queue"], "mail");
    }
    for (body, says) in [
        (r#"{"payload": 5}"#, "payload is a number"),
        (r#"{"payload": false}"#, "payload is a boolean"),
        (r#"{"payload": null}"#, "payload is null"),
    ] {
        let (status, _, error) = api.post("/tasks", body, true).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        let text = error["error"].as_str().unwrap();
        assert!(text.contains(says), "{body}: {text}");
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_body_takes_queue_priority_run_at_and_max_attempts_from_the_query() {
    let db = TestDb::new().await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "").await;
    let (status, _, accepted) = api
        .post(
            "/tasks?queue=thumbs&priority=7&max_attempts=5&run_at=2099-01-01T00:00:00Z",
            "resize me",
            false,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let (_, task) = api.get(&format!("/tasks/{}", accepted["id"])).await;
    assert_eq!(task["queue"], "thumbs");
    assert_eq!(task["payload"], "resize me");
    assert_eq!(task["priority"], 7);
    assert_eq!(task["max_attempts"], 5);
    assert!(
        task["run_at"].as_str().unwrap().starts_with("2099-01-01"),
        "{task}"
    );
    for (query, says) in [
        ("queue=", "queue name is empty"),
        ("priority=urgent", "priority"),
        ("max_attempts=0", "max_attempts"),
        ("run_at=someday", "run_at"),
        ("qeue=thumbs", "unknown query parameter"),
        ("queue=a&queue=b", "given twice"),
    ] {
        let (status, _, error) = api.post(&format!("/tasks?{query}"), "x", false).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
        let text = error["error"].as_str().unwrap();
        assert!(text.contains(says), "{query}: {text}");
    }
    let (status, _, error) = api
        .post("/tasks?queue=thumbs", r#"{"payload": "x"}"#, true)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    // Nothing of the refused requests was inserted.
    let (_, page) = api.get("/tasks").await;
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1, "{page}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_over_http_of_a_running_task_held_at_a_gate_then_of_queued_and_finished_ones() {
    let db = TestDb::new().await;
    let analyzer = GatedAnalyzer::closed_ignoring_cancel();
    let (daemon, api) = daemon_with_http(&db, analyzer.clone(), "").await;
    let client = db.client().await;
    let running = enqueue(&client, "held over http").await;
    analyzer.entered(1).await;
    let (status, _, body) = api
        .post(&format!("/tasks/{running}/cancel"), "", false)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["status"], "RUNNING");
    assert_eq!(body["cancel_requested"], true);
    let (_, task) = api.get(&format!("/tasks/{running}")).await;
    assert_eq!(task["status"], "RUNNING", "accepted is not stopped");
    analyzer.open();
    let task = wait_task(&api, running, "CANCELED").await;
    assert_eq!(task["words"], 0);

    // A queue no daemon serves keeps the task QUEUED.
    let (_, _, body) = api
        .post(
            "/tasks",
            r#"{"payload": "parked", "queue": "parked"}"#,
            true,
        )
        .await;
    let parked = body["id"].as_i64().unwrap();
    let (status, _, body) = api
        .post(&format!("/tasks/{parked}/cancel"), "", false)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["status"], "CANCELED");
    let (status, _, body) = api
        .post(&format!("/tasks/{parked}/cancel"), "", false)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["status"], "CANCELED");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_guards_every_route_but_healthz() {
    let db = TestDb::new().await;
    let token = TempPath::write("s3cret-token\n");
    let extra = format!("token_file = \"{}\"\n", token.path().display());
    let (daemon, mut api) = daemon_with_http(&db, GatedAnalyzer::counting(), &extra).await;
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    for path in ["/tasks/1", "/readyz", "/metrics", "/openapi.json"] {
        let (status, body) = api.get(path).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(
            body,
            serde_json::json!({"error": "unauthorized"}),
            "reveals nothing"
        );
    }
    let (status, _, _) = api.post("/tasks", "x", false).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    api.token = Some("wrong".into());
    assert_eq!(api.get("/tasks/1").await.0, StatusCode::UNAUTHORIZED);
    api.token = Some("s3cret-token".into());
    assert_eq!(api.get("/tasks/1").await.0, StatusCode::NOT_FOUND);
    let (status, _, _) = api.post("/tasks", "with the token", false).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The scheme's name is case-insensitive (RFC 9110, section 11.1); the token is not.
    for (authorization, expected) in [
        ("bearer s3cret-token", StatusCode::OK),
        ("BEARER s3cret-token", StatusCode::OK),
        ("Bearer S3CRET-TOKEN", StatusCode::UNAUTHORIZED),
        ("Basic s3cret-token", StatusCode::UNAUTHORIZED),
    ] {
        let request = api
            .client
            .get(format!("{}/openapi.json", api.base))
            .header("authorization", authorization);
        let (status, _, _) = api.send(request).await;
        assert_eq!(status, expected, "{authorization}");
    }
    daemon.stop().await;
}

/// Without a token, a page of another site cannot drive the API through the visitor's
/// browser: a request whose `Origin` is not the server is 403 and does nothing, and a server
/// on a loopback address takes no other name (a name of the attacker's pointed at 127.0.0.1,
/// DNS rebinding). The API's own page, and clients that are not browsers, are served; with a
/// token, both checks are left to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_requests_of_other_sites_and_names_are_refused() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "").await;
    let other_site = api
        .request(reqwest::Method::POST, "/tasks?queue=cross")
        .header("origin", "http://localhost:5794")
        .header("content-type", "text/plain")
        .body("enqueued by another origin");
    let (status, _, body) = api.send(other_site).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("another site"), "{body}");
    let pause = api
        .request(reqwest::Method::POST, "/queues/default/pause")
        .header("origin", "null");
    assert_eq!(api.send(pause).await.0, StatusCode::FORBIDDEN);
    let rebound = api
        .request(reqwest::Method::GET, "/tasks")
        .header("host", "evil.example:80");
    let (status, _, body) = api.send(rebound).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("loopback"), "{body}");
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.tasks WHERE queue = 'cross'"
        )
        .await,
        0,
        "the refused request enqueued nothing"
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.paused_queues").await,
        0,
        "the refused request paused nothing"
    );
    // The server's own origin, a client without one, a probe by any name.
    let own = api
        .request(reqwest::Method::POST, "/tasks?queue=own")
        .header("origin", api.base.as_str())
        .header("content-type", "text/plain")
        .body("from the dashboard");
    assert_eq!(api.send(own).await.0, StatusCode::ACCEPTED);
    let (status, _, _) = api.post("/tasks?queue=own", "from curl", false).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let named = api.request(reqwest::Method::GET, "/tasks").header(
        "host",
        format!("localhost:{}", api.base.rsplit(':').next().unwrap()),
    );
    assert_eq!(api.send(named).await.0, StatusCode::OK);
    let probe = api
        .request(reqwest::Method::GET, "/healthz")
        .header("host", "pgtaskd.internal");
    assert_eq!(api.send(probe).await.0, StatusCode::OK);
    daemon.stop().await;

    // With a token, the token decides.
    let token = TempPath::write("s3cret-token\n");
    let extra = format!("token_file = \"{}\"\n", token.path().display());
    let (daemon, mut api) = daemon_with_http(&db, GatedAnalyzer::counting(), &extra).await;
    api.token = Some("s3cret-token".into());
    let proxied = api
        .request(reqwest::Method::GET, "/tasks")
        .header("host", "pgtaskd.internal")
        .header("origin", "https://console.internal");
    assert_eq!(api.send(proxied).await.0, StatusCode::OK);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_metrics_and_openapi_describe_a_running_daemon() {
    let db = TestDb::new().await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "").await;
    let client = db.client().await;
    let id = enqueue(&client, "count me").await;
    wait_task(&api, id, "SUCCEEDED").await;
    let (status, body) = eventually(WAIT, "readiness", || async {
        let (status, body) = api.get("/readyz").await;
        (status == StatusCode::OK).then_some((status, body))
    })
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ready"))
    );
    let (status, _, text) = api
        .send(api.request(reqwest::Method::GET, "/metrics"))
        .await;
    assert_eq!(status, StatusCode::OK);
    for needle in [
        "pgtaskd_tasks_claimed_total 1",
        "pgtaskd_tasks_finished_total{status=\"SUCCEEDED\"} 1",
        "pgtaskd_tasks{status=\"QUEUED\"} 0",
        "pgtaskd_claim_to_finish_seconds_bucket",
        "pgtaskd_enqueue_to_start_seconds_count 1",
        "pgtaskd_pool_connections_in_use",
        "pgtaskd_listener_reconnects_total 0",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.0.3");
    assert!(doc["paths"]["/tasks/{id}/cancel"]["post"]["responses"]["409"].is_object());
    daemon.stop().await;
}

/// A database that refuses new sessions while the server runs (`ALLOW_CONNECTIONS false`, a
/// revoked `CONNECT`) is an outage too: 503, never 500 or 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_refusing_connections_answers_503_and_recovers() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = enqueue(&client, "exists").await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "").await;
    wait_task(&api, id, "SUCCEEDED").await;
    let refusal = db.refuse_connections().await;
    for path in [format!("/tasks/{id}"), "/tasks/424242".to_string()] {
        let (status, body) = api.get(&path).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert_eq!(body["error"], "database unavailable");
    }
    let (status, _, body) = api.post("/tasks", "while refused", false).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    refusal.allow().await;
    let task = eventually(WAIT, "the database to come back", || async {
        let (status, task) = api.get(&format!("/tasks/{id}")).await;
        (status == StatusCode::OK).then_some(task)
    })
    .await;
    assert_eq!(task["status"], "SUCCEEDED");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_stopped_task_routes_answer_503_never_404() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    let id = enqueue(&client, "exists").await;
    drop(client);
    let (daemon, api) = daemon_with_http(
        &db,
        GatedAnalyzer::counting(),
        "[database]\nconnect_timeout = \"1s\"\n",
    )
    .await;
    wait_task(&api, id, "SUCCEEDED").await;
    cluster.stop_server(true);
    for path in [format!("/tasks/{id}"), "/tasks/424242".to_string()] {
        let (status, body) = api.get(&path).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert_eq!(body["error"], "database unavailable");
    }
    let (status, _, _) = api.post(&format!("/tasks/{id}/cancel"), "", false).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _, _) = api.post("/tasks", "while down", false).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = api.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "alive while the database is away");
    cluster.start_server();
    let (status, task) = eventually(WAIT, "the database to come back", || async {
        let (status, task) = api.get(&format!("/tasks/{id}")).await;
        (status == StatusCode::OK).then_some((status, task))
    })
    .await;
    assert_eq!(
        (status, task["status"].as_str()),
        (StatusCode::OK, Some("SUCCEEDED"))
    );
    daemon.stop().await;
}

/// `POST /graphs`: a graph inserted parents first, run in order by the daemon; a cycle is
/// 422 naming it, a body that is not JSON 400, and neither inserts anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_posted_over_http_runs_in_order_and_a_cycle_is_refused() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::counting(), "").await;
    let (status, _, body) = api
        .post(
            "/graphs",
            r#"[{"ref": "a", "payload": "one", "after": ["b"]}, {"ref": "b", "payload": "two", "after": ["a"]}]"#,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"], "cycle: a -> b -> a");
    let (status, _, body) = api.post("/graphs", "[{", true).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A key a graph's task does not take is refused, not dropped: `batch_id`, a misspelt tag.
    for (graph, key) in [
        (
            r#"[{"ref": "a", "payload": "x", "batch_id": 5}]"#,
            "batch_id",
        ),
        (
            r#"[{"ref": "a", "payload": "x"}, {"ref": "b", "payload": "y", "tag": ["t"]}]"#,
            "tag",
        ),
    ] {
        let (status, _, body) = api.post("/graphs", graph, true).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let error = body["error"].as_str().unwrap_or("");
        assert!(error.contains(&format!("the key \"{key}\"")), "{body}");
    }
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
        0
    );

    let (status, _, body) = api
        .post(
            "/graphs",
            r#"[{"ref": "report", "payload": "three words here", "after": ["fetch"]},
                {"ref": "fetch", "payload": "one two"}]"#,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let tasks = body["tasks"].as_array().unwrap();
    assert_eq!(tasks[0]["ref"], "fetch", "parents first: {body}");
    assert_eq!(tasks[1]["ref"], "report");
    let (fetch, report) = (
        tasks[0]["id"].as_i64().unwrap(),
        tasks[1]["id"].as_i64().unwrap(),
    );
    let done = wait_task(&api, report, "SUCCEEDED").await;
    assert_eq!(done["words"], 3);
    let (_, parent) = api.get(&format!("/tasks/{fetch}")).await;
    assert!(
        parent["finished_at"].as_str() <= done["started_at"].as_str(),
        "the child started after its parent ended: {parent} {done}"
    );
    daemon.stop().await;
}

/// `POST /tasks/{id}/retry?with_dependents=true`: the failed root back, and the tasks its
/// failure canceled named and waiting again; the answer says the status each retry left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_dependents_over_http_brings_back_what_the_failure_canceled() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (daemon, api) = daemon_with_http(&db, GatedAnalyzer::failing("it broke"), "").await;
    let (status, _, body) = api
        .post(
            "/graphs",
            r#"[{"ref": "root", "payload": "r", "max_attempts": 1},
                {"ref": "a", "payload": "a", "after": ["root"]},
                {"ref": "b", "payload": "b", "after": ["a"]}]"#,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let ids: Vec<i64> = body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    wait_task(&api, ids[2], "CANCELED").await;
    // Paused, so that the answer is read before any daemon claims the root again.
    let (status, _, body) = api.post("/queues/default/pause", "", false).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = api
        .post(
            &format!("/tasks/{}/retry?with_dependents=nonsense", ids[0]),
            "",
            false,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _, body) = api
        .post(
            &format!("/tasks/{}/retry?with_dependents=true", ids[0]),
            "",
            false,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "QUEUED", "{body}");
    assert_eq!(body["previous_status"], "FAILED", "{body}");
    assert_eq!(
        body["dependents"],
        serde_json::json!([ids[1], ids[2]]),
        "{body}"
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'WAITING'"
        )
        .await,
        2
    );
    // A dependent that waits again is not retried on its own: 409, nothing changed.
    let (status, _, body) = api
        .post(&format!("/tasks/{}/retry", ids[1]), "", false)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "it is WAITING now: {body}");
    daemon.stop().await;
}
