//! The HTTP accept loop, called by [`super::serve`]: bounded connections, a deadline on request
//! headers, and a graceful stop.
//!
//! `axum::serve` sets neither a header deadline nor a connection cap, so a client trickling
//! its headers one byte at a time kept its descriptor forever, and a few hundred such clients
//! took every descriptor of the process. Here each connection is served by hyper's HTTP/1
//! connection with `header_read_timeout` (the whole head must arrive within
//! `http.header_timeout`; an idle keep-alive connection is closed after as long), and holds a
//! place among `http.max_connections` ([`super::connections`]): at the cap a new connection
//! takes the place of the oldest idle one, or is closed at once, so that the server's
//! descriptors stay bounded and a prompt client still gets in. An `accept` that fails for want
//! of descriptors or memory pauses the loop briefly instead of spinning or ending it.
//!
//! A request's body is the client's to send too: a body trickled a byte a second held its
//! connection busy, and so out of reach of eviction, for the 30 s request deadline, and
//! `http.max_connections` such clients shut the API out. While a request waits for more of
//! its body ([`ClientBody`]) its connection counts as idle for the eviction, and the whole
//! body must arrive within `http.header_timeout` (at most 30 s) of the end of the head, or the
//! answer is 408 with the JSON error body and the connection is closed.
//!
//! Each connection's socket is a [`Socket`]: a request head hyper cannot parse gets hyper's
//! status with the JSON error body instead of hyper's empty one, and a write the client
//! leaves unread for `http.header_timeout` ends the connection (`socket.rs`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::{Extension, Router};
use hyper::body::Incoming;
use hyper_util::rt::TokioTimer;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::http::{header, HeaderValue};
use axum::response::IntoResponse;
use hyper::body::{Body, Frame, SizeHint};

use super::budget::ReadBudget;
use super::connections::{Admission, Connections, Full, Ticket, Waiting, WaitingGuard};
use super::error::ApiError;
use super::socket::Socket;
use crate::config::HttpConfig;

/// What bounds the server's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// The payload bytes that answers may hold together (`budget.rs`).
    pub max_inflight_bytes: u64,
}

impl From<&HttpConfig> for Limits {
    fn from(config: &HttpConfig) -> Limits {
        Limits {
            max_connections: config.max_connections,
            header_timeout: config.header_timeout,
            max_inflight_bytes: config.max_inflight_bytes,
        }
    }
}

/// How long `accept` pauses after running out of descriptors or memory.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// How long a new connection waits for room (an evicted connection closed, a busy one's
/// request ended) before it is refused.
const ADMIT_WAIT: Duration = Duration::from_millis(200);
/// Repeated warnings (refused connections, failed accepts) are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// How long open connections may finish their requests once the server stops.
const DRAIN: Duration = Duration::from_secs(5);
/// How long the JSON answer to a malformed request may take to send.
const FINISH: Duration = Duration::from_secs(5);

