//! `GET /ui`: the dashboard, an operator's console in one self-contained page (`ui.html`,
//! inline CSS and script, nothing fetched from elsewhere) compiled into the binary: the
//! overview of the queues, the task list filtered and paged by its cursor, a task's page.
//!
//! The page holds no data, so it is served without the token; its script asks for the token
//! once (or takes it from the URL fragment `#token=...`), keeps it in `sessionStorage`, and
//! sends it as `Authorization: Bearer` to the routes it calls: `GET /stats`,
//! `GET /stats/throughput`, `GET /tasks`, `GET /tasks/{id}`, `POST /tasks/{id}/retry` and
//! `/cancel`, and the queues' pause, resume and retry-failed routes. Every text from the
//! database is set with `textContent`, never parsed as HTML.

use axum::http::header;
use axum::response::IntoResponse;

/// The page.
const PAGE: &str = include_str!("ui.html");

/// `GET /ui`: the page, with a policy that lets it reach nothing but this server.
pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        PAGE,
    )
}
