//! Tags and metadata (schema 38, docs/sql.md "Tags and metadata"): set by the CLI's `--tag`
//! and `--meta`, by `POST /tasks`' `tags` and `metadata`, and by a producer's INSERT; checked
//! by the rules of the table's checks before any statement (exit 2, 422, nothing inserted);
//! and found by `pgtaskd list --tag --meta` and `GET /tasks?tag=&meta=`, every term ANDed,
//! newest first, a page at a time, through the task table's GIN indexes.

use pgtaskd::queue::enqueue::{jsonb_text, Metadata};
use pgtaskd::queue::{self, ListFilter, TaskStatus};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_postgres::Client;

use crate::support::daemon::pgtaskd;
use crate::support::daemon::tempfile_path::TempPath;
use crate::support::{
    count, free_port, set_state, within, GatedAnalyzer, InProcessDaemon, TestDb, WAIT,
};

/// A daemon with an HTTP listener that serves only `nothing`, so that the tasks the tests
/// insert elsewhere stay as they set them.
async fn daemon_with_http(db: &TestDb) -> (InProcessDaemon, Http) {
    let port = free_port();
    let config = db.config(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n[worker]\nqueues = [\"nothing\"]\n"
    ));
    let daemon = InProcessDaemon::start(db, config, GatedAnalyzer::counting()).await;
    (
        daemon,
        Http {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
        },
    )
}

struct Http {
    base: String,
    client: reqwest::Client,
}

impl Http {
    async fn send(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = within(WAIT, "an HTTP answer", request.send())
            .await
            .expect("an HTTP answer");
        let status = response.status();
        let text = within(WAIT, "an HTTP body", response.text()).await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.get(format!("{}{path}", self.base)))
            .await
    }

    async fn get_text(&self, path: &str) -> String {
        let response = within(
            WAIT,
            "an HTTP answer",
            self.client.get(format!("{}{path}", self.base)).send(),
        )
        .await
        .expect("an HTTP answer");
        within(WAIT, "an HTTP body", response.text()).await.unwrap()
    }

    async fn post_json(&self, body: &str) -> (StatusCode, Value) {
        self.send(
            self.client
                .post(format!("{}/tasks", self.base))
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
        .await
    }

    async fn post_text(&self, query: &str, body: &str) -> (StatusCode, Value) {
        self.send(
            self.client
                .post(format!("{}/tasks?{query}", self.base))
                .header("content-type", "text/plain")
                .body(body.to_string()),
        )
        .await
    }
}

