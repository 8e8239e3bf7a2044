//! Answers of large payloads and the HTTP server's byte budget (`http.max_inflight_bytes`):
//! past it a read of a large payload is 503 with `Retry-After`, and a client that stops
//! reading a large answer loses its connection and gives back its share.

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http_limits::{connect, daemon_with_http, json_error};
use crate::support::{eventually, within, TestDb, WAIT};

/// Send `GET path` on a new connection and read only the head of the answer: its status and
/// `content-length`. The client reads no more, so an answer larger than the sockets' buffers
/// stays in progress.
async fn get_head_only(port: u16, path: &str) -> (TcpStream, u16, usize) {
    let mut stream = connect(port).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    within(WAIT, "a request", stream.write_all(request.as_bytes()))
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = within(WAIT, "an answer's head", stream.read(&mut byte))
            .await
            .unwrap();
        assert!(n > 0, "closed before an answer's head: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .map_or(0, |value| value.trim().parse().unwrap());
    (stream, status, length)
}

/// Answers of large payloads hold at most `http.max_inflight_bytes` together: while two
/// answers of a 25 MiB payload are being sent (their clients read only the heads), a third
/// read of it is 503 with `Retry-After` and the JSON error body, a small payload is still
/// read, and once one client has read its answer to the end, the payload is read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_large_payloads_past_the_http_byte_budget_get_503_with_retry_after() {
    // "word " five million times: 25 MiB, far more than the sockets' buffers.
    const WORDS: i32 = 5 << 20;
    const PAYLOAD: usize = 5 * WORDS as usize;
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(
        &db,
        "max_inflight_bytes = \"60MiB\"\nheader_timeout = \"60s\"\n",
    )
    .await;
    let client = db.client().await;
    let large: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) VALUES (repeat('word ', $1)) RETURNING id",
            &[&WORDS],
        )
        .await
        .unwrap()
        .get(0);
    let small = crate::support::enqueue(&client, "a few words").await;
    let path = format!("/tasks/{large}");

    let (mut first, status, length) = get_head_only(port, &path).await;
    assert_eq!(status, 200);
    assert!(length > PAYLOAD, "{length}");
    let (_second, status, _) = get_head_only(port, &path).await;
    assert_eq!(status, 200);

    let mut third = connect(port).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    within(WAIT, "a third read", third.write_all(request.as_bytes()))
        .await
        .unwrap();
    let mut head = Vec::new();
    let (status, body) = {
        let mut chunk = [0u8; 4096];
        loop {
            let n = within(WAIT, "the 503", third.read(&mut chunk))
                .await
                .unwrap();
            assert!(n > 0, "closed: {head:?}");
            head.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&head).into_owned();
            if let Some((h, b)) = text.split_once("\r\n\r\n") {
                if b.ends_with('}') {
                    break (h.to_string(), b.to_string());
                }
            }
        }
    };
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
    assert!(
        status.to_ascii_lowercase().contains("retry-after: "),
        "{status}"
    );
    assert!(
        json_error(&body).contains("http.max_inflight_bytes"),
        "{body}"
    );

    let api = reqwest::Client::new();
    let response = within(
        WAIT,
        "a small payload's read",
        api.get(format!("http://127.0.0.1:{port}/tasks/{small}"))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);

    let mut body = vec![0u8; length];
    within(WAIT, "the first answer, whole", first.read_exact(&mut body))
        .await
        .unwrap();
    let task: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(task["payload"].as_str().unwrap().len(), PAYLOAD);

    let response = within(
        WAIT,
        "the large payload's read once there is room",
        api.get(format!("http://127.0.0.1:{port}{path}")).send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let task: Value = within(WAIT, "its body", response.json()).await.unwrap();
    assert_eq!(task["payload"].as_str().unwrap().len(), PAYLOAD);
    assert_eq!(task["id"], large);
    daemon.stop().await;
}

