//! What an endpoint's answer means for the attempt: the status, `Retry-After`, and the body,
//! read chunk by chunk so that memory stays bounded whatever the endpoint sends.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;
use tokio::time::Instant;

use super::{error_chain, HttpSpec};
use crate::handler::{Failure, FailureKind, Ran, Retry};

/// How much of a failed answer's body the task's error keeps.
const ERROR_HEAD: usize = 1024;

/// The attempt's outcome from `response` (its head has come; the body is read here).
///
/// `deadline` is the request's: the caller drops this future when it passes. The head of a
/// failed answer's body is read until then only, so that a status is reported as such even
/// when its body trickles.
pub(super) async fn read(
    response: reqwest::Response,
    spec: &HttpSpec,
    shown: &str,
    deadline: Instant,
) -> Ran {
    let status = response.status();
    // 202 with Retry-After: "not now, come back then": a snooze, no attempt used.
    if status == reqwest::StatusCode::ACCEPTED {
        if let Some(after) = retry_after(response.headers(), SystemTime::now()) {
            return Ran::Snoozed {
                after: Some(after.min(crate::handler::exec::MAX_SNOOZE)),
            };
        }
    }
    if status.is_success() {
        return output(response, spec.max_output, shown).await;
    }
    let (retry, kind) = verdict(status, response.headers(), SystemTime::now());
    // A redirect says where to, and that it is not followed (its target is not the URL the
    // queue names, and a POST's body would not follow it everywhere).
    let note = match status.is_redirection() {
        false => String::new(),
        true => match response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|location| location.to_str().ok())
        {
            Some(to) => format!(
                " (to {}; redirects are not followed: set the queue's url to where it points)",
                super::shown_url(to)
            ),
            None => " (redirects are not followed)".to_string(),
        },
    };
    let head = body_head(response, deadline).await;
    Ran::Failed(Failure {
        message: status_message(status, &note, &head),
        retry,
        kind,
    })
}

/// A 2xx answer's body as the output: valid UTF-8 of at most `max_output` bytes. Reading
/// stops at the first chunk over the limit (the connection is then closed, not drained).
async fn output(mut response: reqwest::Response, max_output: usize, shown: &str) -> Ran {
    if response
        .content_length()
        .is_some_and(|length| length > max_output as u64)
    {
        return Ran::Failed(over_max_output(shown, max_output));
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max_output {
                    return Ran::Failed(over_max_output(shown, max_output));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(err) => {
                return Ran::Failed(Failure {
                    message: format!(
                        "the connection to {shown} broke during the answer's body: {}",
                        error_chain(err)
                    ),
                    retry: Retry::Later { after: None },
                    kind: FailureKind::Unreachable,
                })
            }
        }
    }
    match String::from_utf8(body) {
        Ok(output) => Ran::Succeeded { output },
        Err(err) => Ran::Failed(Failure {
            message: format!(
                "the answer from {shown} is not valid UTF-8 (invalid byte at offset {} of {})",
                err.utf8_error().valid_up_to(),
                err.as_bytes().len()
            ),
            retry: Retry::Later { after: None },
            kind: FailureKind::Output,
        }),
    }
}

fn over_max_output(shown: &str, max_output: usize) -> Failure {
    Failure {
        message: format!(
            "the answer from {shown} is over max_output ({max_output} bytes); not read further"
        ),
        retry: Retry::Later { after: None },
        kind: FailureKind::Output,
    }
}

/// Whether a non-2xx answer is worth another attempt, and its kind for the metrics.
///
/// 400, 404, 410 and 422 say the task itself is wrong: FAILED at once. Any other status
/// (other 4xx, 5xx, 3xx as redirects are not followed, 1xx) is retried, after its
/// `Retry-After` when it has one.
fn verdict(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> (Retry, FailureKind) {
    let kind = if status.is_client_error() {
        FailureKind::Status4xx
    } else {
        FailureKind::Status5xx
    };
    let retry = match status.as_u16() {
        400 | 404 | 410 | 422 => Retry::Never,
        _ => Retry::Later {
            after: retry_after(headers, now),
        },
    };
    (retry, kind)
}

/// `Retry-After` as a wait from `now`: delta-seconds, or an HTTP date (a date already past
/// is no wait). None when absent or not understood.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_digit()) {
        // Digits past u64 are a wait no queue allows anyway: the lead caps it.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The first [`ERROR_HEAD`] bytes of the body (lossy UTF-8), or what came of them before
/// `deadline` or a broken connection.
async fn body_head(mut response: reqwest::Response, deadline: Instant) -> String {
    let mut head = Vec::with_capacity(ERROR_HEAD);
    let read = async {
        while head.len() < ERROR_HEAD {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = ERROR_HEAD - head.len();
                    head.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                Ok(None) | Err(_) => break,
            }
        }
    };
    let _ = tokio::time::timeout_at(deadline, read).await;
    String::from_utf8_lossy(&head).into_owned()
}

/// "HTTP 503 Service Unavailable", a `note` on it, ": " and the body's head (no colon when
/// it is empty).
fn status_message(status: StatusCode, note: &str, head: &str) -> String {
    let code = status.as_u16();
    let status = match status.canonical_reason() {
        Some(reason) => format!("HTTP {code} {reason}{note}"),
        None => format!("HTTP {code}{note}"),
    };
    let head = head.trim_end();
    if head.is_empty() {
        status
    } else {
        format!("{status}: {head}")
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = httpdate::parse_http_date("Thu, 03 Dec 2026 14:00:00 GMT").unwrap();
        let wait = |value: &str| retry_after(&with_retry_after(value), now);
        assert_eq!(wait("7"), Some(Duration::from_secs(7)));
        assert_eq!(wait(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            wait("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            wait("Thu, 03 Dec 2026 14:01:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(wait("Thu, 03 Dec 2026 13:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(wait("soon"), None);
        assert_eq!(wait("-5"), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn statuses_decide_the_retry() {
        let now = SystemTime::now();
        let none = HeaderMap::new();
        for code in [400, 404, 410, 422] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(
                verdict(status, &none, now),
                (Retry::Never, FailureKind::Status4xx)
            );
        }
        let later = Retry::Later { after: None };
        for (code, kind) in [
            (429, FailureKind::Status4xx),
            (401, FailureKind::Status4xx),
            (500, FailureKind::Status5xx),
            (302, FailureKind::Status5xx),
            (101, FailureKind::Status5xx),
        ] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(verdict(status, &none, now), (later, kind), "{code}");
        }
        let status = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            verdict(status, &with_retry_after("7"), now).0,
            Retry::Later {
                after: Some(Duration::from_secs(7))
            }
        );
        // A 4xx that fails at once stays so whatever its Retry-After.
        assert_eq!(
            verdict(StatusCode::NOT_FOUND, &with_retry_after("7"), now).0,
            Retry::Never
        );
    }

    #[test]
    fn status_messages_name_the_status_and_the_body_head() {
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            status_message(unavailable, "", "down for maintenance\n"),
            "HTTP 503 Service Unavailable: down for maintenance"
        );
        assert_eq!(
            status_message(unavailable, "", ""),
            "HTTP 503 Service Unavailable"
        );
        let unknown = StatusCode::from_u16(599).unwrap();
        assert_eq!(status_message(unknown, "", "x"), "HTTP 599: x");
    }
}
