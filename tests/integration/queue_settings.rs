//! The surface of a queue's limits (docs/limits.md; the claims that obey them are tested in
//! `limits`): `pgtaskd queue set|show`, with its refusals and exit codes; `enqueue
//! --concurrency-key` and `"concurrency_key"` of `POST /tasks`; `GET` and `PUT
//! /queues/{queue}/settings` behind the token; the limits in `pgtaskd stats`, `GET /stats` and
//! the dashboard, and a task's key on its page.

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_postgres::Client;

use crate::support::daemon::pgtaskd;
use crate::support::{count, nowhere, within, TestDb, WAIT};
use crate::ui::{browse, chromium, queue_row, Served, TOKEN};

/// `pgtaskd ARGS` against `db`: succeeds, and its standard output.
async fn ok(db: &TestDb, args: &[&str]) -> String {
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), args).await;
    assert!(
        status.success(),
        "pgtaskd {args:?}: {status}\n{stdout}{stderr}"
    );
    stdout
}

/// One row of `pgtaskd.queue_settings` as text (`NULL` for none), or `None` without a row.
async fn row(client: &Client, queue: &str) -> Option<String> {
    within(
        WAIT,
        "the settings row",
        client.query_opt(
            "SELECT concat_ws(' ', coalesce(max_running::text, 'NULL'),
                                   coalesce(max_running_per_key::text, 'NULL'),
                                   coalesce(rate_limit::text, 'NULL'),
                                   coalesce(rate_period::text, 'NULL'),
                                   coalesce(max_attempts::text, 'NULL'),
                                   coalesce(retain::text, 'NULL'))
               FROM pgtaskd.queue_settings WHERE queue = $1",
            &[&queue],
        ),
    )
    .await
    .unwrap()
    .map(|row| row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_set_merges_removes_and_prints_the_settings_and_show_counts_the_tasks() {
    let db = TestDb::new().await;
    let client = db.client().await;

    // A queue need not have a task to be limited.
    let out = ok(&db, &["queue", "set", "emails", "--max-running", "2"]).await;
    assert_eq!(out, "queue emails: running 2\n");
    let out = ok(
        &db,
        &[
            "queue",
            "set",
            "emails",
            "--rate",
            "10/1s",
            "--max-attempts",
            "10",
            "--retain",
            "30d",
            "--max-running-per-key",
            "1",
        ],
    )
    .await;
    assert_eq!(
        out, "queue emails: running 2, per key 1, rate 10/1s, attempts 10, retain 30days\n",
        "the options not given stay as they are"
    );
    assert_eq!(
        row(&client, "emails").await.as_deref(),
        Some("2 1 10 00:00:01 10 30 days")
    );

    // A task inserted without max_attempts follows the queue's; one RUNNING (its state row,
    // `pgtaskd.task_state` since schema 36, set after the insert), one QUEUED.
    within(
        WAIT,
        "two tasks",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('emails', 'a');
             INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('emails', 'b');
             UPDATE pgtaskd.task_state
                SET status = 'RUNNING', attempt = 1, started_at = now(), lease_owner = 'test',
                    lease_expires_at = now() + interval '1 hour', claim_token = 1
              WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
             INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('other', 'c');",
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'emails' AND max_attempts = 10"
        )
        .await,
        2
    );

    let text = ok(&db, &["queue", "show", "emails"]).await;
    for line in [
        "queue emails\n",
        "  max running:         2\n",
        "  max running per key: 1\n",
        "  rate:                10/1s\n",
        "  max attempts:        10\n",
        "  retain:              30days\n",
        "  running:             1\n",
        "  queued:              1\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    let shown: Value = serde_json::from_str(&ok(&db, &["queue", "show", "emails", "--json"]).await)
        .expect("one JSON object");
    assert_eq!(
        shown,
        json!({"queue": "emails", "max_running": 2, "max_running_per_key": 1, "rate_limit": 10,
               "rate_period": "1s", "max_attempts": 10, "retain": "30days",
               "running": 1, "queued": 1})
    );

    // none removes one setting, and the rest stay; all removed, the row goes.
    let out = ok(&db, &["queue", "set", "emails", "--max-running", "none"]).await;
    assert_eq!(
        out,
        "queue emails: per key 1, rate 10/1s, attempts 10, retain 30days\n"
    );
    assert_eq!(
        row(&client, "emails").await.as_deref(),
        Some("NULL 1 10 00:00:01 10 30 days")
    );
    let out = ok(
        &db,
        &[
            "queue",
            "set",
            "emails",
            "--max-running-per-key",
            "none",
            "--rate",
            "none",
            "--max-attempts",
            "none",
            "--retain",
            "none",
        ],
    )
    .await;
    assert_eq!(out, "queue emails: no settings\n");
    assert_eq!(row(&client, "emails").await, None);

    // A queue without settings (nor tasks) is shown with none: not an error.
    let shown: Value =
        serde_json::from_str(&ok(&db, &["queue", "show", "nothing-here", "--json"]).await).unwrap();
    assert_eq!(
        shown,
        json!({"queue": "nothing-here", "max_running": null, "max_running_per_key": null,
               "rate_limit": null, "rate_period": null, "max_attempts": null, "retain": null,
               "running": 0, "queued": 0})
    );
    let text = ok(&db, &["queue", "show", "nothing-here"]).await;
    assert!(
        text.contains("  max running:         none\n")
            && text.contains("  max attempts:        none (3)\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_set_refuses_bad_input_with_exit_2_before_connecting_and_an_outage_is_69() {
    // Nothing listens there: a command that connected would end 69, not 2.
    let url = nowhere();
    let long = "q".repeat(129);
    for (args, says) in [
        (vec!["queue", "set", "emails"], "--max-running"),
        (
            vec!["queue", "set", "emails", "--max-running", "0"],
            "--max-running must be an integer from 1",
        ),
        (
            vec!["queue", "set", "emails", "--max-running", "-1"],
            "--max-running",
        ),
        (
            vec!["queue", "set", "emails", "--max-running", "two"],
            "--max-running must be an integer from 1",
        ),
        (
            vec!["queue", "set", "emails", "--max-running-per-key", "0"],
            "--max-running-per-key must be an integer from 1",
        ),
        (
            vec!["queue", "set", "emails", "--max-attempts", "0"],
            "--max-attempts must be an integer from 1",
        ),
        (
            vec!["queue", "set", "emails", "--rate", "10"],
            "must be N/DURATION",
        ),
        (
            vec!["queue", "set", "emails", "--rate", "0/1s"],
            "must be N/DURATION",
        ),
        (
            vec!["queue", "set", "emails", "--rate", "10/2days"],
            "1ms to 1day",
        ),
        (
            vec!["queue", "set", "emails", "--rate", "10/0s"],
            "must be N/DURATION",
        ),
        (
            vec!["queue", "set", "emails", "--rate", "1000001/1s"],
            "must be N/DURATION",
        ),
        (
            vec!["queue", "set", "emails", "--retain", "500ms"],
            "at least 1s",
        ),
        (
            vec!["queue", "set", "emails", "--retain", "soon"],
            "at least 1s",
        ),
        (
            vec!["queue", "set", "", "--max-running", "1"],
            "the queue name is empty",
        ),
        (
            vec!["queue", "set", &long, "--max-running", "1"],
            "the limit is 128",
        ),
        (vec!["queue", "show", ""], "the queue name is empty"),
        (vec!["queue", "show"], "QUEUE"),
        (
            vec!["enqueue", "--concurrency-key", &"k".repeat(257), "x"],
            "the concurrency key is 257 bytes long; the limit is 256",
        ),
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&url), &args).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(stderr.contains(says), "{args:?} says {says:?}: {stderr}");
    }

    // Good input and no database: unavailable (69), never "not found" (3).
    for args in [
        vec!["queue", "set", "emails", "--max-running", "2"],
        vec!["queue", "show", "emails"],
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&url), &args).await;
        assert_eq!(status.code(), Some(69), "{args:?}: {stdout}{stderr}");
        assert!(!stderr.contains("no such"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_concurrency_key_lands_in_the_column_from_text_and_from_a_file() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = ok(
        &db,
        &[
            "enqueue",
            "--queue",
            "reports",
            "--concurrency-key",
            "tenant-42",
            "hello",
        ],
    )
    .await;
    let id: i64 = id.trim().parse().expect("an id");
    let file = std::env::temp_dir().join(format!(
        "pgtaskd-test-key-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::write(&file, "from a file").unwrap();
    let from_file = ok(
        &db,
        &[
            "enqueue",
            "--queue",
            "reports",
            "--concurrency-key",
            "tenant-7",
            "--file",
            &file.to_string_lossy(),
        ],
    )
    .await;
    let _ = std::fs::remove_file(&file);
    let from_file: i64 = from_file.trim().parse().expect("an id");
    let unkeyed: i64 = ok(&db, &["enqueue", "--queue", "reports", "plain"])
        .await
        .trim()
        .parse()
        .unwrap();
    let keys = within(
        WAIT,
        "the keys",
        client.query(
            "SELECT id, concurrency_key, payload FROM pgtaskd.task_view ORDER BY id",
            &[],
        ),
    )
    .await
    .unwrap();
    let keys: Vec<(i64, Option<String>, String)> = keys
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        keys,
        vec![
            (id, Some("tenant-42".to_string()), "hello".to_string()),
            (
                from_file,
                Some("tenant-7".to_string()),
                "from a file".to_string()
            ),
            (unkeyed, None, "plain".to_string()),
        ]
    );
    let status: Value =
        serde_json::from_str(&ok(&db, &["status", &id.to_string(), "--json"]).await).unwrap();
    assert_eq!(status["concurrency_key"], "tenant-42");
    let text = ok(&db, &["status", &id.to_string()]).await;
    assert!(text.contains("  concurrency key: tenant-42\n"), "{text}");
}

/// An HTTP client of [`Served`], with or without the token.
struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn send(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = within(WAIT, "an HTTP answer", request.send())
            .await
            .unwrap();
        let status = response.status();
        let text = within(WAIT, "an HTTP body", response.text()).await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(
            self.http
                .get(format!("{}{path}", self.base))
                .bearer_auth(TOKEN),
        )
        .await
    }

    async fn put(&self, path: &str, body: &str) -> (StatusCode, Value) {
        self.send(
            self.http
                .put(format!("{}{path}", self.base))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reads_and_sets_settings_behind_the_token_and_refuses_bad_bodies() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let served = Served::start(&db).await;
    let api = Api {
        base: served.base.clone(),
        http: reqwest::Client::new(),
    };
    let route = "/queues/emails/settings";

    // Without the token, or with a wrong one: 401, and nothing written.
    for token in [None, Some("wrong")] {
        let put = api
            .http
            .put(format!("{}{route}", api.base))
            .header("content-type", "application/json")
            .body(r#"{"max_running": 1}"#);
        let get = api.http.get(format!("{}{route}", api.base));
        let (put, get) = match token {
            Some(token) => (put.bearer_auth(token), get.bearer_auth(token)),
            None => (put, get),
        };
        for request in [put, get] {
            let (status, body) = api.send(request).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
            assert_eq!(body, json!({"error": "unauthorized"}));
        }
    }
    assert_eq!(
        row(&client, "emails").await,
        None,
        "a refused PUT wrote nothing"
    );

    // A queue without settings: 200, each null.
    let (status, body) = api.get(route).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let none = json!({"queue": "emails", "max_running": null, "max_running_per_key": null,
                      "rate_limit": null, "rate_period": null, "max_attempts": null,
                      "retain": null});
    assert_eq!(body, none);

    let (status, body) = api
        .put(
            route,
            r#"{"max_running": 2, "rate_limit": 10, "rate_period": "1s", "retain": "30d"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let set = json!({"queue": "emails", "max_running": 2, "max_running_per_key": null,
                     "rate_limit": 10, "rate_period": "1s", "max_attempts": null,
                     "retain": "30days"});
    assert_eq!(body, set);
    assert_eq!(api.get(route).await, (StatusCode::OK, set.clone()));
    assert_eq!(
        row(&client, "emails").await.as_deref(),
        Some("2 NULL 10 00:00:01 NULL 30 days")
    );
    // What GET answers can be sent back as it is (without its queue).
    let mut again = set.clone();
    again.as_object_mut().unwrap().remove("queue");
    let (status, body) = api.put(route, &again.to_string()).await;
    assert_eq!((status, &body), (StatusCode::OK, &set));

    // null removes one; the others stay.
    let (status, body) = api
        .put(route, r#"{"max_running": null, "max_attempts": 5}"#)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["max_running"], Value::Null);
    assert_eq!(body["max_attempts"], 5);
    assert_eq!(body["rate_period"], "1s");

    // Bad bodies: 400 with the error body, nothing changed.
    for (body, says) in [
        ("{}", "no setting given"),
        (r#"{"max_runing": 1}"#, "unknown setting \"max_runing\""),
        (r#"{"queue": "emails"}"#, "unknown setting \"queue\""),
        (
            r#"{"max_running": 0}"#,
            "max_running must be an integer from 1",
        ),
        (
            r#"{"max_running": "2"}"#,
            "max_running must be an integer from 1",
        ),
        (r#"{"rate_limit": 10}"#, "set together"),
        (
            r#"{"rate_limit": 10, "rate_period": "2days"}"#,
            "rate_period",
        ),
        (
            r#"{"rate_limit": 0, "rate_period": "1s"}"#,
            "rate_limit must be an integer",
        ),
        (r#"{"retain": "500ms"}"#, "at least 1s"),
        ("[1]", "invalid settings"),
        ("not json", "invalid settings"),
    ] {
        let (status, answer) = api.put(route, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{body} says {says:?}: {answer}");
    }
    let (status, answer) = api
        .send(
            api.http
                .put(format!("{}{route}", api.base))
                .bearer_auth(TOKEN)
                .header("content-type", "text/plain")
                .body(r#"{"max_running": 1}"#),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("as JSON"),
        "{answer}"
    );
    let (status, _) = api
        .put(
            &format!("/queues/{}/settings", "q".repeat(129)),
            r#"{"max_running": 1}"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        row(&client, "emails").await.as_deref(),
        Some("NULL NULL 10 00:00:01 5 30 days"),
        "the refused bodies changed nothing"
    );

    // POST /tasks: the key in a JSON body or a text body's query; too long or not a string is 400.
    let post = |body: String, query: &str, content_type: &str| {
        api.http
            .post(format!("{}/tasks{query}", api.base))
            .bearer_auth(TOKEN)
            .header("content-type", content_type.to_string())
            .body(body)
    };
    let (status, body) = api
        .send(post(
            r#"{"payload": "x", "queue": "emails", "concurrency_key": "tenant-42"}"#.into(),
            "",
            "application/json",
        ))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_i64().expect("an id");
    let (status, body) = api
        .send(post(
            "y".into(),
            "?queue=emails&concurrency_key=tenant-7",
            "text/plain",
        ))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let text_id = body["id"].as_i64().expect("an id");
    assert_eq!(
        count(
            &client,
            &format!(
                "SELECT count(*) FROM pgtaskd.tasks
                  WHERE (id = {id} AND concurrency_key = 'tenant-42')
                     OR (id = {text_id} AND concurrency_key = 'tenant-7')"
            )
        )
        .await,
        2
    );
    let (status, task) = api.get(&format!("/tasks/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(task["concurrency_key"], "tenant-42");
    for (body, says) in [
        (
            format!(
                r#"{{"payload": "x", "concurrency_key": "{}"}}"#,
                "k".repeat(257)
            ),
            "the concurrency key is 257 bytes long; the limit is 256",
        ),
        (
            r#"{"payload": "x", "concurrency_key": 42}"#.to_string(),
            "concurrency_key must be a string",
        ),
    ] {
        let (status, answer) = api.send(post(body.clone(), "", "application/json")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains(says), "{answer}");
    }
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
        2
    );

    // GET /stats: the settings of each queue.
    let (status, stats) = api.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    let emails = stats["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "emails")
        .expect("emails in /stats");
    assert_eq!(
        emails["settings"],
        json!({"max_running": null, "max_running_per_key": null, "rate_limit": 10,
               "rate_period": "1s", "max_attempts": 5, "retain": "30days"})
    );

    // The OpenAPI document served describes the routes and the new fields, with the keys
    // the answers have.
    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let path = &doc["paths"]["/queues/{queue}/settings"];
    assert!(path["get"]["responses"]["200"].is_object(), "{path}");
    assert!(path["put"]["responses"]["400"].is_object(), "{path}");
    let schemas = &doc["components"]["schemas"];
    let required = |schema: &str| -> Vec<String> {
        serde_json::from_value(schemas[schema]["required"].clone()).unwrap()
    };
    let mut keys: Vec<String> = set.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    let mut documented = required("QueueSettings");
    documented.sort();
    assert_eq!(keys, documented);
    assert!(required("QueueStats").contains(&"settings".to_string()));
    assert!(required("Task").contains(&"concurrency_key".to_string()));
    assert!(task.get("concurrency_key").is_some());
    assert!(schemas["Submission"]["properties"]["concurrency_key"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_settings_in_an_outage_are_503_and_a_bad_body_still_400() {
    let db = TestDb::new().await;
    let served = Served::start(&db).await;
    let api = Api {
        base: served.base.clone(),
        http: reqwest::Client::new(),
    };
    assert_eq!(api.get("/queues/emails/settings").await.0, StatusCode::OK);
    let refusal = db.refuse_connections().await;
    let (status, body) = api.get("/queues/emails/settings").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "database unavailable");
    let (status, body) = api
        .put("/queues/emails/settings", r#"{"max_running": 2}"#)
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = api
        .put("/queues/emails/settings", r#"{"max_running": 0}"#)
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "judged before a session: {body}"
    );
    refusal.allow().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_the_dashboard_show_each_queues_limits_and_a_tasks_key() {
    chromium();
    let db = TestDb::new().await;
    let client = db.client().await;
    ok(
        &db,
        &[
            "queue",
            "set",
            "reports",
            "--max-running",
            "2",
            "--max-running-per-key",
            "1",
        ],
    )
    .await;
    // A limited queue without any task is listed too.
    ok(&db, &["queue", "set", "webhooks", "--rate", "10/1s"]).await;
    let id: i64 = ok(
        &db,
        &[
            "enqueue",
            "--queue",
            "reports",
            "--concurrency-key",
            "tenant-42",
            "x",
        ],
    )
    .await
    .trim()
    .parse()
    .unwrap();
    within(
        WAIT,
        "a task of a queue without settings",
        client.batch_execute("INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('mail', 'y')"),
    )
    .await
    .unwrap();

    let text = ok(&db, &["stats"]).await;
    let header = text.lines().next().unwrap();
    assert!(header.ends_with("  LIMITS"), "{text}");
    let line = |queue: &str| {
        text.lines()
            .find(|line| line.starts_with(&format!("{queue} ")))
            .unwrap_or_else(|| panic!("no {queue} in\n{text}"))
            .to_string()
    };
    assert!(
        line("reports").ends_with("  running 2, per key 1"),
        "{text}"
    );
    assert!(line("webhooks").ends_with("  rate 10/1s"), "{text}");
    assert!(line("mail").ends_with("  -"), "{text}");
    let stats: Value = serde_json::from_str(&ok(&db, &["stats", "--json"]).await).unwrap();
    let settings = |queue: &str| {
        stats["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == queue)
            .unwrap_or_else(|| panic!("no {queue} in {stats}"))["settings"]
            .clone()
    };
    assert_eq!(settings("reports")["max_running"], 2);
    assert_eq!(settings("reports")["max_running_per_key"], 1);
    assert_eq!(settings("webhooks")["rate_period"], "1s");
    assert_eq!(
        settings("mail"),
        json!({"max_running": null, "max_running_per_key": null, "rate_limit": null,
               "rate_period": null, "max_attempts": null, "retain": null})
    );

    let served = Served::start(&db).await;
    let dom = browse(&served.console(&format!("&task={id}")), &["--dump-dom"]).await;
    let reports = queue_row(&dom, "reports");
    assert!(
        reports.contains("<td class=\"limits\">running 2, per key 1</td>"),
        "{reports}"
    );
    let webhooks = queue_row(&dom, "webhooks");
    assert!(
        webhooks.contains("<td class=\"limits\">rate 10/1s</td>"),
        "{webhooks}"
    );
    assert!(
        queue_row(&dom, "mail").contains("<td class=\"limits\">-</td>"),
        "{dom}"
    );
    assert!(
        dom.contains("<dt>concurrency key</dt><dd class=\"mono\">tenant-42</dd>"),
        "the task's page shows its key:\n{dom}"
    );
}

/// Who may set: an operator may (`grant_operator` gives `set_queue`); a producer may read the
/// settings and set a task's key, and its `queue set` is "permission denied", 78.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_may_set_a_producer_may_show_and_set_a_tasks_key_only() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    // Roles are the cluster's: names of this test's own.
    let suffix = format!("{}_{}", std::process::id(), fastrand::u32(..));
    let producer = format!("qs_producer_{suffix}");
    let operator = format!("qs_operator_{suffix}");
    within(
        WAIT,
        "the roles",
        owner.batch_execute(&format!(
            "CREATE ROLE {producer} LOGIN; SELECT pgtaskd.grant_producer('{producer}');
             CREATE ROLE {operator} LOGIN; SELECT pgtaskd.grant_operator('{operator}');"
        )),
    )
    .await
    .unwrap();
    let url_of = |role: &str| {
        let url = db.url.replace("user=postgres", &format!("user={role}"));
        assert_ne!(url, db.url, "the test URL names the user");
        url
    };
    let (producer_url, operator_url) = (url_of(&producer), url_of(&operator));

    let (status, stdout, stderr) = pgtaskd(
        Some(&operator_url),
        &["queue", "set", "reports", "--max-running-per-key", "1"],
    )
    .await;
    assert!(
        status.success(),
        "an operator's queue set: {stdout}{stderr}"
    );
    assert_eq!(stdout, "queue reports: per key 1\n");

    let (status, stdout, stderr) = pgtaskd(
        Some(&producer_url),
        &["queue", "set", "reports", "--max-running", "3"],
    )
    .await;
    assert_eq!(
        status.code(),
        Some(78),
        "a producer's queue set: {stdout}{stderr}"
    );
    assert!(stderr.contains("permission denied"), "{stderr}");
    let (status, stdout, stderr) =
        pgtaskd(Some(&producer_url), &["queue", "show", "reports", "--json"]).await;
    assert!(status.success(), "a producer's queue show: {stderr}");
    let shown: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(shown["max_running_per_key"], 1);
    assert_eq!(
        shown["max_running"],
        Value::Null,
        "the refused set changed nothing"
    );
    let (status, stdout, stderr) = pgtaskd(
        Some(&producer_url),
        &[
            "enqueue",
            "--queue",
            "reports",
            "--concurrency-key",
            "tenant-1",
            "x",
        ],
    )
    .await;
    assert!(
        status.success(),
        "a producer's enqueue with a key: {stderr}"
    );
    let id: i64 = stdout.trim().parse().unwrap();
    assert_eq!(
        count(
            &owner,
            &format!("SELECT count(*) FROM pgtaskd.tasks WHERE id = {id} AND concurrency_key = 'tenant-1'")
        )
        .await,
        1
    );

    within(
        WAIT,
        "dropping the roles",
        owner.batch_execute(&format!(
            "DROP OWNED BY {producer}, {operator}; DROP ROLE {producer}, {operator};"
        )),
    )
    .await
    .unwrap();
}

/// The table holds the bounds the CLI and the HTTP API check: a `retain` over 100 years
/// written through SQL is refused (it made retention fail for every queue, and `stats`),
/// and 100 years keeps both working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retain_over_100_years_is_refused_by_the_table_too() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let refused = within(
        WAIT,
        "a retain of 10,000 years",
        client.execute(
            "SELECT pgtaskd.set_queue('far', '{\"retain\": \"10000 years\"}')",
            &[],
        ),
    )
    .await
    .expect_err("the table refuses it");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
        "{refused:?}"
    );
    assert_eq!(row(&client, "far").await, None, "nothing written");
    within(
        WAIT,
        "a retain of 100 years",
        client.execute(
            "SELECT pgtaskd.set_queue('far', '{\"retain\": \"100 years\"}')",
            &[],
        ),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "retention",
        client.query("SELECT * FROM pgtaskd.prune(1000, 1000, NULL)", &[]),
    )
    .await
    .expect("retention works with the longest retain");
    let stdout = ok(&db, &["stats"]).await;
    assert!(stdout.contains("far"), "{stdout}");
}