/// A handler's output counts against the budget as a payload does (an output of up to 64 MiB
/// with a payload of a few bytes was built whole for every reader, 1.3 GB for ten): while one
/// client reads the answer of a task with a 10 MiB output of quotes slowly, a second read of
/// it is 503; the first answer is whole and exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_output_counts_against_the_http_byte_budget() {
    const OUTPUT: i32 = 10 << 20;
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(
        &db,
        "max_inflight_bytes = \"15MiB\"\nheader_timeout = \"60s\"\n",
    )
    .await;
    let client = db.client().await;
    // A queue no daemon serves, finished as a handler would have finished it.
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('small', 'elsewhere') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    client
        .execute(
            "UPDATE pgtaskd.task_state SET status = 'SUCCEEDED', attempt = 1, started_at = now(),
                    finished_at = now(), output = repeat('\"', $2) WHERE id = $1",
            &[&id, &OUTPUT],
        )
        .await
        .unwrap();
    let path = format!("/tasks/{id}");
    let (mut first, status, length) = get_head_only(port, &path).await;
    assert_eq!(status, 200);
    let (_second, status, _) = get_head_only(port, &path).await;
    assert_eq!(
        status, 503,
        "the second answer of the output fits no budget"
    );
    let mut body = vec![0u8; length];
    within(WAIT, "the first answer, whole", first.read_exact(&mut body))
        .await
        .unwrap();
    let task: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(task["output"].as_str().unwrap().len(), OUTPUT as usize);
    assert_eq!(task["payload"], "small");
    daemon.stop().await;
}

/// A client that stops reading a large answer loses its connection after
/// `http.header_timeout` without progress, and with it the answer's share of
/// `http.max_inflight_bytes`: the next read of the payload is then answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_large_answer_gives_back_its_share_of_the_budget() {
    const WORDS: i32 = 5 << 20;
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(
        &db,
        "max_inflight_bytes = \"30MiB\"\nheader_timeout = \"1s\"\n",
    )
    .await;
    let client = db.client().await;
    let large: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) VALUES (repeat('word ', $1)) RETURNING id",
            &[&WORDS],
        )
        .await
        .unwrap()
        .get(0);
    let path = format!("/tasks/{large}");
    let (_stalled, status, _) = get_head_only(port, &path).await;
    assert_eq!(status, 200);
    let api = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}{path}");
    let task: Value = eventually(WAIT, "a read once the stalled client is gone", || async {
        let response = api.get(&url).send().await.ok()?;
        match response.status() {
            reqwest::StatusCode::OK => response.json().await.ok(),
            reqwest::StatusCode::SERVICE_UNAVAILABLE => None,
            other => panic!("{other}"),
        }
    })
    .await;
    assert_eq!(task["payload"].as_str().unwrap().len(), 5 * WORDS as usize);
    daemon.stop().await;
}

/// A large payload's answer, written as the client takes it, is the payload exactly: every
/// width of character, quotes, backslashes and control characters, cut at any chunk boundary,
/// with the other fields around it and a `content-length` that is the body's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_payload_is_answered_exactly_with_its_length() {
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(&db, "").await;
    let client = db.client().await;
    // Not served by the daemon (it claims "default" only), so the row holds still.
    let (id, payload): (i64, String) = {
        let row = client
            .query_one(
                "INSERT INTO pgtaskd.tasks (queue, payload, idempotency_key)
                 SELECT 'elsewhere', string_agg('é\"\\日🦀' || E'\\n\\t\\x01' || g, ''), 'k\"ey'
                   FROM generate_series(1, 120000) AS g
                 RETURNING id, payload",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(payload.len() > 2 << 20, "{}", payload.len());
    let response = within(
        WAIT,
        "the read",
        reqwest::get(format!("http://127.0.0.1:{port}/tasks/{id}")),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let length = response.content_length().expect("a content-length");
    let body = within(WAIT, "the body", response.bytes()).await.unwrap();
    assert_eq!(body.len() as u64, length);
    let task: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(task["payload"].as_str(), Some(payload.as_str()));
    assert_eq!(task["id"], id);
    assert_eq!(task["queue"], "elsewhere");
    assert_eq!(task["idempotency_key"], "k\"ey");
    assert_eq!(task["status"], "QUEUED");
    daemon.stop().await;
}
