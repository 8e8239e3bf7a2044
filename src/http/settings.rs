//! A queue's limits and defaults (docs/limits.md), through the same functions as `pgtaskd
//! queue set|show`: `GET /queues/{queue}/settings` answers the settings in force, each `null`
//! when unset (200 for a queue without any, or without any task: a queue need not exist to be
//! limited); `PUT /queues/{queue}/settings` takes a JSON object with the keys of
//! `pgtaskd.set_queue` (a `null` removes a setting, the keys not named stay as they are) and
//! answers the settings in force after it. Both are behind the bearer token, as every route
//! but `/healthz` and `/ui`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::extract::{require_json, Db};
use super::queues::QueueName;
use super::AppState;
use crate::queue::settings::{self, Change, QueueSettings};

/// `GET /queues/{queue}/settings`.
pub(super) async fn read(
    QueueName(name): QueueName,
    Db(session): Db,
) -> Result<Json<QueueSettings>, ApiError> {
    Ok(Json(session.bounded(settings::get(&session, &name)).await?))
}

/// `PUT /queues/{queue}/settings`: 200 with the settings in force; 400 for a body that is not
/// a JSON object of known settings with usable values, judged before a session is taken (a
/// bad request is 400 even in an outage).
pub(super) async fn put(
    State(state): State<AppState>,
    QueueName(name): QueueName,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<QueueSettings>, ApiError> {
    require_json(&headers, "settings")?;
    let object: Map<String, Value> = serde_json::from_slice(&body)
        .map_err(|err| ApiError::BadRequest(format!("invalid settings: {err}")))?;
    let change = Change::from_json(&object).map_err(|err| ApiError::BadRequest(err.to_string()))?;
    let session = state.pool.get().await?;
    Ok(Json(
        session
            .bounded(settings::set(&session, &name, &change))
            .await?,
    ))
}
