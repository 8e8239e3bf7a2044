//! The rules of single values of the configuration file: the duration and size
//! deserializers, the ranges a key may take (at least 1, longer than zero, a server timeout
//! PostgreSQL takes, an address to listen on, a list of queue names), and [`Errors`], which
//! keeps every value refused with its position so that all are reported at once. Used by
//! `raw.rs` and `queues.rs`.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

/// A value refused: where it stands in the file, and why.
pub(super) type Invalid = (std::ops::Range<usize>, String);

/// The longest duration any key takes: 100 years ("100years", of 365.25 days each, as the
/// duration syntax counts them). Longer ones add to a clock reading past what it can hold.
pub const DURATION_MAX: Duration = Duration::from_secs(100 * 31_557_600);

/// Deserialize a duration string such as `"250ms"` or `"30s"`, of at most [`DURATION_MAX`].
pub(super) fn duration<'de, D>(deserializer: D) -> Result<Option<Spanned<Duration>>, D::Error>
where
    D: Deserializer<'de>,
{
    let text = Spanned::<String>::deserialize(deserializer)?;
    let span = text.span();
    let duration = humantime::parse_duration(text.get_ref()).map_err(|err| {
        serde::de::Error::custom(format!(
            "invalid duration {:?}: {err} (write e.g. \"250ms\", \"30s\", \"5m\")",
            text.get_ref()
        ))
    })?;
    if duration > DURATION_MAX {
        return Err(serde::de::Error::custom(format!(
            "duration {:?} is longer than 100 years, the longest any key takes",
            text.get_ref()
        )));
    }
    Ok(Some(Spanned::new(span, duration)))
}

/// Deserialize a size: a number of bytes, or a string such as `"256MiB"` or `"1GB"`.
pub(super) fn size<'de, D>(deserializer: D) -> Result<Option<Spanned<u64>>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    let value = Spanned::<Size>::deserialize(deserializer)?;
    let span = value.span();
    let bytes = match value.into_inner() {
        Size::Bytes(bytes) => bytes,
        Size::Text(text) => text
            .parse::<bytesize::ByteSize>()
            .map(|size| size.as_u64())
            .map_err(|err| {
                serde::de::Error::custom(format!(
                    "invalid size {text:?}: {err} (write e.g. \"256MiB\", \"1GB\", or a number of bytes)"
                ))
            })?,
    };
    Ok(Some(Spanned::new(span, bytes)))
}

/// `HOST:PORT`, the host an IP address or a name resolved when the server binds (an IPv6
/// address in brackets: `[::1]:8080`).
pub(super) fn listen_address(value: &Spanned<String>) -> Result<String, Invalid> {
    let text = value.get_ref().trim();
    if text.parse::<SocketAddr>().is_ok() {
        return Ok(text.to_string());
    }
    let well_formed = text.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains(|c: char| c.is_whitespace() || matches!(c, ':' | '[' | ']' | '/'))
            && port.parse::<u16>().is_ok()
    });
    if well_formed {
        Ok(text.to_string())
    } else {
        Err((
            value.span(),
            format!(
                "http.listen {text:?} is not an address and port: write HOST:PORT, the host an \
                 IP address or a name (\"127.0.0.1:8080\", \"localhost:8080\", \"[::1]:8080\")"
            ),
        ))
    }
}

pub(super) fn positive_size(key: &str, value: &Spanned<u64>) -> Result<u64, Invalid> {
    match *value.get_ref() {
        0 => Err((value.span(), format!("{key} must be at least 1 byte"))),
        n => Ok(n),
    }
}

pub(super) fn positive(key: &str, value: &Spanned<usize>) -> Result<usize, Invalid> {
    match *value.get_ref() {
        0 => Err((value.span(), format!("{key} must be at least 1"))),
        n => Ok(n),
    }
}

pub(super) fn nonzero(key: &str, value: &Spanned<Duration>) -> Result<Duration, Invalid> {
    if value.get_ref().is_zero() {
        Err((value.span(), format!("{key} must be longer than zero")))
    } else {
        Ok(*value.get_ref())
    }
}

/// The longest duration PostgreSQL takes for a timeout setting: `INT_MAX` milliseconds, about
/// 24.8 days. A longer one passes here but is refused by the server at every connection.
const SERVER_TIMEOUT_MAX: Duration = Duration::from_millis(i32::MAX as u64);

/// A duration sent to the server as a setting in whole milliseconds (`statement_timeout`, and
/// `lock_timeout` with it): zero (off), or 1 ms to [`SERVER_TIMEOUT_MAX`]. A non-zero value
/// under a millisecond would be sent as 0 and turn the timeout off.
pub(super) fn server_timeout(key: &str, value: &Spanned<Duration>) -> Result<Duration, Invalid> {
    let duration = *value.get_ref();
    if duration > SERVER_TIMEOUT_MAX {
        return Err((
            value.span(),
            format!(
                "{key} is {}, longer than PostgreSQL takes: at most {}ms (about 24.8 days), \
                 or \"0s\" for no timeout",
                humantime::format_duration(duration),
                SERVER_TIMEOUT_MAX.as_millis()
            ),
        ));
    }
    if !duration.is_zero() && duration < Duration::from_millis(1) {
        return Err((
            value.span(),
            format!(
                "{key} is {}: PostgreSQL counts it in whole milliseconds, so it would turn the \
                 timeout off; write at least \"1ms\", or \"0s\" for no timeout",
                humantime::format_duration(duration)
            ),
        ));
    }
    Ok(duration)
}

/// The values out of range `RawConfig::validate` found, each with its position.
#[derive(Default)]
pub(super) struct Errors(pub(super) Vec<Invalid>);

impl Errors {
    /// `check` of `value`, or `default` when there is none; when `check` refuses it, the
    /// error is kept and `default` stands in, so that the other keys are checked too.
    pub(super) fn check<V, T>(
        &mut self,
        value: Option<&V>,
        default: T,
        check: impl FnOnce(&V) -> Result<T, Invalid>,
    ) -> T {
        match value.map(check) {
            None => default,
            Some(Ok(value)) => value,
            Some(Err(invalid)) => {
                self.0.push(invalid);
                default
            }
        }
    }
}

/// `worker.queues`: at least one, each a queue name.
pub(super) fn queue_list(queues: &Spanned<Vec<String>>) -> Result<Vec<String>, Invalid> {
    let span = queues.span();
    if queues.get_ref().is_empty() {
        return Err((span, "worker.queues must name at least one queue".into()));
    }
    for queue in queues.get_ref() {
        if let Err(err) = crate::queue::enqueue::check_queue_name(queue) {
            return Err((span, format!("worker.queues: {err}: {queue:?}")));
        }
    }
    Ok(queues.get_ref().clone())
}

/// Keep the first of each name in `queues`, in their order; the names that were repeated.
pub(super) fn once_each(queues: &mut Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut repeated = Vec::new();
    queues.retain(|queue| {
        let first = seen.insert(queue.clone());
        if !first && !repeated.contains(queue) {
            repeated.push(queue.clone());
        }
        first
    });
    repeated
}
