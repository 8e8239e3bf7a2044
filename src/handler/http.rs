//! The `http` handler: one `POST` per task to the queue's `url`, over the daemon's one
//! keep-alive client (docs/handlers.md, "http").
//!
//! The request carries the payload as its body and says which task and claim it is
//! (`Pgtaskd-Task-Id`, `Idempotency-Key`, the task's key, the same for every attempt,
//! `Pgtaskd-Attempt`, `Pgtaskd-Run`, `Pgtaskd-Queue`, `Pgtaskd-Claim`, and when the task has
//! them `Pgtaskd-Idempotency-Key`, `Pgtaskd-Parents` with `Pgtaskd-Parent-Count`, and
//! `traceparent`).
//! The answer decides the attempt: a 2xx body is the output; 400, 404, 410 and 422 fail the
//! task at once; any other status, a timeout or a broken connection is a failed attempt,
//! retried (after the answer's `Retry-After` when it has one). Redirects are not followed: a
//! 3xx is a failed attempt like a 5xx.
//!
//! | file | owns |
//! | --- | --- |
//! | `http.rs` | the client (TLS, pool, no redirects), the request, the deadline and the cancel |
//! | `http/answer.rs` | what an answer means: status, `Retry-After`, bounded body reads |

mod answer;

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::Url;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Failure, FailureKind, Job, Ran, Retry};

/// A queue's `http` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSpec {
    /// Where each task is posted (http or https).
    pub url: String,
    /// The whole request, from connecting to the last byte of the answer.
    pub timeout: Duration,
    /// The most bytes of a 2xx body kept as the output; over it the attempt fails.
    pub max_output: usize,
}

/// How long a pooled connection may sit idle before the client closes it: under the
/// keep-alive timeouts common servers apply (Node's is 5 s), so that the client rarely sends
/// a request on a connection the server is closing at that moment.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// The `User-Agent` of every request.
const USER_AGENT: &str = concat!("pgtaskd/", env!("CARGO_PKG_VERSION"));

/// The daemon's one HTTP client: keep-alive connections shared by every `http` queue.
///
/// Cloning is cheap and shares the connection pool.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
}

impl HttpClient {
    /// Build the client (rustls, the system's roots).
    ///
    /// TLS uses the ring provider, as the connections to PostgreSQL do, and trusts the
    /// system's root certificates. Redirects are never followed: a task is posted to the URL
    /// its queue names and nowhere else, and a 3xx is a failed attempt. Proxies come from the
    /// environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`), as most HTTP clients do.
    ///
    /// # Errors
    ///
    /// A client that cannot be built (an invalid TLS configuration). A system without root
    /// certificates is only warned about: plain http endpoints still work.
    pub fn new() -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config()?)
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .user_agent(USER_AGENT)
            .build()
            .map_err(|err| format!("cannot build the HTTP client: {}", error_chain(err)))?;
        Ok(HttpClient { client })
    }

    /// Post `payload` for `job` to `spec.url`.
    ///
    /// The whole exchange (connecting, sending, the answer's head and body) is bounded by
    /// `spec.timeout`; `cancel` firing drops the request at once (the connection is closed, as
    /// the answer was not read) and answers [`Ran::Canceled`].
    pub async fn post(
        &self,
        spec: &HttpSpec,
        job: &Job,
        payload: bytes::Bytes,
        cancel: &CancellationToken,
    ) -> Ran {
        let shown = shown_url(&spec.url);
        let deadline = Instant::now() + spec.timeout;
        let exchange = self.exchange(spec, job, payload, &shown, deadline);
        tokio::select! {
            biased;
            () = cancel.cancelled() => Ran::Canceled,
            ran = tokio::time::timeout_at(deadline, exchange) => match ran {
                Ok(ran) => ran,
                Err(_) => Ran::Failed(timed_out(&shown, spec.timeout)),
            },
        }
    }

    /// Send the request and read the answer, with no bound of its own on the time.
    async fn exchange(
        &self,
        spec: &HttpSpec,
        job: &Job,
        payload: bytes::Bytes,
        shown: &str,
        deadline: Instant,
    ) -> Ran {
        let response = match self
            .client
            .post(spec.url.as_str())
            .headers(headers(job, &payload))
            .body(payload)
            .send()
            .await
        {
            Ok(response) => response,
            Err(err) => return Ran::Failed(unreachable(shown, err)),
        };
        answer::read(response, spec, shown, deadline).await
    }
}

