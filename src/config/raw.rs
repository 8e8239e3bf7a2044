//! The configuration file as written: serde structs that mirror it (`deny_unknown_fields`, so a
//! misspelt key is an error), the duration and size deserializers, and `validate`, which checks
//! each value's range and fills in the defaults to make a `Config`. Called only by
//! `Config::from_toml`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::{
    Config, DatabaseConfig, HttpConfig, LogConfig, LogFormat, Pooler, RetentionConfig,
    ShutdownConfig, UrlSource, VacuumHealthConfig, WorkerConfig, DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEALTH_CHECK_INTERVAL, DEFAULT_HTTP_HEADER_TIMEOUT,
    DEFAULT_HTTP_MAX_BODY, DEFAULT_HTTP_MAX_CONNECTIONS, DEFAULT_HTTP_MAX_INFLIGHT_BYTES,
    DEFAULT_LEASE, DEFAULT_LOG_LEVEL, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_POLL_INTERVAL,
    DEFAULT_POOL_SIZE, DEFAULT_QUEUE, DEFAULT_SHUTDOWN_GRACE, DEFAULT_STATEMENT_TIMEOUT,
    DEFAULT_XMIN_HORIZON_WARNING,
};

type Invalid = (std::ops::Range<usize>, String);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    database: RawDatabase,
    #[serde(default)]
    worker: RawWorker,
    #[serde(default)]
    shutdown: RawShutdown,
    #[serde(default)]
    retention: RawRetention,
    #[serde(default)]
    http: RawHttp,
    /// The name `[vacuum_health]` had before: still read, with a warning.
    health: Option<Spanned<RawHealth>>,
    #[serde(default)]
    vacuum_health: Option<Spanned<RawHealth>>,
    #[serde(default)]
    log: RawLog,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDatabase {
    url: Option<String>,
    pool_size: Option<Spanned<usize>>,
    #[serde(default, deserialize_with = "duration")]
    connect_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "duration")]
    statement_timeout: Option<Spanned<Duration>>,
    listen_url: Option<String>,
    pooler: Option<Pooler>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    concurrency: Option<Spanned<usize>>,
    queues: Option<Spanned<Vec<String>>>,
    #[serde(default, deserialize_with = "duration")]
    poll_interval: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "duration")]
    lease: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "size")]
    max_inflight_bytes: Option<Spanned<u64>>,
    #[serde(default, deserialize_with = "size")]
    max_payload_bytes: Option<Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShutdown {
    #[serde(default, deserialize_with = "duration")]
    grace: Option<Spanned<Duration>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    #[serde(default, deserialize_with = "duration")]
    finished_after: Option<Spanned<Duration>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: Option<Spanned<String>>,
    token_file: Option<PathBuf>,
    max_body: Option<Spanned<usize>>,
    max_connections: Option<Spanned<usize>>,
    #[serde(default, deserialize_with = "duration")]
    header_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "size")]
    max_inflight_bytes: Option<Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    #[serde(default, deserialize_with = "duration")]
    check_interval: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "duration")]
    xmin_horizon_warning: Option<Spanned<Duration>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: Option<LogFormat>,
    level: Option<Spanned<String>>,
}

/// Deserialize a duration string such as `"250ms"` or `"30s"`.
fn duration<'de, D>(deserializer: D) -> Result<Option<Spanned<Duration>>, D::Error>
where
    D: Deserializer<'de>,
{
    let text = Spanned::<String>::deserialize(deserializer)?;
    let span = text.span();
    humantime::parse_duration(text.get_ref())
        .map(|d| Some(Spanned::new(span, d)))
        .map_err(|err| {
            serde::de::Error::custom(format!(
                "invalid duration {:?}: {err} (write e.g. \"250ms\", \"30s\", \"5m\")",
                text.get_ref()
            ))
        })
}

