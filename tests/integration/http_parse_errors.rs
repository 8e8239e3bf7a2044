//! Requests the server cannot parse: hyper's own answers to a malformed head (400, 414, 431)
//! and axum's to a broken chunked body carry the API's JSON error body, and the connection
//! closes after them.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http_limits::{connect, daemon_with_http, json_error, read_response};
use crate::support::{within, TestDb, WAIT};

/// Everything the server sends on `stream` until it closes the connection.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    within(WAIT, "the connection's end", stream.read_to_end(&mut all))
        .await
        .expect("read until the server closes");
    String::from_utf8_lossy(&all).into_owned()
}

/// hyper answers a request head it cannot parse by itself, before any route: that answer
/// keeps hyper's status (400, 414, 431) but carries the JSON error body, and the connection
/// closes after it. An answer already due to an earlier, valid request on the connection
/// goes out whole before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_heads_get_their_status_with_a_json_error_body() {
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(&db, "").await;
    let long_header = format!(
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Long: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let long_uri = format!(
        "GET /{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "a".repeat(100_000)
    );
    let cases: [(&str, &[u8], u16, &str); 5] = [
        ("a garbage request line", b"GARBAGE\r\n\r\n", 400, "method"),
        (
            "a header line without a colon",
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n",
            400,
            "header",
        ),
        (
            "a bad content-length",
            b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: ten\r\n\r\n",
            400,
            "content-length",
        ),
        (
            "a header over the head's buffer",
            long_header.as_bytes(),
            431,
            "too large",
        ),
        ("a URI too long", long_uri.as_bytes(), 414, "URI too long"),
    ];
    for (what, request, status, words) in cases {
        let mut stream = connect(port).await;
        // The server may answer and close before it read all of a long head.
        let _ = within(WAIT, what, stream.write_all(request)).await;
        let (got, body) = within(WAIT, what, read_response(&mut stream)).await;
        assert_eq!(got, status, "{what}: {body}");
        let error = json_error(&body);
        assert!(error.starts_with("bad HTTP request: "), "{what}: {error}");
        assert!(error.contains(words), "{what}: {error}");
        let mut rest = Vec::new();
        let _ = within(WAIT, "the connection's end", stream.read_to_end(&mut rest)).await;
        assert!(rest.is_empty(), "{what}: {rest:?}");
    }

    let mut stream = connect(port).await;
    within(
        WAIT,
        "a valid request, then garbage",
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\nGARBAGE\r\n\r\n"),
    )
    .await
    .unwrap();
    let all = read_to_close(&mut stream).await;
    let (first, second) = all
        .split_once("HTTP/1.1 400")
        .unwrap_or_else(|| panic!("no 400 after the first answer: {all:?}"));
    assert!(first.starts_with("HTTP/1.1 200"), "{all:?}");
    assert!(first.ends_with("{\"status\":\"ok\"}"), "{all:?}");
    let body = second.split_once("\r\n\r\n").unwrap().1;
    assert!(json_error(body).starts_with("bad HTTP request"), "{all:?}");
    daemon.stop().await;
}

/// A chunked body that breaks its encoding: axum's answer is a text 400; it carries the JSON
/// error body too, and nothing is inserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_gets_400_with_a_json_error() {
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(&db, "").await;
    let mut stream = connect(port).await;
    within(
        WAIT,
        "a chunked body with a bad chunk size",
        stream.write_all(
            b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n\
              Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        ),
    )
    .await
    .unwrap();
    let (status, body) = within(WAIT, "the 400", read_response(&mut stream)).await;
    assert_eq!(status, 400, "{body}");
    assert!(json_error(&body).contains("body"), "{body}");
    let client = db.client().await;
    let tasks: i64 = client
        .query_one("SELECT count(*) FROM pgtaskd.task_view", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tasks, 0);
    daemon.stop().await;
}
