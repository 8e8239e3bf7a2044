//! The schedule routes (docs/schedules.md), through the same SQL functions as `pgtaskd
//! schedule`: `GET /schedules` (each with its next fire), `GET /schedules/{name}`, `PUT
//! /schedules/{name}` (add or replace; 201 when new, 200 when replaced; `"paused"` pauses or
//! resumes it) and `DELETE /schedules/{name}` (404 when there is none).

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{require_json, Db};
use super::AppState;
use crate::schedule::store::{self, NewSchedule};
use crate::schedule::{self as schedules, Missed};

/// The `{name}` of a schedule route: 400 unless it is a schedule name.
pub(super) struct ScheduleName(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ScheduleName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::BadRequest("the schedule name is not UTF-8 text".into()))?;
        schedules::check_name(&name).map_err(ApiError::BadRequest)?;
        Ok(ScheduleName(name))
    }
}

/// The body of `PUT /schedules/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Definition {
    cron: Option<String>,
    /// A period such as "1s", "15m" or "1h".
    every: Option<String>,
    tz: Option<String>,
    queue: Option<String>,
    /// A text, or a JSON object or array (stored as its JSON text).
    payload: serde_json::Value,
    priority: Option<i16>,
    missed: Option<String>,
    no_overlap: Option<bool>,
    paused: Option<bool>,
}

/// `GET /schedules`: every schedule, by name, with its next fire.
pub(super) async fn list(Db(session): Db) -> Result<Response, ApiError> {
    let (schedules, _) = session.bounded(store::list(&session)).await?;
    Ok(Json(serde_json::json!({ "schedules": schedules })).into_response())
}

/// `GET /schedules/{name}`: 404 when there is none.
pub(super) async fn read(
    ScheduleName(name): ScheduleName,
    Db(session): Db,
) -> Result<Response, ApiError> {
    match session.bounded(store::get(&session, &name)).await? {
        Some(schedule) => Ok(Json(schedule).into_response()),
        None => Err(ApiError::NoSuchSchedule),
    }
}

/// `PUT /schedules/{name}`: 201 with the schedule when it is new, 200 when it replaced one.
pub(super) async fn put(
    State(state): State<AppState>,
    ScheduleName(name): ScheduleName,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    // The request is judged before a session is taken: a bad one is 400 even in an outage.
    require_json(&headers, "schedule")?;
    let definition: Definition = serde_json::from_slice(&body)
        .map_err(|err| ApiError::BadRequest(format!("invalid schedule: {err}")))?;
    let every = definition
        .every
        .as_deref()
        .map(|every| {
            humantime::parse_duration(every)
                .map_err(|err| ApiError::BadRequest(format!("invalid \"every\" {every:?}: {err}")))
        })
        .transpose()?;
    let payload = match definition.payload {
        serde_json::Value::String(text) => text,
        value @ (serde_json::Value::Object(_) | serde_json::Value::Array(_)) => value.to_string(),
        _ => {
            return Err(ApiError::BadRequest(
                "\"payload\" must be a text, or a JSON object or array".into(),
            ))
        }
    };
    let missed: Missed = definition
        .missed
        .as_deref()
        .unwrap_or("coalesce")
        .parse()
        .map_err(ApiError::BadRequest)?;
    let schedule = NewSchedule {
        name,
        cron: definition.cron,
        every,
        tz: definition.tz.unwrap_or_else(|| "UTC".to_string()),
        queue: definition.queue.unwrap_or_else(|| "default".to_string()),
        payload,
        priority: definition.priority.unwrap_or(0),
        missed,
        no_overlap: definition.no_overlap.unwrap_or(false),
        paused: definition.paused,
    };
    // A cron pattern of no date at all is found by a search that may take a few hundred
    // milliseconds (once per pattern): off the runtime's threads, which keep the leases.
    let schedule = tokio::task::spawn_blocking(move || schedule.check().map(|()| schedule))
        .await
        .expect("checking a schedule does not panic")
        .map_err(ApiError::BadRequest)?;
    let session = state.pool.get().await?;
    // Its paused state is written with the rest, in one statement.
    let created = session.bounded(store::put(&session, &schedule)).await?;
    let written = session
        .bounded(store::get(&session, &schedule.name))
        .await?
        // Removed between the two statements: as if never written.
        .ok_or(ApiError::NoSuchSchedule)?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(written)).into_response())
}

/// `DELETE /schedules/{name}`: 200, or 404 when there is none. The tasks it made stay.
pub(super) async fn remove(
    ScheduleName(name): ScheduleName,
    Db(session): Db,
) -> Result<Response, ApiError> {
    if session.bounded(store::remove(&session, &name)).await? {
        Ok(Json(serde_json::json!({ "name": name, "removed": true })).into_response())
    } else {
        Err(ApiError::NoSuchSchedule)
    }
}
