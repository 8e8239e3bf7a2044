//! The `http` handler against real HTTP servers on loopback ports (no database): what it
//! sends, what each answer means for the attempt, its timeout, its cancel, its keep-alive
//! pool, and the Node endpoint of docs/examples (docs/handlers.md, "http").

pub(crate) mod server;

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use futures_util::stream;
use pgtaskd::handler::http::{HttpClient, HttpSpec};
use pgtaskd::handler::{Failure, FailureKind, Job, Ran, Retry};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use self::server::{respond, SilentServer, TestServer};
use crate::support::{free_port, within, WAIT};

fn job(traceparent: Option<&str>) -> Job {
    Job {
        id: 4242,
        attempt: 3,
        queue: "mail".to_string(),
        token: 987_654_321,
        run: 5,
        key: "0123456789abcdef-4242-1765000000000000".to_string(),
        idempotency_key: Some("order-17".to_string()),
        traceparent: traceparent.map(str::to_string),
        parents: None,
        parent_count: 0,
        progress: None,
        batch: None,
        batch_counts: None,
    }
}

fn spec(url: &str) -> HttpSpec {
    HttpSpec {
        url: url.to_string(),
        timeout: Duration::from_secs(10),
        max_output: 64 * 1024,
    }
}

fn client() -> HttpClient {
    HttpClient::new().expect("the HTTP client")
}

/// Post `payload` with a fresh cancellation token, within the test's bound.
async fn post(client: &HttpClient, spec: &HttpSpec, payload: &'static str) -> Ran {
    let cancel = CancellationToken::new();
    let job = job(None);
    let posting = client.post(spec, &job, Bytes::from(payload), &cancel);
    within(WAIT, "the handler's answer", posting).await
}

fn failed(ran: Ran) -> Failure {
    match ran {
        Ran::Failed(failure) => failure,
        other => panic!("expected a failed attempt, got {other:?}"),
    }
}

const LATER: Retry = Retry::Later { after: None };

#[tokio::test]
async fn a_2xx_body_is_the_output() {
    let server = TestServer::start(|_| async { respond(200, &[], "résumé: 3 words") }).await;
    let ran = post(&client(), &spec(&server.url("/run")), "hello").await;
    assert_eq!(
        ran,
        Ran::Succeeded {
            output: "résumé: 3 words".to_string()
        }
    );
    let server = TestServer::start(|_| async { respond(204, &[], Body::empty()) }).await;
    let ran = post(&client(), &spec(&server.url("/run")), "hello").await;
    assert_eq!(ran, Ran::Succeeded { output: "".into() });
}

