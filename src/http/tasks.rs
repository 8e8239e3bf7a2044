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

fn unavailable(err: &DbError) -> Response {
    tracing::warn!(error = %crate::db::describe(err), "HTTP request could not reach the database");
    error(StatusCode::SERVICE_UNAVAILABLE, "database unavailable")
}

fn bad_id() -> Response {
    error(StatusCode::BAD_REQUEST, "the task id must be an integer")
}

/// `POST /tasks`: a text body, or JSON `{"payload": "...", "queue": "..."}`. 202 means
/// accepted (committed to the table), not done.
pub(super) async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    let submission = if is_json {
        match serde_json::from_slice::<Submission>(&body) {
            Ok(submission) => submission,
            Err(err) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid JSON body: {err}"),
                )
            }
        }
    } else {
        match String::from_utf8(body.to_vec()) {
            Ok(payload) => Submission {
                payload,
                queue: default_queue(),
            },
            Err(_) => return error(StatusCode::BAD_REQUEST, "the body is not UTF-8 text"),
        }
    };
    if submission.queue.trim().is_empty() {
        return error(StatusCode::BAD_REQUEST, "the queue name is empty");
    }
    if submission.payload.contains('\0') {
        return error(
            StatusCode::BAD_REQUEST,
            "the payload contains a NUL character",
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
