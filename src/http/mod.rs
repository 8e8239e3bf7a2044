//! The optional HTTP server (docs/design.md, "HTTP"): off unless `http.listen` is set.
//!
//! | route | file |
//! | --- | --- |
//! | `POST /tasks`, `GET /tasks/{id}`, `POST /tasks/{id}/cancel`, `POST /tasks/{id}/retry` | `tasks.rs` |
//! | what a `POST /tasks` asks for: its body (text or JSON, a JSON payload's text) and its query | `submission.rs` |
//! | `POST /tasks/{id}/progress`, an `http` handler's progress report | `progress.rs` |
//! | `POST /graphs`, tasks that wait for one another, in one transaction | `graphs.rs` |
//! | `POST /batches`, `POST /batches/{id}/seal`, `GET /batches/{id}`: batches with a callback | `batches.rs` |
//! | `?wait=30s` of `GET /tasks/{id}` and `POST /tasks`: its parameter and deadline; its waiters | `wait.rs`, `completions.rs` |
//! | `POST /queues/{queue}/pause`, `POST /queues/{queue}/resume`, `POST /queues/{queue}/retry-failed` | `queues.rs` |
//! | `GET` and `PUT /queues/{queue}/settings`, a queue's limits and defaults | `settings.rs` |
//! | `GET /schedules`, `GET`, `PUT` and `DELETE /schedules/{name}` | `schedules.rs` |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics`, `GET /openapi.json` | `ops.rs` |
//! | `GET /stats`, `GET /stats/throughput` | `stats.rs` |
//! | `GET /tasks?queue=&status=&limit=&after=`, a page of tasks | `list.rs` |
//! | `GET /ui`, the dashboard (`ui.html`) | `ui.rs` |
//!
//! Large payloads are answered within a byte budget (`budget.rs`); each connection's socket
//! gives hyper's own answers to malformed heads the JSON error body (`socket.rs`).
//!
//! A failed request is an `ApiError` (`error.rs`), which becomes its status code and JSON body in
//! one place; the task routes take their id and their pooled session through the extractors
//! of `extract.rs`.
//!
//! Every answer about a task comes from the database, never from daemon memory; an
//! unreachable database is 503, never 404. An optional bearer token (from `http.token_file`)
//! guards every route but `/healthz` and `/ui` (a page without
//! data, whose script sends the token); without it, requests of other sites' pages and, on a
//! loopback address, other names than the loopback's are refused (`origin.rs`). Bodies over `http.max_body` are 413 (at once when the
//! declared length is over); request headers, bodies and handling each have a deadline and open
//! connections are capped (`server.rs`), so that slow clients cannot hold the server.

mod batches;
mod budget;
mod completions;
mod connections;
mod error;
mod extract;
mod graphs;
mod list;
mod ops;
mod origin;
mod progress;
mod queues;
mod schedules;
mod server;
mod settings;
mod socket;
mod stats;
mod streamed;
mod submission;
mod tasks;
mod ui;
mod wait;

pub use completions::Completions;
pub use server::Limits;
pub use wait::waiters;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio_util::sync::CancellationToken;

use self::error::ApiError;
use crate::db::Pool;
use crate::health::Health;
use crate::metrics::Metrics;

/// How long one request may take, body included (the body alone has the shorter deadline of
/// `server.rs`'s `ClientBody`).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub pool: Pool,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub token: Option<Arc<str>>,
    /// The waiters of `GET /tasks/{id}?wait=`, fed by the daemon's listener.
    pub completions: Arc<Completions>,
    /// The queues this daemon serves (`worker.queues`): a task submitted to another one is
    /// answered with a warning when no live daemon serves its queue.
    pub served: Arc<[String]>,
    /// The requests that may wait at once ([`wait::waiters`]).
    pub waiters: Arc<tokio::sync::Semaphore>,
    /// The handlers' progress reports, written by the daemon's flusher.
    pub progress: Arc<crate::progress::Progress>,
    /// The server is bound to a loopback address: without a token, it takes no other name
    /// (`origin.rs`).
    pub loopback: bool,
}