#[tokio::test]
async fn the_request_names_the_task_and_the_claim() {
    let mut server = TestServer::start(|_| async { respond(200, &[], "ok") }).await;
    let client = client();
    let spec = spec(&server.url("/tasks"));
    let cancel = CancellationToken::new();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for trace in [Some(traceparent), None] {
        let job = job(trace);
        let posting = client.post(&spec, &job, Bytes::from("the payload"), &cancel);
        let ran = within(WAIT, "the handler's answer", posting).await;
        assert_eq!(
            ran,
            Ran::Succeeded {
                output: "ok".into()
            }
        );
        let seen = server.next_request().await;
        assert_eq!(seen.path, "/tasks");
        assert_eq!(&seen.body[..], b"the payload");
        let header = |name: &str| seen.headers.get(name).map(|v| v.to_str().unwrap());
        assert_eq!(header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(header("pgtaskd-task-id"), Some("4242"));
        assert_eq!(header("pgtaskd-attempt"), Some("3"));
        assert_eq!(header("pgtaskd-queue"), Some("mail"));
        assert_eq!(
            header("idempotency-key"),
            Some("0123456789abcdef-4242-1765000000000000")
        );
        assert_eq!(header("pgtaskd-claim"), Some("987654321"));
        assert_eq!(header("pgtaskd-run"), Some("5"));
        assert_eq!(header("pgtaskd-idempotency-key"), Some("order-17"));
        assert_eq!(header("traceparent"), trace);
    }
}

#[tokio::test]
async fn a_json_object_or_array_payload_is_posted_as_application_json() {
    let mut server = TestServer::start(|_| async { respond(200, &[], "ok") }).await;
    let client = client();
    let spec = spec(&server.url("/tasks"));
    for (payload, content_type) in [
        (r#"{"to":"ada@example.com","n":[1,2]}"#, "application/json"),
        ("[1,2,3]", "application/json"),
        ("plain text", "text/plain; charset=utf-8"),
        ("42", "text/plain; charset=utf-8"),
        ("{half an object", "text/plain; charset=utf-8"),
    ] {
        let ran = post(&client, &spec, payload).await;
        assert_eq!(
            ran,
            Ran::Succeeded {
                output: "ok".into()
            },
            "{payload}"
        );
        let seen = server.next_request().await;
        assert_eq!(&seen.body[..], payload.as_bytes());
        assert_eq!(
            seen.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some(content_type),
            "{payload}"
        );
    }
}

#[tokio::test]
async fn statuses_that_say_the_task_is_wrong_fail_it_at_once() {
    let client = client();
    for status in [400u16, 404, 410, 422] {
        let server =
            TestServer::start(move |_| async move { respond(status, &[], "bad task\n") }).await;
        let failure = failed(post(&client, &spec(&server.url("/")), "x").await);
        assert_eq!(failure.retry, Retry::Never, "{status}");
        assert_eq!(failure.kind, FailureKind::Status4xx, "{status}");
        assert!(
            failure.message.starts_with(&format!("HTTP {status} "))
                && failure.message.ends_with(": bad task"),
            "{}",
            failure.message
        );
    }
}

#[tokio::test]
async fn other_statuses_are_retried_with_the_body_head_in_the_error() {
    let client = client();
    let long_body = "e".repeat(10 * 1024);
    for (status, kind) in [
        (500u16, FailureKind::Status5xx),
        (429, FailureKind::Status4xx),
    ] {
        let body = long_body.clone();
        let server = TestServer::start(move |_| {
            let body = body.clone();
            async move { respond(status, &[], body) }
        })
        .await;
        let failure = failed(post(&client, &spec(&server.url("/")), "x").await);
        assert_eq!((failure.retry, failure.kind), (LATER, kind), "{status}");
        let prefix = if status == 500 {
            "HTTP 500 Internal Server Error: "
        } else {
            "HTTP 429 Too Many Requests: "
        };
        assert_eq!(failure.message, format!("{prefix}{}", &long_body[..1024]));
    }
}

#[tokio::test]
async fn retry_after_in_seconds_or_as_a_date_is_the_wait() {
    let client = client();
    let server = TestServer::start(|_| async {
        respond(503, &[("retry-after", "7")], "down for maintenance")
    })
    .await;
    let failure = failed(post(&client, &spec(&server.url("/")), "x").await);
    assert_eq!(
        failure.retry,
        Retry::Later {
            after: Some(Duration::from_secs(7))
        }
    );
    assert_eq!(failure.kind, FailureKind::Status5xx);
    assert_eq!(
        failure.message,
        "HTTP 503 Service Unavailable: down for maintenance"
    );

    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
    let server = TestServer::start(move |_| {
        let date = date.clone();
        async move { respond(503, &[("retry-after", date.as_str())], "") }
    })
    .await;
    let failure = failed(post(&client, &spec(&server.url("/")), "x").await);
    let Retry::Later { after: Some(after) } = failure.retry else {
        panic!("a wait from the date: {failure:?}");
    };
    // The date has whole seconds, and the answer took some time.
    assert!(
        (Duration::from_secs(115)..=Duration::from_secs(120)).contains(&after),
        "{after:?}"
    );
    assert_eq!(failure.message, "HTTP 503 Service Unavailable");
}

#[tokio::test]
async fn an_endless_body_fails_at_max_output_without_being_read() {
    let server = TestServer::start(|_| async {
        let chunk = Bytes::from(vec![b'a'; 64 * 1024]);
        let endless = stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
        respond(200, &[], Body::from_stream(endless))
    })
    .await;
    let limited = HttpSpec {
        max_output: 1024 * 1024,
        ..spec(&server.url("/"))
    };
    let failure = failed(post(&client(), &limited, "x").await);
    assert_eq!((failure.retry, failure.kind), (LATER, FailureKind::Output));
    assert!(
        failure.message.contains("max_output"),
        "{}",
        failure.message
    );

    // A declared length over the limit fails before the body.
    let server = TestServer::start(|_| async { respond(200, &[], vec![b'a'; 2000]) }).await;
    let declared = HttpSpec {
        max_output: 1999,
        ..spec(&server.url("/"))
    };
    let failure = failed(post(&client(), &declared, "x").await);
    assert_eq!(failure.kind, FailureKind::Output);
}

#[tokio::test]
async fn a_body_that_is_not_utf8_fails_the_attempt() {
    let server = TestServer::start(|_| async { respond(200, &[], vec![b'o', b'k', 0xff]) }).await;
    let failure = failed(post(&client(), &spec(&server.url("/")), "x").await);
    assert_eq!((failure.retry, failure.kind), (LATER, FailureKind::Output));
    assert!(failure.message.contains("UTF-8"), "{}", failure.message);
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let mut server = SilentServer::start().await;
    let spec = HttpSpec {
        timeout: Duration::from_millis(500),
        ..spec(&server.url)
    };
    let started = Instant::now();
    let failure = failed(post(&client(), &spec, "x").await);
    let took = started.elapsed();
    assert_eq!((failure.retry, failure.kind), (LATER, FailureKind::Timeout));
    assert!(failure.message.contains(&server.url), "{}", failure.message);
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(3),
        "{took:?}"
    );
    server.arrived().await;
    server.closed().await;
}

#[tokio::test]
async fn a_trickled_body_is_bounded_by_the_timeout() {
    let server = TestServer::start(|_| async {
        let trickle = stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"a")), ()))
        });
        respond(200, &[], Body::from_stream(trickle))
    })
    .await;
    let spec = HttpSpec {
        timeout: Duration::from_millis(700),
        ..spec(&server.url("/"))
    };
    let started = Instant::now();
    let failure = failed(post(&client(), &spec, "x").await);
    assert_eq!(failure.kind, FailureKind::Timeout);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_refused_port_a_hang_up_or_a_failed_handshake_is_unreachable() {
    let port = free_port();
    let url = format!("http://pgtaskd:hunter2@127.0.0.1:{port}/run");
    let failure = failed(post(&client(), &spec(&url), "x").await);
    assert_eq!(
        (failure.retry, failure.kind),
        (LATER, FailureKind::Unreachable)
    );
    assert!(
        failure
            .message
            .starts_with(&format!("cannot connect to http://127.0.0.1:{port}/run: ")),
        "{}",
        failure.message
    );
    assert!(!failure.message.contains("hunter2"), "{}", failure.message);
    assert!(failure.message.contains("refused"), "{}", failure.message);

    // A connection that breaks before the answer.
    let mut server = SilentServer::hanging_up().await;
    let failure = failed(post(&client(), &spec(&server.url), "x").await);
    assert_eq!(
        (failure.retry, failure.kind),
        (LATER, FailureKind::Unreachable)
    );
    assert!(
        failure
            .message
            .starts_with(&format!("no answer from {}: ", server.url)),
        "{}",
        failure.message
    );
    server.arrived().await;

    // https to a server that speaks plain HTTP: the TLS handshake fails.
    let server = TestServer::start(|_| async { respond(200, &[], "ok") }).await;
    let url = server.url("/").replace("http://", "https://");
    let failure = failed(post(&client(), &spec(&url), "x").await);
    assert_eq!(
        (failure.retry, failure.kind),
        (LATER, FailureKind::Unreachable)
    );
    assert!(failure.message.contains(&url), "{}", failure.message);
}