/// Accept and serve connections until `stop` fires, then let open requests finish for a
/// short while.
pub async fn run(listener: TcpListener, router: Router, limits: Limits, stop: CancellationToken) {
    let connections = Connections::new(limits.max_connections);
    let router = router.layer(Extension(ReadBudget::new(limits.max_inflight_bytes)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = GracefulShutdown::new();
    let mut refused = Warner::default();
    let mut evicted = Warner::default();
    let mut failed = Warner::default();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                if failed.due() {
                    tracing::warn!(error = %err, "HTTP accept failed; pausing");
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_PAUSE) => continue,
                }
            }
        };
        let ticket = match connections.admit_within(ADMIT_WAIT).await {
            Admission::Admitted(ticket) => ticket,
            Admission::Evicted(ticket) => {
                if evicted.due() {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "http.max_connections reached: the oldest idle HTTP connection was closed"
                    );
                }
                ticket
            }
            Admission::Refused(full) => {
                if refused.due() {
                    let why = match full {
                        Full::Busy => "every connection busy",
                        Full::Closing => "too many evicted connections still closing",
                    };
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "http.max_connections reached, {why}: HTTP connection refused"
                    );
                }
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let eviction = ticket.eviction();
        let ticket = Arc::new(ticket);
        let service = TrackedService {
            inner: TowerToHyperService::new(router.clone()),
            ticket: Arc::clone(&ticket),
            body_timeout: limits.header_timeout.min(super::REQUEST_TIMEOUT),
        };
        let (socket, handback) = Socket::new(stream, limits.header_timeout);
        let mut connection = Box::pin(graceful.watch(http.serve_connection(socket, service)));
        // The ticket lives in the connection's service and in this task: dropping the
        // connection, at its end or at its eviction, and ending the answer to a malformed
        // request, closes the socket and frees the place.
        tokio::spawn(async move {
            let result = tokio::select! {
                result = &mut connection => result,
                () = eviction.cancelled() => return,
            };
            drop(connection);
            if let Err(err) = &result {
                tracing::debug!(error = %err, "HTTP connection ended with an error");
            }
            if let Some(leftover) = handback.take() {
                tokio::select! {
                    () = leftover.finish(result.as_ref().err(), FINISH) => {}
                    () = eviction.cancelled() => {}
                }
            }
            drop(ticket);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("HTTP connections still open at shutdown were dropped");
    }
}

/// A connection's service: the router, with the connection counted busy while a request is
/// being answered (but for the time its body waits for the client), and the request's body
/// given [`ClientBody`]'s deadline.
struct TrackedService {
    inner: TowerToHyperService<Router>,
    ticket: Arc<Ticket>,
    body_timeout: Duration,
}

type Inner = TowerToHyperService<Router>;
type Response = <Inner as hyper::service::Service<hyper::Request<ClientBody>>>::Response;
type InnerError = <Inner as hyper::service::Service<hyper::Request<ClientBody>>>::Error;

impl hyper::service::Service<hyper::Request<Incoming>> for TrackedService {
    type Response = Response;
    type Error = InnerError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let timed_out = Arc::new(AtomicBool::new(false));
        let deadline = tokio::time::Instant::now() + self.body_timeout;
        let waiting = self.ticket.waiting();
        let flag = Arc::clone(&timed_out);
        let request = request.map(|body| ClientBody {
            inner: body,
            waiting,
            guard: None,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            timed_out: flag,
        });
        let answer = hyper::service::Service::call(&self.inner, request);
        self.ticket.busy_while(async move {
            let response = answer.await?;
            if !timed_out.load(Ordering::Acquire) {
                return Ok(response);
            }
            // Whatever the handler made of a body cut short, the client was too slow: 408,
            // and the connection is closed (the rest of the body may still be coming).
            let mut response = ApiError::Timeout.into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Ok(response)
        })
    }
}

/// A request's body as the client sends it: while it waits for more, its connection counts as
/// waiting for the client (evictable at the cap), and past its deadline it ends with an error
/// and says so through `timed_out`.
pub(super) struct ClientBody {
    inner: Incoming,
    waiting: Waiting,
    guard: Option<WaitingGuard>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timed_out: Arc<AtomicBool>,
}

/// The body did not arrive within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within its deadline")]
struct BodyTimedOut;

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.guard = None;
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.guard = None;
                    this.timed_out.store(true, Ordering::Release);
                    return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
                }
                if this.guard.is_none() {
                    this.guard = Some(this.waiting.enter());
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Errors of one incoming connection (it was reset before it was accepted): the next
/// `accept` may succeed at once.
fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Says yes at most once per [`WARN_EVERY`], so that a flood cannot flood the log.
#[derive(Default)]
struct Warner {
    last: Option<Instant>,
}

impl Warner {
    fn due(&mut self) -> bool {
        let now = Instant::now();
        match self.last {
            Some(last) if now.duration_since(last) < WARN_EVERY => false,
            _ => {
                self.last = Some(now);
                true
            }
        }
    }
}
