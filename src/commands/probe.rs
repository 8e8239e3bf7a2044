//! `pgtaskd probe [--ready]`: the exec probe of a container. It reads the configuration `run`
//! reads, connects to the daemon's own HTTP listener (`http.listen`, a wildcard address probed
//! on loopback), sends `GET /healthz` (or `GET /readyz` with `--ready`) with the bearer token
//! of `http.token_file` when one is set, and exits 0 when the answer is 200. Anything else is
//! one line on standard error saying why, and exit 1 (an answer that is not 200), 69 (no
//! answer: nothing listening, or the deadline) or 78 (no `http.listen`, an unreadable token).
//!
//! Kubernetes' `httpGet` probes cannot take a header from a Secret; an exec probe reads the
//! token file the pod mounts, as the daemon does.

use std::process::ExitCode;
use std::time::Duration;

use axum::http::{header, Request, StatusCode};
use hyper_util::rt::TokioIo;

use super::CommandError;
use crate::config::Config;

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("http.listen is not set: there is no HTTP listener to probe")]
    NotListening,
    #[error(transparent)]
    Token(#[from] crate::http::HttpError),
    #[error("no answer from {addr} within {}s", .timeout.as_secs_f64())]
    Timeout { addr: String, timeout: Duration },
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no HTTP answer from {addr}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{path} answered {status}{}", reason_text(.reason))]
    Answered {
        path: &'static str,
        status: StatusCode,
        reason: Option<String>,
    },
}

fn reason_text(reason: &Option<String>) -> String {
    reason
        .as_deref()
        .map_or_else(String::new, |reason| format!(": {reason}"))
}

impl ProbeError {
    /// 78 for the configuration, 69 for no answer, 1 for an answer that is not 200.
    pub(super) fn exit_code(&self) -> u8 {
        match self {
            ProbeError::NotListening | ProbeError::Token(_) => super::EXIT_CONFIG,
            ProbeError::Timeout { .. } | ProbeError::Connect { .. } | ProbeError::Http { .. } => {
                super::EXIT_UNAVAILABLE
            }
            ProbeError::Answered { .. } => super::EXIT_RUNTIME,
        }
    }
}

/// Probe the local listener; `ready` asks `/readyz` instead of `/healthz`.
pub(super) async fn probe(
    config: &Config,
    ready: bool,
    timeout: Duration,
) -> Result<ExitCode, CommandError> {
    let listen = config
        .http
        .listen
        .as_deref()
        .ok_or(ProbeError::NotListening)?;
    let token = match &config.http.token_file {
        Some(path) => Some(crate::http::read_token(path).map_err(ProbeError::from)?),
        None => None,
    };
    let addr = local_address(listen);
    let path = if ready { "/readyz" } else { "/healthz" };
    let asked = ask(&addr, path, token.as_deref());
    let (status, body) =
        tokio::time::timeout(timeout, asked)
            .await
            .map_err(|_| ProbeError::Timeout {
                addr: addr.clone(),
                timeout,
            })??;
    if status != StatusCode::OK {
        let reason = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|json| {
                json.get("reason")
                    .or_else(|| json.get("error"))
                    .and_then(|v| v.as_str().map(str::to_string))
            });
        return Err(ProbeError::Answered {
            path,
            status,
            reason,
        }
        .into());
    }
    Ok(ExitCode::SUCCESS)
}

/// The address to reach a listener on `listen` from the same host: a wildcard address
/// (`0.0.0.0`, `[::]`) is reached on loopback; any other host as it is written.
fn local_address(listen: &str) -> String {
    match listen.rsplit_once(':') {
        Some(("0.0.0.0" | "", port)) => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => listen.to_string(),
    }
}

/// `GET path` on `addr` over one HTTP/1.1 connection: the status and the body.
async fn ask(
    addr: &str,
    path: &'static str,
    token: Option<&str>,
) -> Result<(StatusCode, Vec<u8>), ProbeError> {
    let connect_error = |source| ProbeError::Connect {
        addr: addr.to_string(),
        source,
    };
    let http_error = |source| ProbeError::Http {
        addr: addr.to_string(),
        source,
    };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(connect_error)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http_error)?;
    let driver = tokio::spawn(connection);
    let mut request = Request::get(path)
        .header(header::HOST, addr)
        .header(header::CONNECTION, "close");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(String::new())
        .expect("a GET with valid headers builds");
    let response = sender.send_request(request).await.map_err(http_error)?;
    let status = response.status();
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 64 << 10)
        .await
        .map(|bytes| bytes.to_vec())
        .unwrap_or_default();
    driver.abort();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::local_address;

    #[test]
    fn a_wildcard_listener_is_probed_on_loopback() {
        assert_eq!(local_address("0.0.0.0:9187"), "127.0.0.1:9187");
        assert_eq!(local_address("[::]:9187"), "[::1]:9187");
        assert_eq!(local_address("127.0.0.1:80"), "127.0.0.1:80");
        assert_eq!(local_address("localhost:80"), "localhost:80");
    }
}
