//! The queue routes: `POST /queues/{queue}/pause` and `POST /queues/{queue}/resume`, through
//! the same SQL functions as `pgtaskd pause`/`resume`. A pause takes effect at the daemons'
//! next claim; a resume wakes them at once (`NOTIFY pgtaskd_tasks`).

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::Json;
use serde::Serialize;

use super::error::ApiError;
use super::extract::Db;
use crate::queue;

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
