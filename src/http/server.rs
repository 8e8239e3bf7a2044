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

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::connections::{Admission, Connections, Ticket};
use crate::config::HttpConfig;

/// What bounds the server's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers.
    pub header_timeout: Duration,
}

impl From<&HttpConfig> for Limits {
    fn from(config: &HttpConfig) -> Limits {
        Limits {
            max_connections: config.max_connections,
            header_timeout: config.header_timeout,
        }
    }
}

/// How long `accept` pauses after running out of descriptors or memory.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Repeated warnings (refused connections, failed accepts) are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// How long open connections may finish their requests once the server stops.
const DRAIN: Duration = Duration::from_secs(5);

/// Accept and serve connections until `stop` fires, then let open requests finish for a
/// short while.
pub async fn run(listener: TcpListener, router: Router, limits: Limits, stop: CancellationToken) {
    let connections = Connections::new(limits.max_connections);
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
        let ticket = match connections.admit() {
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
            Admission::Refused => {
                if refused.due() {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "http.max_connections reached, every connection busy: HTTP connection refused"
                    );
                }
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let eviction = ticket.eviction();
        let service = TrackedService {
            inner: TowerToHyperService::new(router.clone()),
            ticket,
        };
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        // The ticket lives in the connection's service: dropping the connection, at its end
        // or at its eviction, closes the socket and frees the place.
        tokio::spawn(async move {
            tokio::select! {
                result = connection => {
                    if let Err(err) = result {
                        tracing::debug!(error = %err, "HTTP connection ended with an error");
                    }
                }
                () = eviction.cancelled() => {}
            }
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
/// being answered.
struct TrackedService {
    inner: TowerToHyperService<Router>,
    ticket: Ticket,
}

impl hyper::service::Service<hyper::Request<Incoming>> for TrackedService {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<Incoming>,
    >>::Response;
    type Error =
        <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        self.ticket.busy_while(self.inner.call(request))
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