#[tokio::test]
async fn a_cancel_drops_the_request_at_once() {
    let mut server = SilentServer::start().await;
    let client = client();
    let spec = HttpSpec {
        timeout: Duration::from_secs(300),
        ..spec(&server.url)
    };
    let cancel = CancellationToken::new();
    let posting = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            client
                .post(&spec, &job(None), Bytes::from("x"), &cancel)
                .await
        }
    });
    server.arrived().await;
    let canceled = Instant::now();
    cancel.cancel();
    let ran = within(Duration::from_secs(5), "the canceled post", posting)
        .await
        .unwrap();
    assert_eq!(ran, Ran::Canceled);
    // Promptly: the request's timeout is five minutes. (A margin for a loaded machine.)
    assert!(
        canceled.elapsed() < Duration::from_secs(2),
        "{:?}",
        canceled.elapsed()
    );
    server.closed().await;
}

#[tokio::test]
async fn sequential_posts_share_one_keep_alive_connection() {
    let mut server = TestServer::start(|_| async { respond(200, &[], "ok") }).await;
    let client = client();
    let spec = spec(&server.url("/"));
    for _ in 0..50 {
        assert_eq!(
            post(&client, &spec, "x").await,
            Ran::Succeeded {
                output: "ok".into()
            }
        );
    }
    assert_eq!(server.taken_requests().len(), 50);
    // A connection goes back to the pool as its answer ends; a post may rarely come first.
    assert!(server.accepts() <= 2, "{} connections", server.accepts());
}