/// The rustls configuration: the ring provider and the system's root certificates.
fn tls_config() -> Result<rustls::ClientConfig, String> {
    let native = rustls_native_certs::load_native_certs();
    for err in &native.errors {
        tracing::warn!(error = %err, "cannot load a system root certificate");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        tracing::warn!("no system root certificate: https endpoints will not be trusted");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("invalid TLS configuration for the HTTP client: {err}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The headers that tell the endpoint what the body is ([`content_type`]) and which task and
/// claim a request is.
///
/// The ids are digits and queue names are checked by the configuration; a `traceparent`
/// that is not a valid header value (it came from a row) is left out rather than failing the
/// task.
fn headers(job: &Job, payload: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(13);
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(content_type(payload)),
    );
    headers.insert(
        HeaderName::from_static("pgtaskd-task-id"),
        HeaderValue::from(job.id),
    );
    headers.insert(
        HeaderName::from_static("pgtaskd-attempt"),
        HeaderValue::from(job.attempt),
    );
    match HeaderValue::from_str(&job.queue) {
        Ok(queue) => {
            headers.insert(HeaderName::from_static("pgtaskd-queue"), queue);
        }
        Err(_) => tracing::warn!(queue = %job.queue, "queue name is not a valid header value"),
    }
    headers.insert(
        HeaderName::from_static("pgtaskd-run"),
        HeaderValue::from(job.run),
    );
    headers.insert(
        HeaderName::from_static("pgtaskd-claim"),
        HeaderValue::from(job.token),
    );
    // The task's key is ASCII letters, digits and dashes: always a valid value.
    if let Ok(key) = HeaderValue::from_str(&job.key) {
        headers.insert(HeaderName::from_static("idempotency-key"), key);
    }
    if let Some(key) = &job.idempotency_key {
        if let Ok(key) = HeaderValue::from_str(&percent_encoded(key)) {
            headers.insert(HeaderName::from_static("pgtaskd-idempotency-key"), key);
        }
        // A schedule's fire: its name and instant are visible ASCII.
        if let Some((schedule, instant)) = crate::schedule::fired_by(key) {
            if let (Ok(schedule), Ok(instant)) = (
                HeaderValue::from_str(schedule),
                HeaderValue::from_str(instant),
            ) {
                headers.insert(HeaderName::from_static("pgtaskd-schedule"), schedule);
                headers.insert(HeaderName::from_static("pgtaskd-scheduled-at"), instant);
            }
        }
    }
    // `ID=STATUS,...`: digits, capitals, `=` and commas, always a valid value.
    if let Some(parents) = &job.parents {
        if let Ok(value) = HeaderValue::from_str(parents) {
            headers.insert(HeaderName::from_static("pgtaskd-parents"), value);
            headers.insert(
                HeaderName::from_static("pgtaskd-parent-count"),
                HeaderValue::from(job.parent_count),
            );
        }
    }
    // A batch's id, and a callback's counts (`succeeded=N,failed=N,canceled=N`): always valid.
    if let Some(batch) = job.batch {
        headers.insert(
            HeaderName::from_static("pgtaskd-batch"),
            HeaderValue::from(batch),
        );
    }
    if let Some(counts) = &job.batch_counts {
        if let Ok(value) = HeaderValue::from_str(counts) {
            headers.insert(HeaderName::from_static("pgtaskd-batch-counts"), value);
        }
    }
    // An earlier attempt's progress, the same JSON in ASCII (`\uXXXX` escapes), so that a
    // header can carry it whatever its characters.
    // A report is refused when that form is over `MAX_LINE`; one written before that rule
    // (up to three times as long) is left out rather than sent into a proxy's header limit.
    if let Some(progress) = &job.progress {
        let ascii = crate::progress::ascii_json(progress);
        let value = if ascii.len() > crate::progress::MAX_LINE {
            Err(())
        } else {
            HeaderValue::from_str(&ascii).map_err(|_| ())
        };
        match value {
            Ok(value) => {
                headers.insert(HeaderName::from_static("pgtaskd-progress"), value);
            }
            Err(()) => tracing::warn!(
                task = job.id,
                "the task's progress is not a valid header value of at most 4096 bytes; sent without it"
            ),
        }
    }
    if let Some(traceparent) = &job.traceparent {
        match HeaderValue::from_str(traceparent) {
            Ok(value) => {
                headers.insert(HeaderName::from_static("traceparent"), value);
            }
            Err(_) => tracing::warn!(
                task = job.id,
                "the task's traceparent is not a valid header value; sent without it"
            ),
        }
    }
    headers
}

/// `text` with every byte but the unreserved characters of RFC 3986 (`A-Z a-z 0-9 - . _ ~`)
/// written `%XX`: a producer's idempotency key is any text, a header value only visible
/// ASCII, and a key of unreserved characters alone is sent as it is.
fn percent_encoded(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The `Content-Type` of a payload: `application/json` when the whole text is a JSON object
/// or array (what `POST /tasks` stores for a JSON payload that is not a string, and what a
/// producer's `json.dumps` or `JSON.stringify` of one writes), else `text/plain;
/// charset=utf-8`. A JSON string, number or bare word stays text: most payloads that are one
/// are meant as text (`42`, `true`, a quoted line).
fn content_type(payload: &[u8]) -> &'static str {
    let starts_as_json = payload
        .iter()
        .find(|byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|byte| matches!(byte, b'{' | b'['));
    if starts_as_json && serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    }
}

/// `url` as messages show it (in a task's error, which every reader of the table sees, and in
/// the log): without its user name, password, query and fragment, where an endpoint's key
/// often rides (`?key=...`); a dropped query shows as `?...`.
pub fn shown_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) => {
            if !parsed.username().is_empty() || parsed.password().is_some() {
                // Both only fail for URLs that cannot have credentials, which have none.
                let _ = parsed.set_username("");
                let _ = parsed.set_password(None);
            }
            let had_query = parsed.query().is_some_and(|query| !query.is_empty());
            parsed.set_query(None);
            parsed.set_fragment(None);
            let mut shown = parsed.to_string();
            if had_query {
                shown.push_str("?...");
            }
            shown
        }
        // Not a URL: show what is before any '@', '?' or '#' no more than the rest.
        Err(_) => {
            let url = url.split(['?', '#']).next().unwrap_or_default();
            match url.rsplit_once('@') {
                Some((before, after)) => match before.split_once("://") {
                    Some((scheme, _)) => format!("{scheme}://{after}"),
                    None => after.to_string(),
                },
                None => url.to_string(),
            }
        }
    }
}

