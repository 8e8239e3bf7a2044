//! The task routes: submit, read, cancel. The database is the truth.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{Db, TaskId};
use super::AppState;
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

/// `POST /tasks`: a `text/plain` body, or `application/json` `{"payload": "...", "queue": "..."}`. 202 means
/// accepted (committed to the table), not done.
pub(super) async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    // The body is judged before a session is taken: a bad request is 400 even in an outage.
    let submission = parse_submission(&headers, &body)?;
    let session = state.pool.get().await?;
    let id = session
        .bounded(queue::enqueue(
            &session,
            &submission.queue,
            &submission.payload,
        ))
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/tasks/{id}"))],
        Json(serde_json::json!({ "id": id, "status": "QUEUED" })),
    ))
}

fn parse_submission(headers: &HeaderMap, body: &[u8]) -> Result<Submission, ApiError> {
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
        Some("application/json") => serde_json::from_slice::<Submission>(body)
            .map_err(|err| ApiError::BadRequest(format!("invalid JSON body: {err}")))?,
        Some("text/plain") => Submission {
            payload: String::from_utf8(body.to_vec())
                .map_err(|_| ApiError::BadRequest("the body is not UTF-8 text".into()))?,
            queue: default_queue(),
        },
        _ => return Err(ApiError::UnsupportedMediaType),
    };
    if submission.queue.trim().is_empty() {
        return Err(ApiError::BadRequest("the queue name is empty".into()));
    }
    // PostgreSQL text cannot hold NUL: refuse it here rather than fail in the database.
    if submission.payload.contains('\0') || submission.queue.contains('\0') {
        return Err(ApiError::BadRequest(
            "the payload or the queue contains a NUL character".into(),
        ));
    }
    Ok(submission)
}

/// `GET /tasks/{id}`: the row, read now.
pub(super) async fn read(
    TaskId(id): TaskId,
    Db(session): Db,
) -> Result<impl IntoResponse, ApiError> {
    match session.bounded(queue::get(&session, id)).await? {
        Some(task) => Ok(Json(task)),
        None => Err(ApiError::NoSuchTask),
    }
}

/// `POST /tasks/{id}/cancel`: 202 with the status after the request (CANCELED, or RUNNING
/// with `cancel_requested`), 404, 409 for a finished task.
pub(super) async fn cancel(
    TaskId(id): TaskId,
    Db(session): Db,
) -> Result<impl IntoResponse, ApiError> {
    let (status, cancel_requested) = match session.bounded(queue::cancel(&session, id)).await? {
        CancelOutcome::Canceled => ("CANCELED", false),
        CancelOutcome::Requested => ("RUNNING", true),
        CancelOutcome::AlreadyFinished(status) => return Err(ApiError::AlreadyFinished(status)),
        CancelOutcome::NotFound => return Err(ApiError::NoSuchTask),
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(
            serde_json::json!({ "id": id, "status": status, "cancel_requested": cancel_requested }),
        ),
    ))
}