/// Why the HTTP server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot read http.token_file {path}")]
    TokenFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("http.token_file {0} is empty")]
    EmptyToken(String),
    #[error(
        "http.token_file {path} holds {what}: a token is one line of visible ASCII \
         characters (no spaces), as an Authorization header can carry it"
    )]
    UnusableToken { path: String, what: &'static str },
    #[error("cannot listen on {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Read the bearer token: the file's content without surrounding white space.
///
/// # Errors
///
/// An unreadable or empty file, or one whose token no client could send: white space or a
/// line break inside it, or a character outside visible ASCII (an HTTP header value holds no
/// line break, and a client's non-ASCII bytes would never compare equal).
pub fn read_token(path: &Path) -> Result<Arc<str>, HttpError> {
    let text = std::fs::read_to_string(path).map_err(|source| HttpError::TokenFile {
        path: path.display().to_string(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(HttpError::EmptyToken(path.display().to_string()));
    }
    let unusable = |what| HttpError::UnusableToken {
        path: path.display().to_string(),
        what,
    };
    if token.contains(['\n', '\r']) {
        return Err(unusable("more than one line"));
    }
    if token.chars().any(char::is_whitespace) {
        return Err(unusable("white space inside the token"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(unusable("a character outside visible ASCII"));
    }
    Ok(Arc::from(token))
}

/// The routes, with authentication, body limit and deadlines.
pub fn router(state: AppState, max_body: usize) -> Router {
    Router::new()
        .route("/tasks", post(tasks::submit).get(list::list))
        .route("/tasks/{id}", get(tasks::read))
        .route("/graphs", post(graphs::submit))
        .route("/batches", post(batches::open))
        .route("/batches/{id}", get(batches::read))
        .route("/batches/{id}/seal", post(batches::seal))
        .route("/tasks/{id}/cancel", post(tasks::cancel))
        .route("/tasks/{id}/retry", post(tasks::retry))
        .route(
            "/tasks/{id}/progress",
            post(progress::report).layer(DefaultBodyLimit::max(crate::progress::MAX_LINE)),
        )
        .route("/queues/{queue}/pause", post(queues::pause))
        .route("/queues/{queue}/resume", post(queues::resume))
        .route("/queues/{queue}/retry-failed", post(queues::retry_failed))
        .route(
            "/queues/{queue}/settings",
            get(settings::read).put(settings::put),
        )
        .route("/schedules", get(schedules::list))
        .route(
            "/schedules/{name}",
            get(schedules::read)
                .put(schedules::put)
                .delete(schedules::remove),
        )
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .route("/stats", get(stats::stats))
        .route("/stats/throughput", get(stats::throughput))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .route("/healthz", get(ops::healthz))
        .route("/ui", get(ui::page))
        .fallback(|| async { ApiError::NoSuchRoute })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            origin::refuse_other_sites,
        ))
        .layer(middleware::from_fn(wait::deadline))
        .layer(middleware::from_fn(error::database_answered))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            reject_declared_oversize(max_body, request, next)
        }))
        .layer(middleware::map_response(json_error_bodies))
        .with_state(state)
}

/// 413 before any of the body is read when its declared length is over `max_body`, instead of
/// waiting for a body that may never come.
async fn reject_declared_oversize(max_body: usize, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    match declared {
        Some(length) if length > max_body as u64 => {
            ApiError::BodyOver { max: max_body }.into_response()
        }
        _ => next.run(request).await,
    }
}

/// The answers made by the routing and the deadlines (405, 408, 413) carry no body of their
/// own, and axum's 400 for a body it could not read (a malformed chunked encoding) is text:
/// give them the same JSON error body as every other error. `Allow` is kept.
async fn json_error_bodies(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if is_json {
        return response;
    }
    let error = match response.status() {
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed,
        StatusCode::REQUEST_TIMEOUT => ApiError::Timeout,
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge,
        StatusCode::BAD_REQUEST => {
            let text = axum::body::to_bytes(response.into_body(), MAX_REJECTION_TEXT)
                .await
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&text);
            return ApiError::BadRequest(lowercase_first(text.trim())).into_response();
        }
        _ => return response,
    };
    let mut json = error.into_response();
    if let Some(allow) = response.headers().get(header::ALLOW) {
        json.headers_mut().insert(header::ALLOW, allow.clone());
    }
    json
}

/// The most of a text rejection's body that [`json_error_bodies`] reads.
const MAX_REJECTION_TEXT: usize = 4096;

/// `text` with its first letter in lower case, as the API's error messages are.
fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "bad request".to_string(),
    }
}

/// Bind `addr` (`HOST:PORT`, the host an address or a name) now, so that a busy port fails
/// the start-up. A name is resolved here, and the first of its addresses that binds is kept
/// (`localhost` may name both 127.0.0.1 and ::1).
///
/// # Errors
///
/// The name does not resolve, or no address of it can be bound.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, HttpError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serve until `stop` fires, within `limits`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let addr = listener
        .local_addr()
        .map_or_else(|err| format!("unknown ({err})"), |addr| addr.to_string());
    tracing::info!(%addr, max_connections = limits.max_connections,
        header_timeout = ?limits.header_timeout, "HTTP server listening");
    server::run(listener, router, limits, stop).await;
}

/// Every route but `/healthz` and `/ui` needs `Authorization: Bearer <token>` when a token is set.
/// A wrong or missing token is 401 and says nothing more.
async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token);
    match presented {
        Some(presented) if constant_time_eq(presented.as_bytes(), token.as_bytes()) => {
            next.run(request).await
        }
        _ => ApiError::Unauthorized.into_response(),
    }
}

/// The token of an `Authorization` value of the `Bearer` scheme, whose name is
/// case-insensitive (RFC 9110, section 11.1) and followed by one or more spaces.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("Bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Compare without an early exit, so that timing does not reveal the token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "bEaReR  abc"] {
            assert_eq!(bearer_token(value), Some("abc"), "{value}");
        }
        for value in ["Basic abc", "Bearerabc", "Bearer", "abc", "Bearer-x abc"] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
