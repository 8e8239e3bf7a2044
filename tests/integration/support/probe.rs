//! Asking a daemon's HTTP port from a test, as a probe or an operator's `curl` would.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::{eventually, WAIT};

/// `GET path` on the daemon's HTTP port on loopback: its status and body, the body as JSON
/// when it is JSON, else as a string; `None` while nothing answers within 5 s.
pub async fn get(port: u16, path: &str) -> Option<(StatusCode, Value)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let response = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .ok()?;
    let status = response.status();
    let body = response.text().await.ok()?;
    Some((
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    ))
}

/// Wait until `GET path` answers `want`; returns the body.
pub async fn wait_answer(port: u16, path: &str, want: StatusCode, what: &str) -> Value {
    eventually(WAIT, what, || async move {
        get(port, path)
            .await
            .filter(|(status, _)| *status == want)
            .map(|(_, body)| body)
    })
    .await
}
