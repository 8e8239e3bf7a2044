//! The task routes' extractors: [`TaskId`] from the path, and [`Db`], a pooled session.
//! Each turns its failure into an [`ApiError`], so that a handler starts with what it needs.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;

use super::error::ApiError;
use super::AppState;
use crate::db::Session;

/// The `{id}` of a task route: 400 unless it is an integer.
pub(super) struct TaskId(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for TaskId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::BadTaskId)?;
        id.parse().map(TaskId).map_err(|_| ApiError::BadTaskId)
    }
}

/// A session from the pool: 503 when none can be had. Run its operations under
/// [`Session::bounded`], the pool's deadline.
pub(super) struct Db(pub Session);

impl FromRequestParts<AppState> for Db {
    type Rejection = ApiError;

    async fn from_request_parts(_parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(Db(state.pool.get().await?))
    }
}

/// Refuses (400) a body not sent as JSON, naming `what` it should hold.
pub(super) fn require_json(headers: &axum::http::HeaderMap, what: &str) -> Result<(), ApiError> {
    let is_json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().starts_with("application/json"));
    if is_json {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "send the {what} as JSON (Content-Type: application/json)"
        )))
    }
}
