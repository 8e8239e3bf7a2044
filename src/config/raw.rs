//! The configuration file as written: serde structs that mirror it (`deny_unknown_fields`, so a
//! misspelt key is an error), and `validate`, which checks each value's range with the rules
//! of `values.rs`, every one of them, and fills in the defaults to make a `Config`.
//! Called only by `resolve.rs`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::values::{
    duration, listen_address, nonzero, once_each, positive, positive_size, queue_list,
    server_timeout, size, Errors, Invalid,
};
use super::{
    Config, DatabaseConfig, HttpConfig, LogConfig, LogFormat, Pooler, RetentionConfig,
    ShutdownConfig, UrlSource, VacuumHealthConfig, WorkerConfig, DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEALTH_CHECK_INTERVAL, DEFAULT_HTTP_HEADER_TIMEOUT,
    DEFAULT_HTTP_MAX_BODY, DEFAULT_HTTP_MAX_CONNECTIONS, DEFAULT_HTTP_MAX_INFLIGHT_BYTES,
    DEFAULT_LEASE, DEFAULT_LOG_LEVEL, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_POLL_INTERVAL,
    DEFAULT_POOL_SIZE, DEFAULT_QUEUE, DEFAULT_SHUTDOWN_GRACE, DEFAULT_STATEMENT_TIMEOUT,
    DEFAULT_XMIN_HORIZON_WARNING, SHORT_LEASE, SHORT_POLL,
};

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
    #[serde(default, deserialize_with = "size")]
    max_body: Option<Spanned<u64>>,
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

    /// The validated configuration, or every value out of range; with `check_programs`, an
    /// `exec` queue's program must exist and be executable.
    pub(super) fn validate(self, check_programs: bool) -> Result<Config, Vec<Invalid>> {
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
                positive_size("http.max_body", v)
                    .map(|bytes| usize::try_from(bytes).unwrap_or(usize::MAX))
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
        if worker.poll_interval < SHORT_POLL {
            warnings.push(format!(
                "worker.poll_interval = {} is under {}: an idle daemon asks the database for \
                 work that often (at 1ns, 15,000 transactions in 5 s where the default made 42); \
                 notifications wake it at once whatever the interval, \"2s\" is the default",
                humantime::format_duration(worker.poll_interval),
                humantime::format_duration(SHORT_POLL)
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
            check_programs,
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