#[tokio::test]
async fn a_redirect_is_a_failed_attempt_and_not_followed() {
    let mut server = TestServer::start(|seen| {
        let status = if seen.path == "/elsewhere" { 200 } else { 302 };
        async move { respond(status, &[("location", "/elsewhere")], "moved") }
    })
    .await;
    let failure = failed(post(&client(), &spec(&server.url("/run")), "x").await);
    assert_eq!(
        (failure.retry, failure.kind),
        (LATER, FailureKind::Status5xx)
    );
    assert_eq!(
        failure.message,
        "HTTP 302 Found (to /elsewhere; redirects are not followed: set the queue's url to \
         where it points): moved"
    );
    let paths: Vec<String> = server
        .taken_requests()
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(paths, ["/run"]);
}

#[tokio::test]
async fn the_node_example_endpoint_answers_through_the_client() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/endpoint.js");
    let mut node = match tokio::process::Command::new("node")
        .arg(script)
        .env("PORT", "0")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(err) => panic!("cannot run node ({err}): install it with `apt-get install nodejs`"),
    };
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let line = within(WAIT, "node's listening line", lines.next_line())
        .await
        .unwrap()
        .expect("node printed where it listens");
    let url = match line.strip_prefix("listening on ") {
        Some(url) => url.to_string(),
        None => panic!("node printed {line:?}, not where it listens"),
    };

    let client = client();
    let spec = spec(&url);
    let cancel = CancellationToken::new();
    let payload = Bytes::from("the quick brown fox");
    for _ in 0..2 {
        // The same claim twice: the endpoint's idempotency answers the same.
        let job = job(None);
        let posting = client.post(&spec, &job, payload.clone(), &cancel);
        let ran = within(WAIT, "node's answer", posting).await;
        assert_eq!(
            ran,
            Ran::Succeeded {
                output: "task 4242 (queue mail, attempt 3): 4 words".into()
            }
        );
    }
    let failure = failed(post(&client, &spec, " ").await);
    assert_eq!(failure.retry, Retry::Never);
    assert_eq!(
        failure.message,
        "HTTP 422 Unprocessable Entity: task 4242: the payload is empty"
    );
    node.kill().await.expect("stop node");
}
