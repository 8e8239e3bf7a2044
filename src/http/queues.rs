//! The queue routes: `POST /queues/{queue}/pause` and `POST /queues/{queue}/resume`, through
//! the same SQL functions as `pgtaskd pause`/`resume`. A pause takes effect at the daemons'
//! next claim; a resume wakes them at once (`NOTIFY pgtaskd_tasks`).
//!
//! `POST /queues/{queue}/retry-failed` puts the queue's FAILED tasks back to QUEUED as
//! `POST /tasks/{id}/retry` does each, through `pgtaskd.retry_failed` as `pgtaskd retry
//! --queue Q --failed` does: [`queue::RETRY_FAILED_BATCH`] rows per statement and
//! transaction, each batch above the last one's highest id, until none is left or [`RETRY_FAILED_BUDGET`] has passed,
//! and says how many it retried, the cursor it stopped at (`next`) and how many FAILED ones
//! remain above it: another request with `?after=<next>` retries those. A request without
//! `after` starts from the lowest id, so a client that asks again must pass the cursor, or it
//! would retry a second time tasks that failed again meanwhile.

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::extract::Db;
use crate::queue;

/// How long `POST /queues/{queue}/retry-failed` starts new batches: well within the request's
/// deadline (`REQUEST_TIMEOUT`), so that it answers with its counts rather than 408.
pub(super) const RETRY_FAILED_BUDGET: Duration = Duration::from_secs(15);

/// The `{queue}` of a queue route: 400 when it is not UTF-8 or not a queue name
/// ([`queue::enqueue::check_queue_name`]: empty, too long, or with a NUL character).
pub(super) struct QueueName(pub String);

impl<S: Send + Sync> FromRequestParts<S> for QueueName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::BadRequest("the queue name is not UTF-8 text".into()))?;
        queue::enqueue::check_queue_name(&name)?;
        Ok(QueueName(name))
    }
}

/// The answer of both routes.
#[derive(Debug, Serialize)]
pub(super) struct QueueState {
    queue: String,
    paused: bool,
    /// Whether this request changed it (false: it was so already).
    changed: bool,
}

/// `POST /queues/{queue}/pause`: 200; `changed` is false when it was paused already.
pub(super) async fn pause(
    QueueName(name): QueueName,
    Db(session): Db,
) -> Result<Json<QueueState>, ApiError> {
    let changed = session.bounded(queue::pause(&session, &name)).await?;
    Ok(Json(QueueState {
        queue: name,
        paused: true,
        changed,
    }))
}

/// `POST /queues/{queue}/resume`: 200; `changed` is false when it was not paused.
pub(super) async fn resume(
    QueueName(name): QueueName,
    Db(session): Db,
) -> Result<Json<QueueState>, ApiError> {
    let changed = session.bounded(queue::resume(&session, &name)).await?;
    Ok(Json(QueueState {
        queue: name,
        paused: false,
        changed,
    }))
}

/// The answer of `POST /queues/{queue}/retry-failed`.
#[derive(Debug, Serialize)]
pub(super) struct RetriedFailed {
    queue: String,
    /// The FAILED tasks put back to QUEUED.
    retried: i64,
    /// The highest id this request went through: pass it as `after` to go on.
    next: i64,
    /// The FAILED tasks above `next`, left by the budget. (Rows below it another
    /// transaction held locked, and tasks that failed again, are not counted.)
    remaining: i64,
}

/// The query of `POST /queues/{queue}/retry-failed`: `after`, the `next` of the previous
/// answer (0, the start, by default).
#[derive(Debug, Deserialize)]
pub(super) struct RetryFailedParams {
    after: Option<String>,
}

/// `POST /queues/{queue}/retry-failed`: 200 with the counts, 0 retried when none is FAILED; 404
/// for a queue without any task that is not paused either.
pub(super) async fn retry_failed(
    QueueName(name): QueueName,
    params: Result<Query<RetryFailedParams>, QueryRejection>,
    Db(session): Db,
) -> Result<Json<RetriedFailed>, ApiError> {
    let Query(params) = params.map_err(|err| ApiError::BadRequest(err.body_text()))?;
    let start = match params.after {
        None => 0,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ApiError::BadRequest(
                    "after must be the next of the previous answer (a task id)".into(),
                )
            })?,
    };
    let until = tokio::time::Instant::now() + RETRY_FAILED_BUDGET;
    let (mut retried, mut after) = (0, start);
    loop {
        let batch = session
            .bounded(queue::retry_failed(
                &session,
                &name,
                queue::RETRY_FAILED_BATCH,
                after,
            ))
            .await?;
        retried += batch.retried;
        after = batch.last_id;
        if batch.retried == 0 || tokio::time::Instant::now() >= until {
            break;
        }
    }
    let remaining = session
        .bounded(queue::failed_count(&session, &name, after))
        .await?;
    if retried == 0
        && start == 0
        && remaining == 0
        && !session.bounded(queue::queue_known(&session, &name)).await?
    {
        return Err(ApiError::NoSuchQueue);
    }
    Ok(Json(RetriedFailed {
        queue: name,
        retried,
        next: after,
        remaining,
    }))
}
