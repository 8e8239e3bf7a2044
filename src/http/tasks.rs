//! The task routes: submit, read, cancel. The database is the truth.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{error, AppState};
use crate::db::DbError;
use crate::queue::{self, CancelOutcome};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Submission {
    payload: String,
    #[serde(default = "default_queue")]
    queue: String,
}

fn default_queue() -> String {
    crate::config::DEFAULT_QUEUE.to_string()
}

/// A database failure: 503 when the database could not serve the request (an outage, a
/// timeout, an overload), 500 for any other error (a bug: inputs are validated first).
fn unavailable(err: &DbError) -> Response {
    let class = err.code().map(|code| &code.code()[..2]);
    if err.is_unavailable() || matches!(class, Some("40" | "53" | "57" | "58")) {
        tracing::warn!(error = %crate::db::describe(err), "HTTP request could not be served by the database");
        error(StatusCode::SERVICE_UNAVAILABLE, "database unavailable")
    } else {
        tracing::error!(error = %crate::db::describe(err), "HTTP request failed in the database");
        error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}

fn bad_id() -> Response {
    error(StatusCode::BAD_REQUEST, "the task id must be an integer")
}

/// `POST /tasks`: a `text/plain` body, or `application/json` `{"payload": "...", "queue": "..."}`. 202 means
/// accepted (committed to the table), not done.
pub(super) async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    let submission = match content_type.as_deref() {
        Some("application/json") => match serde_json::from_slice::<Submission>(&body) {
            Ok(submission) => submission,
            Err(err) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid JSON body: {err}"),
                )
            }
        },
        Some("text/plain") => match String::from_utf8(body.to_vec()) {
            Ok(payload) => Submission {
                payload,
                queue: default_queue(),
            },
            Err(_) => return error(StatusCode::BAD_REQUEST, "the body is not UTF-8 text"),
        },
        _ => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the text as text/plain, or JSON {\"payload\": ...} as application/json",
            )
        }
    };
    if submission.queue.trim().is_empty() {
        return error(StatusCode::BAD_REQUEST, "the queue name is empty");
    }
    // PostgreSQL text cannot hold NUL: refuse it here rather than fail in the database.
    if submission.payload.contains('\0') || submission.queue.contains('\0') {
        return error(
            StatusCode::BAD_REQUEST,
            "the payload or the queue contains a NUL character",
        );
    }
    let session = match state.pool.get().await {
        Ok(session) => session,
        Err(err) => return unavailable(&err),
    };
    let id = match session
        .bounded(queue::enqueue(
            &session,
            &submission.queue,
            &submission.payload,
        ))
        .await
    {
        Ok(id) => id,
        Err(err) => return unavailable(&err),
    };
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/tasks/{id}"))],
        Json(serde_json::json!({ "id": id, "status": "QUEUED" })),
    )
        .into_response()
}

/// `GET /tasks/{id}`: the row, read now.
pub(super) async fn read(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return bad_id();
    };
    let session = match state.pool.get().await {
        Ok(session) => session,
        Err(err) => return unavailable(&err),
    };
    match session.bounded(queue::get(&session, id)).await {
        Ok(Some(task)) => Json(task).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "no such task"),
        Err(err) => unavailable(&err),
    }
}

/// `POST /tasks/{id}/cancel`: 202 with the status after the request (CANCELED, or RUNNING
/// with `cancel_requested`), 404, 409 for a finished task.
pub(super) async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return bad_id();
    };
    let session = match state.pool.get().await {
        Ok(session) => session,
        Err(err) => return unavailable(&err),
    };
    match session.bounded(queue::cancel(&session, id)).await {
        Ok(CancelOutcome::Canceled) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "id": id, "status": "CANCELED", "cancel_requested": false })),
        )
            .into_response(),
        Ok(CancelOutcome::Requested) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "id": id, "status": "RUNNING", "cancel_requested": true })),
        )
            .into_response(),
        Ok(CancelOutcome::AlreadyFinished(status)) => (
            StatusCode::CONFLICT,
            Json(serde_json::json!({ "error": format!("task is already {status}"), "status": status })),
        )
            .into_response(),
        Ok(CancelOutcome::NotFound) => error(StatusCode::NOT_FOUND, "no such task"),
        Err(err) => unavailable(&err),
    }
}