/// Deserialize a size: a number of bytes, or a string such as `"256MiB"` or `"1GB"`.
fn size<'de, D>(deserializer: D) -> Result<Option<Spanned<u64>>, D::Error>
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
fn listen_address(value: &Spanned<String>) -> Result<String, Invalid> {
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

fn positive_size(key: &str, value: &Spanned<u64>) -> Result<u64, Invalid> {
    match *value.get_ref() {
        0 => Err((value.span(), format!("{key} must be at least 1 byte"))),
        n => Ok(n),
    }
}

fn positive(key: &str, value: &Spanned<usize>) -> Result<usize, Invalid> {
    match *value.get_ref() {
        0 => Err((value.span(), format!("{key} must be at least 1"))),
        n => Ok(n),
    }
}

fn nonzero(key: &str, value: &Spanned<Duration>) -> Result<Duration, Invalid> {
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
fn server_timeout(key: &str, value: &Spanned<Duration>) -> Result<Duration, Invalid> {
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

impl RawConfig {
    pub(super) fn validate(self) -> Result<Config, Invalid> {
        let database = DatabaseConfig {
            url_source: if self.database.url.is_some() {
                UrlSource::File
            } else {
                UrlSource::Unset
            },
            url: self.database.url,
            pool_size: match &self.database.pool_size {
                Some(v) => positive("database.pool_size", v)?,
                None => DEFAULT_POOL_SIZE,
            },
            connect_timeout: match &self.database.connect_timeout {
                Some(v) => nonzero("database.connect_timeout", v)?,
                None => DEFAULT_CONNECT_TIMEOUT,
            },
            statement_timeout: match &self.database.statement_timeout {
                Some(v) => server_timeout("database.statement_timeout", v)?,
                None => DEFAULT_STATEMENT_TIMEOUT,
            },
            listen_url: self.database.listen_url,
            pooler: self.database.pooler.unwrap_or_default(),
        };
        let queues = match self.worker.queues {
            None => vec![DEFAULT_QUEUE.to_string()],
            Some(queues) => {
                let span = queues.span();
                let queues = queues.into_inner();
                if queues.is_empty() {
                    return Err((span, "worker.queues must name at least one queue".into()));
                }
                for queue in &queues {
                    if let Err(err) = crate::queue::enqueue::check_queue_name(queue) {
                        return Err((span, format!("worker.queues: {err}: {queue:?}")));
                    }
                }
                queues
            }
        };
        let worker = WorkerConfig {
            concurrency: match &self.worker.concurrency {
                Some(v) => positive("worker.concurrency", v)?,
                None => DEFAULT_CONCURRENCY,
            },
            queues,
            poll_interval: match &self.worker.poll_interval {
                Some(v) => nonzero("worker.poll_interval", v)?,
                None => DEFAULT_POLL_INTERVAL,
            },
            lease: match &self.worker.lease {
                Some(v) => nonzero("worker.lease", v)?,
                None => DEFAULT_LEASE,
            },
            max_inflight_bytes: match &self.worker.max_inflight_bytes {
                Some(v) => positive_size("worker.max_inflight_bytes", v)?,
                None => DEFAULT_MAX_INFLIGHT_BYTES,
            },
            max_payload_bytes: match &self.worker.max_payload_bytes {
                Some(v) => Some(positive_size("worker.max_payload_bytes", v)?),
                None => None,
            },
        };
        let retention = RetentionConfig {
            finished_after: match &self.retention.finished_after {
                Some(v) => Some(nonzero("retention.finished_after", v)?),
                None => None,
            },
        };
        let http = HttpConfig {
            listen: match self.http.listen {
                Some(v) => Some(listen_address(&v)?),
                None => None,
            },
            token_file: self.http.token_file,
            max_body: match &self.http.max_body {
                Some(v) => positive("http.max_body", v)?,
                None => DEFAULT_HTTP_MAX_BODY,
            },
            max_connections: match &self.http.max_connections {
                Some(v) => positive("http.max_connections", v)?,
                None => DEFAULT_HTTP_MAX_CONNECTIONS,
            },
            header_timeout: match &self.http.header_timeout {
                Some(v) => nonzero("http.header_timeout", v)?,
                None => DEFAULT_HTTP_HEADER_TIMEOUT,
            },
            max_inflight_bytes: match &self.http.max_inflight_bytes {
                Some(v) => positive_size("http.max_inflight_bytes", v)?,
                None => DEFAULT_HTTP_MAX_INFLIGHT_BYTES,
            },
        };
        let mut warnings = Vec::new();
        let (section, raw) = match (self.health, self.vacuum_health) {
            (Some(old), Some(_)) => {
                return Err((
                    old.span(),
                    "[health] is the old name of [vacuum_health]: give only [vacuum_health]"
                        .to_string(),
                ))
            }
            (Some(old), None) => {
                warnings.push(
                    "[health] is now called [vacuum_health]; the old name is still read"
                        .to_string(),
                );
                ("health", old.into_inner())
            }
            (None, Some(new)) => ("vacuum_health", new.into_inner()),
            (None, None) => ("vacuum_health", RawHealth::default()),
        };
        let vacuum_health = VacuumHealthConfig {
            check_interval: match &raw.check_interval {
                Some(v) => nonzero(&format!("{section}.check_interval"), v)?,
                None => DEFAULT_HEALTH_CHECK_INTERVAL,
            },
            xmin_horizon_warning: match &raw.xmin_horizon_warning {
                Some(v) => nonzero(&format!("{section}.xmin_horizon_warning"), v)?,
                None => DEFAULT_XMIN_HORIZON_WARNING,
            },
        };
        let level = match self.log.level {
            None => DEFAULT_LOG_LEVEL.to_string(),
            Some(level) => {
                if let Err(message) = super::filter::check(level.get_ref()) {
                    return Err((level.span(), message));
                }
                level.into_inner()
            }
        };
        Ok(Config {
            file: None,
            database,
            worker,
            shutdown: ShutdownConfig {
                grace: self
                    .shutdown
                    .grace
                    .map_or(DEFAULT_SHUTDOWN_GRACE, Spanned::into_inner),
            },
            retention,
            http,
            vacuum_health,
            log: LogConfig {
                format: self.log.format.unwrap_or(LogFormat::Text),
                level,
            },
            warnings,
        })
    }
}
