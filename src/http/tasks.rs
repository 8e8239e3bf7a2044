//! The task routes: submit (with an optional `Idempotency-Key` and an optional `wait`), read
//! (with an optional `wait`), cancel, retry. The database is the truth.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::budget::{ReadBudget, UNCOUNTED_PAYLOAD};
use super::error::ApiError;
use super::extract::{Db, TaskId};
use super::streamed::StreamedTask;
use super::submission::Submission;
use super::AppState;
use crate::queue::task::Read;
use crate::queue::{self, CancelOutcome, Enqueued, RetryOutcome, TaskStatus};

/// `POST /tasks`: a `text/plain` body with `?queue=&priority=&run_at=&max_attempts=`, or
/// `application/json` `{"payload": "..." or {...} or [...], "queue": "...", "priority": 0,
/// "run_at": "...", "max_attempts": 3, "depends_on": [12, 13], "on_dep_failure": "run"}` (all
/// but the payload optional), read by `submission.rs`.
/// 202 means accepted (committed to the table), not done: QUEUED, or for a task with parents
/// the status its insert gave it (WAITING while a parent has not ended). With an
/// `Idempotency-Key` header already used in the queue: 200 with that task's id and current
/// status when the payload is the same, 422 when it is another. A parent that does not exist,
/// or was not enqueued before the task, is 422 too, and nothing is inserted.
///
/// With `?wait=D` (as `GET /tasks/{id}?wait=`, at most a minute) the answer is the row once
/// the task is terminal (200), or at the end of the wait as it is then (202), as `GET
/// /tasks/{id}?wait=` answers it; `Location` names the task either way.
pub(super) async fn submit(
    State(state): State<AppState>,
    Extension(budget): Extension<Arc<ReadBudget>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    // The request is judged before a session is taken: a bad request is 400 even in an outage.
    let wait = super::wait::requested(query.as_deref())?;
    let key = idempotency_key(&headers)?;
    let task = Submission::read(&headers, query.as_deref(), &body)?.task(key)?;
    drop(body);
    let (code, id, status) = {
        let session = state.pool.get().await?;
        session.carried(task.payload.len() as u64);
        let enqueued = session
            .bounded(queue::enqueue(&session, &task))
            .await
            .map_err(ApiError::enqueue)?;
        match enqueued {
            Enqueued::Created(id) if task.depends_on.is_empty() => {
                (StatusCode::ACCEPTED, id, TaskStatus::Queued)
            }
            Enqueued::Created(id) => {
                // WAITING, or what its parents' ends made of it already: read, as a repeat's.
                let status = session
                    .bounded(queue::task::read(&session, id, 0))
                    .await?
                    .map_or(TaskStatus::Waiting, |read| read.status());
                (StatusCode::ACCEPTED, id, status)
            }
            Enqueued::Existing(id) => {
                // The status only: the payload, maybe large, is the one just sent.
                let status = session
                    .bounded(queue::task::read(&session, id, 0))
                    .await?
                    .map_or(TaskStatus::Queued, |read| read.status());
                (StatusCode::OK, id, status)
            }
            Enqueued::KeyConflict(id) => return Err(ApiError::KeyConflict { id }),
        }
    };
    // The payload, maybe large, is not held any longer.
    let queue_name = task.queue.clone();
    drop(task);
    let location = [(header::LOCATION, format!("/tasks/{id}"))];
    let Some(wait) = wait else {
        let mut body = serde_json::json!({ "id": id, "status": status });
        if let Some(warning) = unserved(&state, &queue_name).await {
            body["warning"] = warning.into();
        }
        return Ok((code, location, Json(body)).into_response());
    };
    // The task is in the table whatever happens to the wait: an error of the wait (the
    // database gone) names it too, so that a client retrying on 503 does not enqueue it again.
    let (done, answer) = match read_until_terminal(&state, &budget, id, Some(wait)).await {
        Ok(read) => read,
        Err(err) => return Ok(err.about_enqueued(id)),
    };
    let code = if done {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((code, location, answer).into_response())
}

/// The warning of a task submitted to `queue` when no live daemon serves it, as `pgtaskd
/// enqueue` says it: the task was accepted, and waits until a daemon serves its queue. Nothing
/// is read when this daemon serves the queue itself; a read that fails or takes over a second
/// says nothing.
async fn unserved(state: &AppState, queue: &str) -> Option<String> {
    if state.served.iter().any(|served| served == queue) {
        return None;
    }
    let read = async {
        let session = state.pool.get().await?;
        session
            .bounded(queue::daemons::serves(&session, queue))
            .await
    };
    match tokio::time::timeout(std::time::Duration::from_secs(1), read).await {
        Ok(Ok(false)) => Some(format!(
            "no connected daemon serves queue {queue:?}; the task waits until one does (GET /stats lists the daemons)"
        )),
        _ => None,
    }
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

/// `GET /tasks/{id}`: the row, read now. With `?wait=D` (at most a minute): as soon as the
/// task is terminal, or at the end of the wait with the row as it is then. A waiter holds no
/// session while it waits: it registers with the daemon's [`Completions`](super::Completions)
/// first, then reads the row, and reads it again each time it is woken (a `pgtaskd_done`
/// notification naming the task, the poll tick, a listener reconnect).
///
/// A payload over [`UNCOUNTED_PAYLOAD`] is left out of those reads, and read once for the
/// answer within the budget of `http.max_inflight_bytes` (`budget.rs`): 503 with
/// `Retry-After` when it has no room.
pub(super) async fn read(
    TaskId(id): TaskId,
    State(state): State<AppState>,
    Extension(budget): Extension<Arc<ReadBudget>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let wait = super::wait::requested(query.as_deref())?;
    let (_, answer) = read_until_terminal(&state, &budget, id, wait).await?;
    Ok(answer)
}

/// How often a waiting request reads its task again while the listener is down.
const UNHEARD_REREAD: std::time::Duration = std::time::Duration::from_secs(1);

/// Read task `id`; with `wait`, until it is terminal or the wait is over (registered with
/// the daemon's completions before the first read, so that no finish is missed). Whether it
/// was terminal, and the answer of `GET /tasks/{id}` with the row as last read.
async fn read_until_terminal(
    state: &AppState,
    budget: &Arc<ReadBudget>,
    id: i64,
    wait: Option<std::time::Duration>,
) -> Result<(bool, Response), ApiError> {
    // Past the waiters' room, answered at once (the row as it is now), as a wait that ended.
    let waiting = wait.and_then(|_| Arc::clone(&state.waiters).try_acquire_owned().ok());
    if wait.is_some() && waiting.is_none() {
        tracing::debug!(
            id,
            "every place for a waiting request is taken: answered at once"
        );
    }
    let wait = wait.filter(|_| waiting.is_some());
    let deadline = tokio::time::Instant::now() + wait.unwrap_or_default();
    let mut watch = wait.map(|_| state.completions.watch(id));
    loop {
        let read = {
            let session = state.pool.get().await?;
            session
                .bounded(queue::task::read(&session, id, UNCOUNTED_PAYLOAD))
                .await?
        };
        let Some(read) = read else {
            return Err(ApiError::NoSuchTask);
        };
        let terminal = read.status().is_terminal();
        let waiting = !terminal && tokio::time::Instant::now() < deadline;
        let Some(watch) = watch.as_mut().filter(|_| waiting) else {
            return Ok((terminal, answer(state, budget, id, read).await?));
        };
        // The finish is told by the listener: while it is down (an outage, most often), the
        // row is read again every second, so that an outage is answered 503 now rather than
        // at the end of the wait, and a finish is not missed.
        let listening = state.health.is_listening();
        tokio::select! {
            _ = watch.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            () = state.health.wait_not_listening(), if listening => {}
            () = tokio::time::sleep(UNHEARD_REREAD), if !listening => {}
        }
    }
}

/// The answer to `GET /tasks/{id}`: the row read, or for a large payload the row read again
/// within the budget and written as JSON straight from the row's buffer as hyper takes it
/// (`streamed.rs`).
async fn answer(
    state: &AppState,
    budget: &Arc<ReadBudget>,
    id: i64,
    read: Read,
) -> Result<Response, ApiError> {
    let bytes = match read {
        Read::Whole(task) => return Ok(Json(task).into_response()),
        Read::WithoutPayload {
            payload_bytes,
            output_bytes,
            ..
        } => u64::try_from(payload_bytes.saturating_add(output_bytes)).unwrap_or(0),
    };
    // The payload and the output held once, in the row's buffer, escaped a chunk at a time.
    let share = budget.try_take(bytes).ok_or(ApiError::ReadBudget)?;
    let row = {
        let session = state.pool.get().await?;
        session.carried(bytes);
        session.bounded(queue::task::get_row(&session, id)).await?
    };
    let Some(row) = row else {
        return Err(ApiError::NoSuchTask);
    };
    // Counting the escaped payload takes a while: off the runtime's threads. The share goes
    // with it, so that a request past its deadline still counts the bytes until they are freed.
    let body = tokio::task::spawn_blocking(move || StreamedTask::new(row, share))
        .await
        .expect("counting a task's JSON does not panic");
    let mut response = Response::new(Body::new(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
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

/// `POST /tasks/{id}/retry`: what `pgtaskd retry` does (`pgtaskd.retry`): a FAILED or CANCELED
/// task back to QUEUED as if new (WAITING when it waits again for parents). With
/// `?with_dependents=true`, as `pgtaskd retry --with-dependents` (`pgtaskd.retry_with_dependents`):
/// also the tasks its end canceled, and theirs, named in `dependents`. 200 with the status it
/// has now and the one it had, 404, 409 for a task that is WAITING, QUEUED, RUNNING or
/// SUCCEEDED (nothing changed); 400 for another query.
pub(super) async fn retry(
    TaskId(id): TaskId,
    RawQuery(query): RawQuery,
    Db(session): Db,
) -> Result<impl IntoResponse, ApiError> {
    let with_dependents = match query.as_deref() {
        None | Some("") | Some("with_dependents=false") => false,
        Some("with_dependents=true") => true,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "the only query of a retry is with_dependents=true or with_dependents=false".into(),
            ))
        }
    };
    match session
        .bounded(queue::retry(&session, id, with_dependents))
        .await?
    {
        RetryOutcome::Requeued {
            was,
            now,
            dependents,
        } => {
            let mut answer = serde_json::json!({ "id": id, "status": now, "previous_status": was });
            if with_dependents {
                answer["dependents"] = serde_json::json!(dependents);
            }
            Ok(Json(answer))
        }
        RetryOutcome::Refused(status) => Err(ApiError::NotRetryable(status)),
        RetryOutcome::NotFound => Err(ApiError::NoSuchTask),
    }
}
