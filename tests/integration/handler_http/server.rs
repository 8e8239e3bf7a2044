//! Real HTTP servers for the `http` handler's tests, on loopback ports: a hyper server whose
//! answer each test writes (it reports every request it got and counts its connections),
//! and a raw TCP server that never answers and reports when a connection closes.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::support::{within, WAIT};

/// A request as the server got it.
#[derive(Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A hyper server answering every request with what `answer` makes of it.
pub struct TestServer {
    pub base: String,
    accepts: Arc<AtomicUsize>,
    seen: mpsc::UnboundedReceiver<Seen>,
    task: JoinHandle<()>,
}

impl TestServer {
    pub async fn start<F, Fut>(answer: F) -> TestServer
    where
        F: Fn(&Seen) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepts = Arc::new(AtomicUsize::new(0));
        let (sender, seen) = mpsc::unbounded_channel();
        let answer = Arc::new(answer);
        let counted = Arc::clone(&accepts);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let answer = Arc::clone(&answer);
                let sender = sender.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let answer = Arc::clone(&answer);
                    let sender = sender.clone();
                    async move {
                        let (parts, body) = request.into_parts();
                        let body = axum::body::to_bytes(Body::new(body), usize::MAX)
                            .await
                            .unwrap_or_default();
                        let seen = Seen {
                            path: parts.uri.path().to_string(),
                            headers: parts.headers,
                            body,
                        };
                        let response = answer(&seen).await;
                        let _ = sender.send(seen);
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        TestServer {
            base,
            accepts,
            seen,
            task,
        }
    }

    /// The server's URL for `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The connections accepted so far.
    pub fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }

    /// The next request the server answered.
    pub async fn next_request(&mut self) -> Seen {
        within(WAIT, "a request at the test server", self.seen.recv())
            .await
            .expect("the test server is running")
    }

    /// The requests answered so far and not yet taken.
    pub fn taken_requests(&mut self) -> Vec<Seen> {
        std::iter::from_fn(|| self.seen.try_recv().ok()).collect()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response with `status`, `headers` and `body`.
pub fn respond(status: u16, headers: &[(&str, &str)], body: impl Into<Body>) -> Response<Body> {
    let mut response = Response::builder().status(status);
    for (name, value) in headers {
        response = response.header(*name, *value);
    }
    response.body(body.into()).expect("a valid test response")
}

/// A server that reads each request's head and never answers: it waits for the client to
/// close the connection, or closes it itself (`hang_up`). It reports each request's arrival
/// and each connection's end.
pub struct SilentServer {
    pub url: String,
    arrived: mpsc::UnboundedReceiver<()>,
    closed: mpsc::UnboundedReceiver<()>,
    task: JoinHandle<()>,
}

impl SilentServer {
    pub async fn start() -> SilentServer {
        SilentServer::serve(false).await
    }

    /// A server that closes each connection once it has read the request's head.
    pub async fn hanging_up() -> SilentServer {
        SilentServer::serve(true).await
    }

    async fn serve(hang_up: bool) -> SilentServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/hold", listener.local_addr().unwrap());
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let arrived = arrived_tx.clone();
                let closed = closed_tx.clone();
                tokio::spawn(async move {
                    let mut received = Vec::new();
                    let mut reported = false;
                    let mut buf = [0u8; 4096];
                    // Read (and keep nothing of the body) until the client closes.
                    // Dropping the stream closes the connection.
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        received.extend_from_slice(&buf[..n]);
                        if !reported && received.windows(4).any(|w| w == b"\r\n\r\n") {
                            reported = true;
                            let _ = arrived.send(());
                            if hang_up {
                                break;
                            }
                        }
                    }
                    drop(stream);
                    let _ = closed.send(());
                });
            }
        });
        SilentServer {
            url,
            arrived,
            closed,
            task,
        }
    }

    /// Wait for a request's head to arrive.
    pub async fn arrived(&mut self) {
        within(WAIT, "a request at the silent server", self.arrived.recv())
            .await
            .expect("the silent server is running");
    }

    /// Wait for the client to close a connection.
    pub async fn closed(&mut self) {
        within(
            WAIT,
            "the client closing its connection",
            self.closed.recv(),
        )
        .await
        .expect("the silent server is running");
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
