//! The task routes: submit (with an optional `Idempotency-Key`), read (with an optional
//! `wait`), cancel. The database is the truth.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{Db, TaskId};
use super::AppState;
use crate::queue::{self, CancelOutcome, Enqueued, TaskStatus};

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
/// accepted (committed to the table), not done. With an `Idempotency-Key` header already used
/// in the queue: 200 with that task's id and current status when the payload is the same, 422
/// when it is another.
pub(super) async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    // The body is judged before a session is taken: a bad request is 400 even in an outage.
    let submission = parse_submission(&headers, &body)?;
    let key = idempotency_key(&headers)?;
    let task = queue::NewTask {
        idempotency_key: key,
        ..queue::NewTask::new(&submission.queue, &submission.payload)
    };
    task.check()?;
    let session = state.pool.get().await?;
    let (code, id, status) = match session.bounded(queue::enqueue(&session, &task)).await? {
        Enqueued::Created(id) => (StatusCode::ACCEPTED, id, TaskStatus::Queued),
        Enqueued::Existing(id) => {
            let status = session
                .bounded(queue::get(&session, id))
                .await?
                .map_or(TaskStatus::Queued, |task| task.status);
            (StatusCode::OK, id, status)
        }
        Enqueued::KeyConflict(id) => return Err(ApiError::KeyConflict { id }),
    };
    Ok((
        code,
        [(header::LOCATION, format!("/tasks/{id}"))],
        Json(serde_json::json!({ "id": id, "status": status })),
    ))
}

/// The `Idempotency-Key` header, checked by [`queue::enqueue::check_idempotency_key`].
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| queue::enqueue::BadInput::Key)?;
    queue::enqueue::check_idempotency_key(key)?;
    Ok(Some(key.to_string()))
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
    Ok(submission)
}

/// `GET /tasks/{id}`: the row, read now. With `?wait=D` (at most a minute): as soon as the
/// task is terminal, or at the end of the wait with the row as it is then. A waiter holds no
/// session while it waits: it registers with the daemon's [`Completions`](super::Completions)
/// first, then reads the row, and reads it again each time it is woken (a `pgtaskd_done`
/// notification naming the task, the poll tick, a listener reconnect).
pub(super) async fn read(
    TaskId(id): TaskId,
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<impl IntoResponse, ApiError> {
    let wait = super::wait::requested(query.as_deref())?;
    let deadline = tokio::time::Instant::now() + wait.unwrap_or_default();
    let mut watch = wait.map(|_| state.completions.watch(id));
    loop {
        let task = {
            let session = state.pool.get().await?;
            session.bounded(queue::get(&session, id)).await?
        };
        let Some(task) = task else {
            return Err(ApiError::NoSuchTask);
        };
        let Some(watch) = watch.as_mut() else {
            return Ok(Json(task));
        };
        if task.status.is_terminal() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(task));
        }
        tokio::select! {
            _ = watch.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
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