/// The failed attempt of a request that did not get a whole answer in `timeout`.
fn timed_out(shown: &str, timeout: Duration) -> Failure {
    Failure {
        message: format!(
            "no complete answer from {shown} within the timeout of {}",
            humantime::format_duration(timeout)
        ),
        retry: Retry::Later { after: None },
        kind: FailureKind::Timeout,
    }
}

/// The failed attempt of a request that got no answer: no connection (refused, DNS, TLS),
/// or a connection that broke before the answer's head.
fn unreachable(shown: &str, err: reqwest::Error) -> Failure {
    let what = if err.is_builder() {
        "cannot post to"
    } else if err.is_connect() {
        "cannot connect to"
    } else {
        "no answer from"
    };
    let mut causes = error_chain(err);
    if causes.contains("invalid peer certificate") {
        // rustls names the check that failed in its own terms (`UnknownIssuer`,
        // `Other(OtherError(CaUsedAsEndEntity))`): say what it means for the operator.
        causes.push_str(
            " (the endpoint's TLS certificate is not trusted: pgtaskd trusts the system's CA \
             certificates; add the endpoint's CA there, as update-ca-certificates does)",
        );
    }
    Failure {
        message: format!("{what} {shown}: {causes}"),
        retry: Retry::Later { after: None },
        kind: FailureKind::Unreachable,
    }
}

