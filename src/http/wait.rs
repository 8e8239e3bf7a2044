//! The `wait` parameter of `GET /tasks/{id}` and `POST /tasks`, and the request deadline that
//! makes room for it.
//!
//! `?wait=30s` (a duration such as `500ms`, `30s`, `1m`) asks the answer to come as soon as the
//! task is terminal, or at the end of the wait with the row as it is then; at most
//! [`MAX_WAIT`], longer is 400. Every request has the server's deadline; a request that waits
//! has that deadline plus its wait.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::REQUEST_TIMEOUT;

/// The requests that may wait at once: `http.max_connections` less a reserve (an eighth, 1 to
/// 16), so that connections busy waiting never take every place and a liveness probe or a
/// prompt request still gets in (a busy connection is never closed to make room, see
/// `connections.rs`). A wait past them is answered at once, as at the end of its wait; with
/// `http.max_connections = 1`, every wait is.
pub fn waiters(max_connections: usize) -> Arc<Semaphore> {
    let reserve = (max_connections / 8).clamp(1, 16);
    Arc::new(Semaphore::new(max_connections.saturating_sub(reserve)))
}

/// The longest wait a request may ask for.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(60);

/// The wait a query string asks for: `None` without `wait`.
///
/// # Errors
///
/// [`ApiError::BadRequest`] for a `wait` that is not a duration, or over [`MAX_WAIT`].
pub(super) fn requested(query: Option<&str>) -> Result<Option<Duration>, ApiError> {
    let Some(value) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key == "wait").then_some(value)
        })
    else {
        return Ok(None);
    };
    let wait = humantime::parse_duration(value).map_err(|_| {
        ApiError::BadRequest("wait must be a duration such as \"30s\" or \"500ms\"".into())
    })?;
    if wait > MAX_WAIT {
        return Err(ApiError::BadRequest(format!(
            "wait is at most {}s",
            MAX_WAIT.as_secs()
        )));
    }
    Ok(Some(wait))
}

/// The request's deadline: [`REQUEST_TIMEOUT`], plus the wait it asks for (408 after that).
pub(super) async fn deadline(request: Request, next: Next) -> Response {
    let wait = requested(request.uri().query())
        .ok()
        .flatten()
        .unwrap_or_default();
    match tokio::time::timeout(REQUEST_TIMEOUT + wait, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::waiters;

    #[test]
    fn waits_leave_a_place_free_whatever_the_cap() {
        for (max_connections, room) in [(1, 0), (2, 1), (8, 7), (64, 56), (512, 496)] {
            assert_eq!(
                waiters(max_connections).available_permits(),
                room,
                "http.max_connections = {max_connections}"
            );
        }
    }

    use super::*;

    #[test]
    fn wait_is_a_duration_of_at_most_a_minute() {
        assert_eq!(requested(None).unwrap(), None);
        assert_eq!(requested(Some("x=1")).unwrap(), None);
        assert_eq!(
            requested(Some("x=1&wait=30s")).unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            requested(Some("wait=500ms")).unwrap(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(requested(Some("wait=60s")).unwrap(), Some(MAX_WAIT));
        assert!(requested(Some("wait=61s")).is_err());
        assert!(requested(Some("wait=2m")).is_err());
        assert!(requested(Some("wait=soon")).is_err());
        assert!(requested(Some("wait=")).is_err());
    }
}
