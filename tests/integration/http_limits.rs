//! The HTTP server's limits against slow, oversized and malformed clients: a deadline on
//! request headers, a cap on open connections that keeps descriptors bounded, 413 before the
//! body is read, and JSON error bodies for the answers the routing, the deadlines and hyper's
//! parser make.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::daemon::{binary, tempfile_path::TempPath};
use crate::support::{eventually, free_port, within, GatedAnalyzer, InProcessDaemon, TestDb, WAIT};

pub(crate) async fn daemon_with_http(db: &TestDb, extra: &str) -> (InProcessDaemon, u16) {
    let port = free_port();
    let config = db.config(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n{extra}"));
    let daemon = InProcessDaemon::start(db, config, GatedAnalyzer::counting()).await;
    (daemon, port)
}

/// Read one HTTP/1.1 response (head, then a body of its `content-length`): (status, body).
pub(crate) async fn read_response(stream: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.expect("read a response");
        assert!(n > 0, "connection closed before a response head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.expect("read a response body");
        assert!(n > 0, "connection closed inside a response body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
    (status, body)
}

pub(crate) async fn connect(port: u16) -> TcpStream {
    within(
        WAIT,
        "a connection",
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .unwrap()
}

pub(crate) fn json_error(body: &str) -> String {
    let value: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body:?}"));
    value["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message: {body}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_one_gigabyte_body_gets_413_at_once_with_a_json_error() {
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(&db, "").await;
    let mut stream = connect(port).await;
    let head = b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n\
                 Content-Length: 1000000000\r\n\r\nabc";
    within(WAIT, "sending the head", stream.write_all(head))
        .await
        .unwrap();
    // Far less than the request deadline: the answer must not wait for the body.
    let (status, body) = within(
        Duration::from_secs(5),
        "the answer to a body declared too large",
        read_response(&mut stream),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(json_error(&body).contains("1048576"), "{body}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_gets_405_and_an_unknown_route_404_each_with_a_json_error() {
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(&db, "").await;
    let client = reqwest::Client::new();
    let response = within(
        WAIT,
        "DELETE /tasks",
        client
            .delete(format!("http://127.0.0.1:{port}/tasks"))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::METHOD_NOT_ALLOWED);
    let allow = response.headers()["allow"].to_str().unwrap().to_string();
    assert!(allow.contains("POST"), "{allow}");
    let body = within(WAIT, "the 405 body", response.text()).await.unwrap();
    assert_eq!(json_error(&body), "method not allowed");

    let response = within(
        WAIT,
        "GET /nowhere",
        client
            .get(format!("http://127.0.0.1:{port}/nowhere"))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::NOT_FOUND);
    let body = within(WAIT, "the 404 body", response.text()).await.unwrap();
    json_error(&body);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_closed_after_the_header_deadline() {
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(&db, "header_timeout = \"1s\"\n").await;
    let mut stream = connect(port).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ".iter();
    let trickle = request.chain(std::iter::repeat(&b'a'));
    let started = Instant::now();
    let mut closed_after = None;
    // One byte every 250 ms, for at most 10 s: far past the 1 s deadline.
    for &byte in trickle.take(40) {
        if within(WAIT, "one byte sent", stream.write_all(&[byte]))
            .await
            .is_err()
        {
            closed_after = Some(started.elapsed());
            break;
        }
        let mut chunk = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(250), stream.read(&mut chunk)).await {
            Err(_) => continue,
            Ok(Ok(n)) if n > 0 => continue,
            Ok(_) => {
                closed_after = Some(started.elapsed());
                break;
            }
        }
    }
    let closed_after = closed_after.expect("the server kept a trickling client for 10 s");
    assert!(
        closed_after < Duration::from_secs(5),
        "closed only after {closed_after:?}"
    );
    daemon.stop().await;
}

/// A client that sends the head of a `POST /tasks` with a 100-byte body and `Expect:
/// 100-continue`, then one byte of the body, and returns once the server's `100 Continue`
/// says a handler is reading the body: the connection is then answering a request.
async fn trickling_client(port: u16) -> TcpStream {
    let mut stream = connect(port).await;
    within(
        WAIT,
        "a request head",
        stream.write_all(
            b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n\
              Content-Length: 100\r\nExpect: 100-continue\r\n\r\n",
        ),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut chunk = [0u8; 256];
        let n = within(WAIT, "100 Continue", stream.read(&mut chunk))
            .await
            .unwrap();
        assert!(n > 0, "closed before 100 Continue: {seen:?}");
        seen.extend_from_slice(&chunk[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 100"), "{seen:?}");
    within(WAIT, "one byte of the body", stream.write_all(b"x"))
        .await
        .unwrap();
    stream
}

/// `http.max_connections` clients trickling their bodies used to hold every place for the
/// 30 s request deadline: a connection waiting for its client's body now counts as idle,
/// so a prompt client takes the oldest one's place at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_trickling_their_bodies_at_the_cap_do_not_shut_out_healthz() {
    const MAX_CONNECTIONS: usize = 4;
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(
        &db,
        &format!("header_timeout = \"60s\"\nmax_connections = {MAX_CONNECTIONS}\n"),
    )
    .await;
    let mut tricklers = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        tricklers.push(trickling_client(port).await);
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    within(
        Duration::from_secs(5),
        "/healthz with every place held by a trickling client",
        healthz(&client, port),
    )
    .await
    .expect("/healthz answered");
    // The oldest trickler gave its place.
    let mut chunk = [0u8; 64];
    let n = within(
        WAIT,
        "the evicted connection's end",
        tricklers[0].read(&mut chunk),
    )
    .await
    .unwrap_or(0);
    assert_eq!(n, 0, "{:?}", &chunk[..n]);
    daemon.stop().await;
}

/// The whole body must arrive within `http.header_timeout` of the end of the head: a body
/// trickled past it is 408 with the JSON error body, and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_not_sent_within_the_deadline_gets_408_with_a_json_error_and_a_close() {
    let db = TestDb::new().await;
    let (daemon, port) = daemon_with_http(&db, "header_timeout = \"1s\"\n").await;
    let mut stream = trickling_client(port).await;
    let (status, body) = within(WAIT, "the 408", read_response(&mut stream)).await;
    assert_eq!(status, 408, "{body}");
    assert_eq!(json_error(&body), "request timed out");
    let mut chunk = [0u8; 64];
    let n = within(WAIT, "the connection's end", stream.read(&mut chunk))
        .await
        .unwrap_or(0);
    assert_eq!(n, 0, "{:?}", &chunk[..n]);
    let client = db.client().await;
    let tasks: i64 = client
        .query_one("SELECT count(*) FROM pgtaskd.task_view", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tasks, 0);
    daemon.stop().await;
}

/// `pgtaskd run` as a process of its own whose descriptors are limited to `nofile`, as a
/// systemd service's are by default; its log goes to a file.
struct LimitedDaemon {
    child: Child,
    log: TempPath,
    _config: TempPath,
}

impl LimitedDaemon {
    fn start(db: &TestDb, config_toml: &str, nofile: u64) -> LimitedDaemon {
        let config = TempPath::write(config_toml);
        let log = TempPath::write("");
        let mut command = Command::new(binary());
        command
            .arg("run")
            .arg("--config")
            .arg(config.path())
            .env_remove("PGTASKD_CONFIG")
            .env("PGTASKD_DATABASE_URL", &db.url)
            .env("RUST_LOG", "pgtaskd=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log.path()).unwrap());
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("pgtaskd starts");
        LimitedDaemon {
            child,
            log,
            _config: config,
        }
    }

    fn open_descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|entries| entries.count())
            .unwrap_or(0)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for LimitedDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn healthz(client: &reqwest::Client, port: u16) -> Option<()> {
    let response = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    (response.status() == reqwest::StatusCode::OK).then_some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_stalled_clients_than_descriptors_neither_exhaust_them_nor_silence_healthz() {
    // More than the 1,024 descriptors the daemon may open.
    const STALLED: usize = 1_100;
    const MAX_CONNECTIONS: usize = 512;
    let db = TestDb::new().await;
    let port = free_port();
    let daemon = LimitedDaemon::start(
        &db,
        &format!(
            "[http]\nlisten = \"127.0.0.1:{port}\"\nheader_timeout = \"60s\"\n\
             max_connections = {MAX_CONNECTIONS}\n"
        ),
        1024,
    );
    // Each attempt opens a new connection: no pool can hide a refused one.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    eventually(WAIT, "the daemon's first /healthz", || {
        healthz(&client, port)
    })
    .await;

    // Each connection sends the first byte of a request and stalls.
    let mut stalled = Vec::with_capacity(STALLED);
    let mut most_descriptors = 0;
    let started = Instant::now();
    for i in 0..STALLED {
        if started.elapsed() > WAIT {
            break;
        }
        let connect = TcpStream::connect(("127.0.0.1", port));
        if let Ok(Ok(mut stream)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(b"G")).await;
            stalled.push(stream);
        }
        if i % 50 == 49 {
            most_descriptors = most_descriptors.max(daemon.open_descriptors());
        }
    }
    most_descriptors = most_descriptors.max(daemon.open_descriptors());

    // Long before the header deadline lets any of them go.
    eventually(
        Duration::from_secs(10),
        "/healthz with 1,100 stalled clients connected",
        || healthz(&client, port),
    )
    .await;
    assert!(
        most_descriptors <= MAX_CONNECTIONS + 64,
        "the daemon held {most_descriptors} descriptors\n{}",
        daemon.log_text()
    );
    drop(stalled);
}

/// Requests waiting for a task (`?wait=`) never take every place of `http.max_connections`:
/// past all but a reserve (an eighth, at least one), a wait is answered at once with the row
/// as it is, so `/healthz`, the liveness probe, still gets in (with every place busy waiting
/// it was refused for the whole wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_leave_room_for_healthz() {
    const MAX_CONNECTIONS: usize = 8;
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute("SELECT pgtaskd.pause_queue('default')")
        .await
        .unwrap();
    let id = crate::support::enqueue(&client, "never claimed").await;
    let (daemon, port) =
        daemon_with_http(&db, &format!("max_connections = {MAX_CONNECTIONS}\n")).await;
    let mut waiters = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut stream = connect(port).await;
        stream
            .write_all(
                format!("GET /tasks/{id}?wait=30s HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        waiters.push(stream);
    }
    // The one past the waiters' room is answered at once, the task as it is.
    let answers = waiters
        .iter_mut()
        .map(|stream| Box::pin(read_response(stream)));
    let ((status, body), _, pending) = within(
        Duration::from_secs(10),
        "the wait past the room to be answered",
        futures_util::future::select_all(answers),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"status\":\"QUEUED\""), "{body}");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    within(
        Duration::from_secs(5),
        "/healthz while the others wait",
        healthz(&http, port),
    )
    .await
    .expect("/healthz answered");
    // The others are still waiting.
    let still = tokio::time::timeout(
        Duration::from_millis(200),
        futures_util::future::select_all(pending),
    )
    .await;
    assert!(still.is_err(), "a waiter was answered early");
    daemon.stop().await;
}
