//! The batch routes (docs/dependencies.md, "Batches"), through the same functions as `pgtaskd
//! batch` (`queue::batches`): `POST /batches` opens one, `POST /batches/{id}/seal` seals it,
//! `GET /batches/{id}` reads it. Members join with `POST /tasks` and `"batch_id"`
//! (`submission.rs`). Behind the bearer token, as every route but `/healthz` and `/ui`.

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{require_json, Db};
use super::AppState;
use crate::queue::batches::{self, BatchState, CallbackOn, Sealed};
use crate::queue::enqueue::{check_payload, check_queue_name};

/// The `{id}` of a batch route: 400 unless it is an integer.
pub(super) struct BatchId(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for BatchId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let bad = || ApiError::BadRequest("the batch id must be an integer".into());
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| bad())?;
        id.parse().map(BatchId).map_err(|_| bad())
    }
}

/// The body of `POST /batches`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Opening {
    /// The callback's queue; absent or `null`: the default queue.
    #[serde(default)]
    callback_queue: Option<String>,
    /// `success` or `finish`.
    on: String,
    /// The callback's payload.
    payload: String,
}

/// `POST /batches` with `{"callback_queue", "on": "success"|"finish", "payload"}`: 201 with
/// `{"id", "callback_id", "state": "open"}` and `Location: /batches/{id}`; 400 for a body
/// that is not such an object (judged before a session is taken: 400 even in an outage).
pub(super) async fn open(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    require_json(&headers, "batch")?;
    let opening: Opening = serde_json::from_slice(&body)
        .map_err(|err| ApiError::BadRequest(format!("invalid batch: {err}")))?;
    let on: CallbackOn = opening
        .on
        .parse()
        .map_err(|err: batches::BadCallbackOn| ApiError::BadRequest(err.to_string()))?;
    let queue = opening
        .callback_queue
        .unwrap_or_else(|| crate::config::DEFAULT_QUEUE.to_string());
    check_queue_name(&queue)?;
    check_payload(&opening.payload)?;
    let session = state.pool.get().await?;
    let opened = session
        .bounded(batches::open(&session, &queue, on, &opening.payload))
        .await?;
    let location = [(header::LOCATION, format!("/batches/{}", opened.id))];
    let answer = serde_json::json!({
        "id": opened.id,
        "callback_id": opened.callback_id,
        "state": BatchState::Open,
    });
    Ok((StatusCode::CREATED, location, Json(answer)).into_response())
}

/// `POST /batches/{id}/seal`: 200 with `{"id", "state"}`, the state after the seal: `sealed`,
/// or `ended` when every member had ended; sealing a sealed batch changes nothing. 404 for a
/// batch that does not exist.
pub(super) async fn seal(BatchId(id): BatchId, Db(session): Db) -> Result<Response, ApiError> {
    match session.bounded(batches::seal(&session, id)).await? {
        Sealed::Now(state) => {
            Ok(Json(serde_json::json!({ "id": id, "state": state })).into_response())
        }
        Sealed::NotFound => Err(ApiError::NoSuchBatch),
    }
}

/// `GET /batches/{id}`: 200 with the batch as `pgtaskd batch status --json` prints it; 404.
pub(super) async fn read(BatchId(id): BatchId, Db(session): Db) -> Result<Response, ApiError> {
    match session.bounded(batches::get(&session, id)).await? {
        Some(batch) => Ok(Json(batch).into_response()),
        None => Err(ApiError::NoSuchBatch),
    }
}
