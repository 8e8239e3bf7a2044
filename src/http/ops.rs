//! Operations routes: liveness, readiness, metrics, and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::AppState;

/// The OpenAPI 3 document of this server.
pub const OPENAPI: &str = include_str!("../../openapi.json");

/// `GET /healthz`: the process answers. No token needed.
pub(super) async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// `GET /readyz`: start-up finished, the listener is connected and the database answers now;
/// else 503 with the reason (starting, waiting for the database and why, shutting down,
/// listener not connected and why, or the database's own error). Either way, `warnings` says
/// what is wrong without making the daemon unready: an xmin horizon held back past
/// `health.xmin_horizon_warning` (docs/design.md, "Vacuum health"), which another role's
/// transaction can cause and restarting this daemon cannot cure.
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    let health = &state.health;
    let warnings = health.warnings();
    let with_warnings = |mut body: serde_json::Value| {
        if !warnings.is_empty() {
            body["warnings"] = serde_json::json!(warnings);
        }
        Json(body)
    };
    let not_ready = |reason: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            with_warnings(serde_json::json!({ "status": "not ready", "reason": reason })),
        )
            .into_response()
    };
    if health.is_stopping() {
        return not_ready("shutting down");
    }
    if !health.is_started() {
        return match health.why_waiting() {
            Some(why) => not_ready(&format!("waiting for the database: {why}")),
            None => not_ready("starting"),
        };
    }
    if !health.is_listening() {
        return match health.why_waiting() {
            Some(why) => not_ready(&format!("listener not connected: {why}")),
            None => not_ready("listener not connected"),
        };
    }
    let answer = match state.pool.get().await {
        Ok(session) => {
            session
                .bounded(async {
                    session
                        .simple_query("")
                        .await
                        .map_err(crate::db::DbError::from)
                })
                .await
        }
        Err(err) => Err(err),
    };
    if let Err(err) = answer {
        return not_ready(&err.to_string());
    }
    if let Some(refusal) = state.metrics.room_refusal() {
        return not_ready(&format!(
            "the database refuses to write results for want of room: {refusal}"
        ));
    }
    with_warnings(serde_json::json!({ "status": "ready" })).into_response()
}

/// `GET /metrics`: Prometheus text format. The table's figures are read now, per queue,
/// from the partial indexes (`queue::backlog`); the totals by status are their sums. The
/// vacuum health is the watch's last reading (`src/maintenance/vacuum_health.rs`), not read here.
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    if let Ok(session) = state.pool.get().await {
        let backlog = session.bounded(crate::queue::backlog(&session)).await;
        drop(session);
        if let Ok(backlog) = backlog {
            let waiting = backlog.iter().map(|queue| queue.waiting).sum();
            let queued = backlog.iter().map(|queue| queue.queued).sum();
            let running = backlog.iter().map(|queue| queue.running).sum();
            state
                .metrics
                .observe_table_and_pool((waiting, queued, running), state.pool.status());
            state.metrics.observe_queues(&backlog);
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// `GET /openapi.json`.
pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