/// The tags and the metadata's text of task `id`, as the view shows them.
async fn tagged(client: &Client, id: i64) -> (Option<Vec<String>>, Option<String>) {
    let row = client
        .query_one(
            "SELECT tags, metadata::text FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

fn tags(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|tag| tag.to_string()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_and_metadata_are_set_from_the_cli_http_and_sql() {
    let db = TestDb::new().await;
    let client = db.client().await;

    // The CLI: the text as an argument, and a regular file streamed.
    let (status, out, err) = pgtaskd(
        Some(&db.url),
        &[
            "enqueue",
            "--queue",
            "nothing",
            "--tag",
            "env:prod",
            "--tag",
            "nightly",
            "--meta",
            "owner=ann",
            "--meta",
            "note=a=b",
            "hello",
        ],
    )
    .await;
    assert!(status.success(), "{err}");
    let id: i64 = out.trim().parse().unwrap();
    assert_eq!(
        tagged(&client, id).await,
        (
            tags(&["env:prod", "nightly"]),
            Some(r#"{"note": "a=b", "owner": "ann"}"#.to_string())
        )
    );
    let (status, out, err) = pgtaskd(Some(&db.url), &["status", &id.to_string()]).await;
    assert!(status.success(), "{err}");
    assert!(out.contains("  tags: env:prod, nightly\n"), "{out}");
    assert!(
        out.contains(r#"  metadata: {"note": "a=b", "owner": "ann"}"#),
        "{out}"
    );
    let (_, out, _) = pgtaskd(Some(&db.url), &["status", &id.to_string(), "--json"]).await;
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["tags"], json!(["env:prod", "nightly"]));
    assert_eq!(shown["metadata"], json!({"note": "a=b", "owner": "ann"}));
    let file = TempPath::write("a file's text");
    let path = file.path().display().to_string();
    let (status, out, err) = pgtaskd(
        Some(&db.url),
        &[
            "enqueue",
            "--queue",
            "nothing",
            "--file",
            &path,
            "--tag",
            "from-file",
            "--meta",
            "k=v",
        ],
    )
    .await;
    assert!(status.success(), "{err}");
    let from_file: i64 = out.trim().parse().unwrap();
    assert_eq!(
        tagged(&client, from_file).await,
        (tags(&["from-file"]), Some(r#"{"k": "v"}"#.to_string()))
    );
    // Without either, nulls: the GIN indexes never hold the task.
    let (_, out, _) = pgtaskd(
        Some(&db.url),
        &["enqueue", "--queue", "nothing", "untagged"],
    )
    .await;
    let plain: i64 = out.trim().parse().unwrap();
    assert_eq!(tagged(&client, plain).await, (None, None));
    let (_, out, _) = pgtaskd(Some(&db.url), &["status", &plain.to_string()]).await;
    assert!(
        !out.contains("tags:") && !out.contains("metadata:"),
        "{out}"
    );

    // HTTP: a JSON body, whose metadata's numbers stay as written, and a text body's query.
    let (daemon, http) = daemon_with_http(&db).await;
    let (status, accepted) = http
        .post_json(
            r#"{"payload": "x", "queue": "nothing", "tags": ["a", "b.c"],
                "metadata": {"build": 12345678901234567890123, "owner": {"name": "ann"}}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let (status, task) = http.get(&format!("/tasks/{}", accepted["id"])).await;
    assert_eq!(status, StatusCode::OK, "{task}");
    assert_eq!(task["tags"], json!(["a", "b.c"]));
    assert_eq!(task["metadata"]["owner"], json!({"name": "ann"}));
    let text = http.get_text(&format!("/tasks/{}", accepted["id"])).await;
    assert!(
        text.contains(r#""metadata":{"build": 12345678901234567890123, "owner": {"name": "ann"}}"#),
        "the metadata as the database prints it, its number not rounded: {text}"
    );
    let (status, accepted) = http
        .post_text(
            "queue=nothing&tags=q1,q2&metadata=%7B%22k%22%3A%22v%22%7D",
            "text",
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_i64().unwrap();
    assert_eq!(
        tagged(&client, id).await,
        (tags(&["q1", "q2"]), Some(r#"{"k": "v"}"#.to_string()))
    );
    // null and an empty list are none.
    let (status, accepted) = http
        .post_json(r#"{"payload": "x", "queue": "nothing", "tags": [], "metadata": null}"#)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(
        tagged(&client, accepted["id"].as_i64().unwrap()).await,
        (None, None)
    );
    // The list rows carry the tags.
    let (_, page) = http.get("/tasks?queue=nothing&limit=500").await;
    let row = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["id"] == json!(id))
        .cloned()
        .unwrap();
    assert_eq!(row["tags"], json!(["q1", "q2"]));
    daemon.stop().await;

    // SQL, as a producer: the INSERT, and a graph.
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload, tags, metadata)
             VALUES ('nothing', 'sql', ARRAY['from-sql'], '{\"k\": \"sql\"}') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tagged(&client, id).await,
        (tags(&["from-sql"]), Some(r#"{"k": "sql"}"#.to_string()))
    );
    let (status, out, _) = pgtaskd(Some(&db.url), &["list", "--tag", "from-sql", "--json"]).await;
    assert!(status.success());
    let row: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (row["id"].as_i64(), &row["tags"]),
        (Some(id), &json!(["from-sql"]))
    );
    let graph: i64 = client
        .query_one(
            "SELECT task_id FROM pgtaskd.enqueue_graph(
                 '[{\"ref\": \"g\", \"payload\": \"p\", \"queue\": \"nothing\",
                    \"tags\": [\"graph\"], \"metadata\": {\"k\": \"graph\"}}]')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tagged(&client, graph).await,
        (tags(&["graph"]), Some(r#"{"k": "graph"}"#.to_string()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tags_and_metadata_are_refused_before_any_insert() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let over = format!("k={}", "x".repeat(8200));
    let seventeen: Vec<String> = (0..17)
        .flat_map(|i| ["--tag".into(), format!("t{i}")])
        .collect();
    let mut cli_cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--tag".into(), "a b".into()], "tag \"a b\" is not"),
        (vec!["--tag=-lead".into()], "tag \"-lead\""),
        (
            vec!["--tag".into(), "x".repeat(64)],
            "is not a letter or digit",
        ),
        (seventeen, "17 tags; the limit is 16"),
        (
            vec!["--meta".into(), "k=1".into(), "--meta".into(), "k=2".into()],
            "metadata key \"k\" is given twice",
        ),
        (vec!["--meta".into(), "novalue".into()], "is not KEY=VALUE"),
        (vec!["--meta".into(), over], "the limit is 8192"),
    ];
    // The streamed file path checks them as well.
    let file = TempPath::write("file");
    cli_cases.push((
        vec![
            "--file".into(),
            file.path().display().to_string(),
            "--tag".into(),
            "a,b".into(),
        ],
        "tag \"a,b\"",
    ));
    for (extra, says) in cli_cases {
        let mut args: Vec<String> = vec!["enqueue".into()];
        args.extend(extra.iter().cloned());
        if !extra.contains(&"--file".to_string()) {
            args.push("payload".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, out, err) = pgtaskd(Some(&db.url), &args).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    let (daemon, http) = daemon_with_http(&db).await;
    let big = format!(r#"{{"k": "{}"}}"#, "x".repeat(8192 - 8));
    for (body, says) in [
        (
            r#"{"payload": "x", "tags": ["ok", "not ok"]}"#.to_string(),
            "tag \"not ok\" is not",
        ),
        (
            r#"{"payload": "x", "tags": "a"}"#.to_string(),
            "tags must be a list of strings",
        ),
        (
            r#"{"payload": "x", "tags": [null]}"#.to_string(),
            "tags must be a list of strings",
        ),
        (
            format!(
                r#"{{"payload": "x", "tags": {}}}"#,
                json!((0..17).map(|i| format!("t{i}")).collect::<Vec<_>>())
            ),
            "17 tags",
        ),
        (
            r#"{"payload": "x", "metadata": [1]}"#.to_string(),
            "metadata must be a JSON object",
        ),
        (
            r#"{"payload": "x", "metadata": "k"}"#.to_string(),
            "metadata must be a JSON object",
        ),
        (
            r#"{"payload": "x", "metadata": {"k": "a\u0000"}}"#.to_string(),
            "NUL",
        ),
        (
            format!(r#"{{"payload": "x", "metadata": {big}}}"#),
            "8193 bytes",
        ),
    ] {
        let (status, error) = http.post_json(&body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body:.80}: {error}"
        );
        let text = error["error"].as_str().unwrap();
        assert!(text.contains(says), "{body:.80}: {text}");
    }
    for (query, says) in [
        ("tags=a,b%20c", "tag \"b c\""),
        ("metadata=%5B%5D", "metadata must be a JSON object"),
        ("metadata=nope", "metadata must be a JSON object"),
    ] {
        let (status, error) = http.post_text(query, "x").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{query}: {error}");
        assert!(
            error["error"].as_str().unwrap().contains(says),
            "{query}: {error}"
        );
    }
    // 8192 bytes as printed fit: `{"k": "` and `"}` are 9 of them.
    let fits = format!(r#"{{"k":"{}"}}"#, "x".repeat(8192 - 9));
    let (status, accepted) = http
        .post_json(&format!(
            r#"{{"payload": "x", "queue": "nothing", "metadata": {fits}}}"#
        ))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    daemon.stop().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
        1
    );

    // The table's checks stand behind them for every other writer.
    for (insert, check) in [
        ("tags) VALUES ('x', ARRAY['a b'])", "tasks_tags_check"),
        ("tags) VALUES ('x', ARRAY['a', NULL])", "tasks_tags_check"),
        ("metadata) VALUES ('x', '[1]')", "tasks_metadata_check"),
    ] {
        let err = client
            .execute(
                &format!("INSERT INTO pgtaskd.tasks (payload, {insert}"),
                &[],
            )
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains(check) || format!("{err:?}").contains(check),
            "{err:?}"
        );
    }
}

/// The Rust check of the size reads the metadata as the database prints it: the two agree on
/// keys given twice, their order, escapes and numbers.
#[tokio::test]
async fn metadata_is_measured_as_the_database_prints_it() {
    let db = TestDb::new().await;
    let client = db.client().await;
    for json in [
        r#"{"b": 1, "a": [ ], "aa": {}, "": null}"#,
        r#"{"k": 1, "k": 2, "k2": true}"#,
        r#"{"n": [1e3, 1.5e1, 1.25e1, 125e-1, 1e-3, 1.0e-3, -0, -0.0, 0.012e3, 0e5, 1E+2]}"#,
        r#"{"n": [-1.50, 100e-2, 12345678901234567890123, 0.1e-7, 5e20, -7.25E-1]}"#,
        r#"{"s": "\u00e9\t\"\\\/\u0001\u001f\u007f\ud83e\udd80 日本"}"#,
        r#"{"é": "é", "z": "y", "ab": "ab", "b": "b"}"#,
    ] {
        let printed: String = client
            .query_one("SELECT $1::text::jsonb::text", &[&json])
            .await
            .unwrap()
            .get(0);
        assert_eq!(jsonb_text(json).unwrap(), printed, "{json}");
    }
}

/// Tasks in two queues and four statuses with every mix of the tags a and b and the metadata
/// k = v; the ids that have `tags @> {a,b}` and `metadata @> {"k": "v"}`, newest first.
async fn tagged_tasks(client: &Client) -> Vec<i64> {
    for i in 0..48 {
        let tags: Option<Vec<&str>> = match i % 4 {
            0 => None,
            1 => Some(vec!["a"]),
            2 => Some(vec!["b", "a", "c"]),
            _ => Some(vec!["a", "b"]),
        };
        let metadata = match i % 3 {
            0 => None,
            1 => Some(r#"{"k": "v", "n": 1}"#),
            _ => Some(r#"{"k": "w"}"#),
        };
        let queue = if i % 5 == 0 { "other" } else { "tagged" };
        let id: i64 = client
            .query_one(
                "INSERT INTO pgtaskd.tasks (queue, payload, tags, metadata)
                 VALUES ($1, 'p', $2, $3::text::jsonb) RETURNING id",
                &[&queue, &tags, &metadata],
            )
            .await
            .unwrap()
            .get(0);
        let set = match i % 7 {
            0 | 1 => Some("status = 'SUCCEEDED', attempt = 1, started_at = now(), finished_at = now()"),
            2 => Some("status = 'FAILED', attempt = 3, started_at = now(), finished_at = now(), error = 'x'"),
            3 => Some("status = 'CANCELED', cancel_requested = true, finished_at = now()"),
            _ => None,
        };
        if let Some(set) = set {
            set_state(client, id, set).await.unwrap();
        }
    }
    ids(
        client,
        "SELECT id FROM pgtaskd.task_view WHERE tags @> '{a,b}' AND metadata @> '{\"k\": \"v\"}' \
         ORDER BY id DESC",
    )
    .await
}

async fn ids(client: &Client, sql: &str) -> Vec<i64> {
    client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn listed_ids(out: &str) -> Vec<i64> {
    out.lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_get_tasks_find_the_tasks_with_every_term_newest_first_a_page_at_a_time() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let expected = tagged_tasks(&client).await;
    assert_eq!(expected.len(), 8, "{expected:?}");

    // The CLI, three rows at a time with --after.
    let terms = ["--tag", "a", "--tag", "b", "--meta", "k=v"];
    let mut shown = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let mut args = vec!["list", "--json", "--limit", "3"];
        args.extend(terms);
        let after_text = after.map(|id| id.to_string());
        if let Some(after) = &after_text {
            args.extend(["--after", after]);
        }
        let (status, out, err) = pgtaskd(Some(&db.url), &args).await;
        assert!(status.success(), "{err}");
        let page = listed_ids(&out);
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3);
        after = page.last().copied();
        shown.extend(page);
    }
    assert_eq!(shown, expected);
    // Combined with --queue and --status.
    let (_, out, _) = pgtaskd(
        Some(&db.url),
        &[
            "list",
            "--json",
            "--tag",
            "a",
            "--status",
            "succeeded",
            "--queue",
            "tagged",
        ],
    )
    .await;
    let want = ids(
        &client,
        "SELECT id FROM pgtaskd.task_view WHERE tags @> '{a}' AND status = 'SUCCEEDED' \
         AND queue = 'tagged' ORDER BY id DESC LIMIT 20",
    )
    .await;
    assert!(!want.is_empty());
    assert_eq!(listed_ids(&out), want);
    let (status, out, err) =
        pgtaskd(Some(&db.url), &["list", "--tag", "a", "--meta", "k=none"]).await;
    assert!(status.success() && out.is_empty(), "{out}");
    assert!(err.contains("no tasks tagged a with k=none"), "{err}");
    // A term no task can have is refused before connecting, as the HTTP API refuses it.
    for (args, says) in [
        (vec!["list", "--tag", "a b"], "tag \"a b\""),
        (
            vec!["list", "--meta", "k=1", "--meta", "k=2"],
            "given twice",
        ),
        (vec!["list", "--meta", "k"], "is not KEY=VALUE"),
    ] {
        let (status, _, err) = pgtaskd(Some(&db.url), &args).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }

    // GET /tasks, by its cursor.
    let (daemon, http) = daemon_with_http(&db).await;
    let mut shown = Vec::new();
    let mut path = "/tasks?tag=a&tag=b&meta=k:v&limit=3".to_string();
    loop {
        let (status, page) = http.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for row in page["tasks"].as_array().unwrap() {
            let tags = row["tags"].as_array().unwrap();
            assert!(
                tags.contains(&json!("a")) && tags.contains(&json!("b")),
                "{row}"
            );
            shown.push(row["id"].as_i64().unwrap());
        }
        match page["next"].as_i64() {
            Some(next) => path = format!("/tasks?tag=a&tag=b&meta=k:v&limit=3&after={next}"),
            None => break,
        }
    }
    assert_eq!(shown, expected);
    let (_, page) = http
        .get("/tasks?tag=a&status=SUCCEEDED&queue=tagged&limit=20")
        .await;
    let got: Vec<i64> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, want);
    for (query, says) in [
        ("tag=a%20b", "tag \"a b\""),
        ("meta=k", "is not KEY:VALUE"),
        ("meta=k:1&meta=k:2", "given twice"),
    ] {
        let (status, error) = http.get(&format!("/tasks?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
        assert!(
            error["error"].as_str().unwrap().contains(says),
            "{query}: {error}"
        );
    }
    daemon.stop().await;
}

/// The tags' and the metadata's terms are found through the task table's GIN indexes, not by
/// a filter on the view's columns over every state row: the plan of the statement `list`
/// issues names `tasks_tags_idx` and `tasks_metadata_idx`. The table is small, so the
/// session turns sequential scans off: a filter on the view's columns could use neither
/// index, whatever the planner's costs.
#[tokio::test]
async fn the_filters_are_served_by_the_gin_indexes() {
    let db = TestDb::new().await;
    let client = db.client().await;
    tagged_tasks(&client).await;
    client
        .batch_execute("ANALYZE pgtaskd.tasks, pgtaskd.task_state; SET enable_seqscan = off")
        .await
        .unwrap();
    let metadata = Metadata::from_pairs(&[("k".into(), "v".into())]).unwrap();
    for filter in [
        ListFilter {
            tags: vec!["a".into(), "b".into()],
            ..ListFilter::latest(50)
        },
        ListFilter {
            tags: vec!["a".into()],
            status: Some(TaskStatus::Succeeded),
            after: Some(1_000_000),
            ..ListFilter::latest(50)
        },
        ListFilter {
            tags: vec!["a".into()],
            queue: Some("tagged".into()),
            ..ListFilter::latest(50)
        },
        ListFilter {
            metadata: metadata.clone(),
            ..ListFilter::latest(50)
        },
        ListFilter {
            tags: vec!["a".into()],
            metadata: metadata.clone(),
            status: Some(TaskStatus::Queued),
            ..ListFilter::latest(50)
        },
    ] {
        let plan = within(
            WAIT,
            "the plan",
            queue::list::explain(&client, &filter, "COSTS OFF"),
        )
        .await
        .unwrap()
        .join("\n");
        // With both, the planner may read either index and check the other term.
        let by_tags = plan.contains("tasks_tags_idx");
        let by_metadata = plan.contains("tasks_metadata_idx");
        match (filter.tags.is_empty(), filter.metadata.is_some()) {
            (false, false) => assert!(by_tags, "{filter:?}:\n{plan}"),
            (true, true) => assert!(by_metadata, "{filter:?}:\n{plan}"),
            _ => assert!(by_tags || by_metadata, "{filter:?}:\n{plan}"),
        }
        // The ids are found first (an InitPlan), then read through the state table's keys.
        assert!(plan.contains("InitPlan"), "{filter:?}:\n{plan}");
        let rows = queue::list(&client, &filter).await.unwrap();
        assert!(!rows.is_empty(), "{filter:?}");
    }
}
