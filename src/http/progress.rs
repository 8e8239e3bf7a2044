//! `POST /tasks/{id}/progress`: an `http` handler's progress report (docs/handlers.md,
//! "Progress"). The body is one progress line (a JSON object of at most 4096 bytes, a
//! `percent` of 0 to 100 if any); the `Pgtaskd-Claim` header is the token the handler was
//! posted with. Accepted into the daemon's memory ([`Progress`](crate::progress::Progress)),
//! written by its flusher, fenced by the claim.
//!
//! The claim is checked against the database (`queue::progress::claim_of`), and taken as
//! current for a second once it was found so (`CLAIM_CHECKED_FOR`): a handler posting many
//! reports costs the database one read a second, and the write is fenced whatever the check
//! said.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::error::ApiError;
use super::extract::TaskId;
use super::AppState;
use crate::progress::{check, MAX_LINE};
use crate::queue::TaskStatus;

/// The header naming the claim a report is for.
const CLAIM: &str = "pgtaskd-claim";

/// 202 `{"id", "accepted": true}` once the report is in memory (written within a second);
/// 400 for a bad body (with why) or a missing or malformed `Pgtaskd-Claim`; 404 for no such
/// task; 409 when the claim is not the current one of a RUNNING task; 413 over 4096 bytes;
/// 503 when the database cannot tell.
pub(super) async fn report(
    TaskId(id): TaskId,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    if body.len() > MAX_LINE {
        return Err(ApiError::BodyOver { max: MAX_LINE });
    }
    let token = claim_header(&headers)?;
    let json = check(&body).map_err(|refused| ApiError::BadRequest(refused.to_string()))?;
    let progress = &state.progress;
    if !progress.claim_checked(id, token) {
        let found = {
            let session = state.pool.get().await?;
            session
                .bounded(crate::queue::progress::claim_of(&session, id))
                .await?
        };
        match found {
            None => return Err(ApiError::NoSuchTask),
            Some((TaskStatus::Running, Some(current))) if current == token => {
                progress.claim_current(id, token);
            }
            Some((status, _)) => return Err(ApiError::NotCurrentClaim(status)),
        }
    }
    if !progress.record(id, token, json) {
        return Err(ApiError::ProgressFull);
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "id": id, "accepted": true })),
    ))
}

/// The `Pgtaskd-Claim` header: 400 unless it is there and an integer.
fn claim_header(headers: &HeaderMap) -> Result<i64, ApiError> {
    headers
        .get(CLAIM)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| {
            ApiError::BadRequest(
                "a progress report needs the Pgtaskd-Claim header: the claim token the task was posted with"
                    .into(),
            )
        })
}
