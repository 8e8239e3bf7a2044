//! Requests of other sites, refused when no token guards the API (docs/http.md,
//! "Authentication"): without `http.token_file`, whoever reaches the port is trusted, and a
//! browser on the same host reaches it for any page it shows. A page of another site can send
//! it requests that need no permission (a form's POST, a `fetch` in `no-cors` mode), which
//! would enqueue its own payload into an `exec` queue or pause a queue; and a name of the
//! attacker's that it points at 127.0.0.1 (DNS rebinding) makes the page's requests same-site
//! for the browser, so that it may read the answers. So, without a token:
//!
//! - a request whose `Origin` (which browsers send with every request but a plain `GET`) is
//!   not the server it was sent to, as its `Host` names it, is 403;
//! - on a server bound to a loopback address, a request whose `Host` is not `localhost` or a
//!   loopback address is 403.
//!
//! `/healthz` is left out. Clients that are not browsers send no `Origin`, and name the
//! server by its address. With a
//! token, a browser cannot send it for another site's page (the API answers no CORS
//! preflight), and both checks are left out: a proxy may then name the server as it likes.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// Refuse what [the module](self) says, when no token is set.
pub(super) async fn refuse_other_sites(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    // `/healthz` answers nothing of the tasks and changes nothing: probes may name the
    // server as they like.
    if state.token.is_some() || request.uri().path() == "/healthz" {
        return next.run(request).await;
    }
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let from = origin.to_str().unwrap_or("");
        if !same_server(from, host) {
            return ApiError::OtherSite(format!(
                "a request from the page of another site ({from:?}) is refused: set \
                 http.token_file to take requests of other origins"
            ))
            .into_response();
        }
    }
    if state.loopback {
        if let Some(host) = host.filter(|host| !names_loopback(host)) {
            return ApiError::OtherSite(format!(
                "this server listens on a loopback address and takes no other name than \
                 localhost or a loopback address ({host:?}): set http.token_file to serve it \
                 under other names"
            ))
            .into_response();
        }
    }
    next.run(request).await
}

/// Whether `origin` (`scheme://host[:port]`) is the server that `host` (the `Host` header)
/// names.
fn same_server(origin: &str, host: Option<&str>) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let Some(host) = host else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    let with_port = |name: &str| {
        let name = name.to_ascii_lowercase();
        if has_port(&name) {
            name
        } else {
            name + default_port
        }
    };
    with_port(authority) == with_port(host)
}

/// Whether the authority `name` (`host`, `host:port`, `[v6]` or `[v6]:port`) ends in a port.
fn has_port(name: &str) -> bool {
    match name.rsplit_once(':') {
        Some((before, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!before.contains(':') || before.ends_with(']'))
        }
        None => false,
    }
}

/// Whether the `Host` header names a loopback address or `localhost`, with any port.
fn names_loopback(host: &str) -> bool {
    let name = if has_port(host) {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    } else {
        host
    };
    let name = name
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_the_server_its_host_names() {
        let same = [
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://LOCALHOST:8080", "localhost:8080"),
            ("http://localhost", "localhost:80"),
            ("https://pgtaskd.internal", "pgtaskd.internal"),
            ("http://[::1]:9", "[::1]:9"),
        ];
        for (origin, host) in same {
            assert!(same_server(origin, Some(host)), "{origin} {host}");
        }
        let other = [
            ("http://localhost:5794", Some("127.0.0.1:5795")),
            ("http://evil.example", Some("127.0.0.1:80")),
            ("null", Some("127.0.0.1:8080")),
            ("file://", Some("127.0.0.1:8080")),
            ("https://127.0.0.1:8080", Some("127.0.0.1")),
            ("http://127.0.0.1:8080", None),
        ];
        for (origin, host) in other {
            assert!(!same_server(origin, host), "{origin} {host:?}");
        }
    }

    #[test]
    fn loopback_names_are_localhost_and_loopback_addresses() {
        for host in [
            "localhost",
            "LocalHost:9187",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]:9187",
            "::1",
        ] {
            assert!(names_loopback(host), "{host}");
        }
        for host in [
            "evil.example:9187",
            "10.0.0.1",
            "[::2]:80",
            "localhost.evil.example",
            "",
        ] {
            assert!(!names_loopback(host), "{host}");
        }
    }
}