/// An error's causes in one line (`tcp connect error: Connection refused (os error 111)`),
/// without the URL (it may hold a password; the caller names the URL itself) and without the
/// layers' wrappers ("error sending request", "client error (Connect)") or repetitions.
fn error_chain(err: reqwest::Error) -> String {
    let err = err.without_url();
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        let text = cause.to_string();
        let wrapper = text.starts_with("client error (");
        if !wrapper && !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    if parts.is_empty() {
        return err.to_string();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_lose_their_credentials_and_query() {
        assert_eq!(
            shown_url("https://user:secret@example.com:8443/run?key=secret#frag"),
            "https://example.com:8443/run?..."
        );
        assert_eq!(
            shown_url("http://example.com/run?"),
            "http://example.com/run"
        );
        assert_eq!(
            shown_url("http://example.com/run"),
            "http://example.com/run"
        );
        assert_eq!(shown_url("http://user:se cret@[bad/x"), "http://[bad/x");
        assert_eq!(shown_url("http://[bad/x?key=secret"), "http://[bad/x");
    }

    #[test]
    fn headers_name_the_task_and_claim() {
        let job = Job {
            id: 42,
            attempt: 3,
            queue: "mail".into(),
            token: 9001,
            run: 4,
            key: "0123456789abcdef-42-1765000000000000".into(),
            idempotency_key: None,
            traceparent: None,
            parents: None,
            parent_count: 0,
            progress: None,
            batch: None,
            batch_counts: None,
        };
        let headers = headers(&job, b"x");
        assert_eq!(headers["pgtaskd-task-id"], "42");
        assert_eq!(headers["pgtaskd-attempt"], "3");
        assert_eq!(headers["pgtaskd-run"], "4");
        assert_eq!(headers["pgtaskd-queue"], "mail");
        assert_eq!(headers["pgtaskd-claim"], "9001");
        assert_eq!(
            headers["idempotency-key"],
            "0123456789abcdef-42-1765000000000000"
        );
        assert!(!headers.contains_key("pgtaskd-idempotency-key"));
        assert!(!headers.contains_key("traceparent"));
        assert!(!headers.contains_key("pgtaskd-parents"));
        assert!(!headers.contains_key("pgtaskd-parent-count"));
        assert!(!headers.contains_key("pgtaskd-progress"));
        let resumed = Job {
            progress: Some(r#"{"cursor": "é", "percent": 40}"#.into()),
            ..job.clone()
        };
        let resumed = super::headers(&resumed, b"x");
        assert_eq!(
            resumed["pgtaskd-progress"],
            r#"{"cursor": "\u00e9", "percent": 40}"#
        );
        let child = Job {
            parents: Some("12=SUCCEEDED,13=CANCELED".into()),
            parent_count: 250,
            batch: None,
            batch_counts: None,
            ..job.clone()
        };
        let child = super::headers(&child, b"x");
        assert_eq!(child["pgtaskd-parents"], "12=SUCCEEDED,13=CANCELED");
        assert_eq!(child["pgtaskd-parent-count"], "250");
        assert!(!child.contains_key("pgtaskd-batch"));
        let callback = Job {
            batch: Some(7),
            batch_counts: Some("succeeded=9998,failed=2,canceled=0".into()),
            ..job.clone()
        };
        let callback = super::headers(&callback, b"x");
        assert_eq!(callback["pgtaskd-batch"], "7");
        assert_eq!(
            callback["pgtaskd-batch-counts"],
            "succeeded=9998,failed=2,canceled=0"
        );
        let keyed = Job {
            idempotency_key: Some("order-17".into()),
            ..job.clone()
        };
        assert_eq!(
            super::headers(&keyed, b"x")["pgtaskd-idempotency-key"],
            "order-17"
        );
        assert!(!super::headers(&keyed, b"x").contains_key("pgtaskd-schedule"));
        let fired = Job {
            idempotency_key: Some("schedule:nightly:2026-12-06T03:00:00Z".into()),
            ..job.clone()
        };
        let fired = super::headers(&fired, b"x");
        assert_eq!(fired["pgtaskd-schedule"], "nightly");
        assert_eq!(fired["pgtaskd-scheduled-at"], "2026-12-06T03:00:00Z");
        let odd = Job {
            idempotency_key: Some("order 17/ü%\n".into()),
            ..job.clone()
        };
        assert_eq!(
            super::headers(&odd, b"x")["pgtaskd-idempotency-key"],
            "order%2017%2F%C3%BC%25%0A"
        );
        let bad = Job {
            traceparent: Some("00-x\n-y".into()),
            ..job
        };
        assert!(!super::headers(&bad, b"x").contains_key("traceparent"));
    }

    #[test]
    fn a_json_object_or_array_is_sent_as_json_and_anything_else_as_text() {
        for json in [&b"{}"[..], b"[1,2]", b" \n{\"a\": [true]}\n", b"[]"] {
            assert_eq!(content_type(json), "application/json", "{json:?}");
        }
        for text in [
            &b""[..],
            b"hello",
            b"42",
            b"true",
            b"null",
            b"\"quoted\"",
            b"{not json}",
            b"[1, 2",
            b"{} and more",
        ] {
            assert_eq!(content_type(text), "text/plain; charset=utf-8", "{text:?}");
        }
    }
}
