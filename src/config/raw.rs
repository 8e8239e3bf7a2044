//! The configuration file as written: serde structs that mirror it (`deny_unknown_fields`, so a
//! misspelt key is an error), the duration and size deserializers, and `validate`, which checks
//! each value's range, every one of them, and fills in the defaults to make a `Config`.
//! Called only by `resolve.rs`.

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
    DEFAULT_XMIN_HORIZON_WARNING, SHORT_LEASE,
};

pub(super) type Invalid = (std::ops::Range<usize>, String);

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
    /// `[queues.NAME]`: a queue's handler (queues.rs).
    #[serde(default)]
    queues: std::collections::BTreeMap<Spanned<String>, Spanned<super::queues::RawQueue>>,
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
pub(super) fn duration<'de, D>(deserializer: D) -> Result<Option<Spanned<Duration>>, D::Error>
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
fn queue_list(queues: &Spanned<Vec<String>>) -> Result<Vec<String>, Invalid> {
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
fn once_each(queues: &mut Vec<String>) -> Vec<String> {
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

impl RawConfig {
    /// Note that the reading took out the entry at `path` (its keys from the top), having
    /// said what is wrong with it: a queue section's checks that depend on it are skipped.
    pub(super) fn refused(&mut self, path: &[String]) {
        if let [section, queue, key] = path {
            if section == "queues" {
                if let Some(raw) = self.queues.get_mut(queue.as_str()) {
                    raw.get_mut().refused.push(key.clone());
                }
            }
        }
    }

    /// The validated configuration, or every value out of range.
    pub(super) fn validate(self) -> Result<Config, Vec<Invalid>> {
        let mut errors = Errors::default();
        let e = &mut errors;
        let db = &self.database;
        let database = DatabaseConfig {
            url_source: if db.url.is_some() {
                UrlSource::File
            } else {
                UrlSource::Unset
            },
            url: db.url.clone(),
            pool_size: e.check(db.pool_size.as_ref(), DEFAULT_POOL_SIZE, |v| {
                positive("database.pool_size", v)
            }),
            connect_timeout: e.check(db.connect_timeout.as_ref(), DEFAULT_CONNECT_TIMEOUT, |v| {
                nonzero("database.connect_timeout", v)
            }),
            statement_timeout: e.check(
                db.statement_timeout.as_ref(),
                DEFAULT_STATEMENT_TIMEOUT,
                |v| server_timeout("database.statement_timeout", v),
            ),
            listen_url: db.listen_url.clone(),
            pooler: db.pooler.unwrap_or_default(),
        };
        let w = &self.worker;
        let mut worker = WorkerConfig {
            concurrency: e.check(w.concurrency.as_ref(), DEFAULT_CONCURRENCY, |v| {
                positive("worker.concurrency", v)
            }),
            queues: e.check(
                w.queues.as_ref(),
                vec![DEFAULT_QUEUE.to_string()],
                queue_list,
            ),
            poll_interval: e.check(w.poll_interval.as_ref(), DEFAULT_POLL_INTERVAL, |v| {
                nonzero("worker.poll_interval", v)
            }),
            lease: e.check(w.lease.as_ref(), DEFAULT_LEASE, |v| {
                nonzero("worker.lease", v)
            }),
            max_inflight_bytes: e.check(
                w.max_inflight_bytes.as_ref(),
                DEFAULT_MAX_INFLIGHT_BYTES,
                |v| positive_size("worker.max_inflight_bytes", v),
            ),
            max_payload_bytes: e.check(w.max_payload_bytes.as_ref(), None, |v| {
                positive_size("worker.max_payload_bytes", v).map(Some)
            }),
        };
        let retention = RetentionConfig {
            finished_after: e.check(self.retention.finished_after.as_ref(), None, |v| {
                nonzero("retention.finished_after", v).map(Some)
            }),
        };
        let h = &self.http;
        let http = HttpConfig {
            listen: e.check(h.listen.as_ref(), None, |v| listen_address(v).map(Some)),
            token_file: h.token_file.clone(),
            max_body: e.check(h.max_body.as_ref(), DEFAULT_HTTP_MAX_BODY, |v| {
                positive("http.max_body", v)
            }),
            max_connections: e.check(
                h.max_connections.as_ref(),
                DEFAULT_HTTP_MAX_CONNECTIONS,
                |v| positive("http.max_connections", v),
            ),
            header_timeout: e.check(
                h.header_timeout.as_ref(),
                DEFAULT_HTTP_HEADER_TIMEOUT,
                |v| nonzero("http.header_timeout", v),
            ),
            max_inflight_bytes: e.check(
                h.max_inflight_bytes.as_ref(),
                DEFAULT_HTTP_MAX_INFLIGHT_BYTES,
                |v| positive_size("http.max_inflight_bytes", v),
            ),
        };
        let mut warnings = Vec::new();
        if worker.lease < SHORT_LEASE {
            warnings.push(format!(
                "worker.lease = {} is under {}: a claim lives that long without a heartbeat \
                 (sent every third of it), so a busy database or a pause of the daemon that long \
                 has running tasks stopped and given back, or taken back by a rescuer and run \
                 again; \"30s\" is the default",
                humantime::format_duration(worker.lease),
                humantime::format_duration(SHORT_LEASE)
            ));
        }
        let repeated = once_each(&mut worker.queues);
        if !repeated.is_empty() {
            warnings.push(format!(
                "worker.queues names {} more than once; each queue is served once",
                repeated
                    .iter()
                    .map(|q| format!("{q:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let (section, raw) = match (self.health, self.vacuum_health) {
            (Some(old), Some(_)) => {
                e.0.push((
                    old.span(),
                    "[health] is the old name of [vacuum_health]: give only [vacuum_health]"
                        .to_string(),
                ));
                ("vacuum_health", RawHealth::default())
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
            check_interval: e.check(
                raw.check_interval.as_ref(),
                DEFAULT_HEALTH_CHECK_INTERVAL,
                |v| nonzero(&format!("{section}.check_interval"), v),
            ),
            xmin_horizon_warning: e.check(
                raw.xmin_horizon_warning.as_ref(),
                DEFAULT_XMIN_HORIZON_WARNING,
                |v| nonzero(&format!("{section}.xmin_horizon_warning"), v),
            ),
        };
        let level = e.check(
            self.log.level.as_ref(),
            DEFAULT_LOG_LEVEL.to_string(),
            |level| match super::filter::check(level.get_ref()) {
                Ok(()) => Ok(level.get_ref().clone()),
                Err(message) => Err((level.span(), message)),
            },
        );
        let queues = super::queues::validate(
            self.queues,
            &worker.queues,
            worker.concurrency,
            &mut warnings,
            &mut errors,
        );
        if !errors.0.is_empty() {
            return Err(errors.0);
        }
        Ok(Config {
            file: None,
            database,
            worker,
            queues,
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
            sources: Vec::new(),
        })
    }
}
