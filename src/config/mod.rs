//! Configuration: the TOML file of docs/design.md, "Configuration", read and validated.
//!
//! Reading is split in two, so that parsing is unit-tested without files: [`Config::load`]
//! finds and reads the file, [`Config::from_toml`] parses a string. The raw structs mirror the
//! file (`deny_unknown_fields`, so a misspelt key is an error naming the key and its line); the
//! validated [`Config`] carries every default, each a named constant below.
//!
//! Where the database connection comes from (`database.url`, `PGTASKD_DATABASE_URL`, the libpq
//! variables) is decided in [`crate::db::settings`], not here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

/// The file read when neither `--config` nor `PGTASKD_CONFIG` names one, if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/pgtaskd/pgtaskd.toml";
/// The environment variable that names the configuration file.
pub const CONFIG_ENV: &str = "PGTASKD_CONFIG";
/// The environment variable that, when set, overrides `log.format` (`text` or `json`).
pub const LOG_FORMAT_ENV: &str = "PGTASKD_LOG_FORMAT";

pub const DEFAULT_POOL_SIZE: usize = 10;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_CONCURRENCY: usize = 8;
pub const DEFAULT_QUEUE: &str = "default";
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Payload bytes one daemon holds at most (claimed and not yet analyzed, or being analyzed),
/// a single larger payload aside.
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 256 << 20;
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
pub const DEFAULT_HTTP_MAX_BODY: usize = 1 << 20;
/// Half of the 1,024 descriptors a systemd service gets by default: the rest is left for the
/// database sessions, the log and the listener.
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 512;
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// A configuration that was read and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub database: DatabaseConfig,
    pub worker: WorkerConfig,
    pub shutdown: ShutdownConfig,
    pub retention: RetentionConfig,
    pub http: HttpConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseConfig {
    /// A libpq URL or key=value string; `None` falls back to the environment.
    pub url: Option<String>,
    /// Most worker connections one daemon holds; the listener's connection is extra.
    pub pool_size: usize,
    pub connect_timeout: Duration,
    /// `statement_timeout` of the daemon's sessions; zero turns it off.
    pub statement_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// Tasks analyzed at once.
    pub concurrency: usize,
    /// Queues served.
    pub queues: Vec<String>,
    /// The safety-net scan when no notification came.
    pub poll_interval: Duration,
    /// How long a claim lives without a heartbeat.
    pub lease: Duration,
    /// The payload bytes this daemon holds at most; a claim stops adding tasks at this
    /// budget, but always takes one task when the daemon holds none.
    pub max_inflight_bytes: u64,
    /// Payloads longer than this end FAILED without being loaded; `None`: no limit.
    pub max_payload_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShutdownConfig {
    /// How long running tasks may finish after the first SIGTERM or SIGINT.
    pub grace: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// Prune finished rows older than this; `None` keeps them forever.
    pub finished_after: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Where the optional HTTP server listens; `None` turns it off.
    pub listen: Option<SocketAddr>,
    pub token_file: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// Most connections open at once; at the cap a new one takes the place of the oldest idle
    /// one, or is closed at once when every one is answering a request.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (the whole head, not each
    /// byte); an idle keep-alive connection is closed after as long.
    pub header_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A tracing filter directive such as `info` or `pgtaskd=debug`.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_toml("", "defaults").expect("the empty configuration is valid")
    }
}

/// Why a configuration could not be used (exit 78).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: line {line}, column {column}: {message}")]
    Invalid {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{name}: {message}")]
    Env { name: &'static str, message: String },
}

impl Config {
    /// Find and read the configuration file: `path` if given, else `PGTASKD_CONFIG`, else
    /// [`DEFAULT_CONFIG_PATH`] when it exists, else the defaults; then `PGTASKD_LOG_FORMAT`,
    /// when set, overrides `log.format`.
    ///
    /// # Errors
    ///
    /// A named file that cannot be read, a file that does not validate, or a
    /// `PGTASKD_LOG_FORMAT` that is neither `text` nor `json`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let mut config = Config::load_file(path)?;
        config.log.format = log_format(config.log.format, std::env::var_os(LOG_FORMAT_ENV))?;
        Ok(config)
    }

    fn load_file(path: Option<&Path>) -> Result<Config, ConfigError> {
        let named = path
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from));
        let path = match named {
            Some(path) => path,
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => PathBuf::from(DEFAULT_CONFIG_PATH),
            None => return Ok(Config::default()),
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        Config::from_toml(&text, &path.display().to_string())
    }

    /// Parse and validate a configuration. `origin` names the text in error messages.
    ///
    /// # Errors
    ///
    /// Unknown keys, values of the wrong type, and values out of range, each with its line.
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|err| {
            let (line, column) = err
                .span()
                .map(|span| line_column(text, span.start))
                .unwrap_or((1, 1));
            let message = err.message().trim_end();
            let message = match err.span().and_then(|span| key_at(text, span.start)) {
                Some(key) if !message.contains(&key) => format!("{key}: {message}"),
                _ => message.to_string(),
            };
            ConfigError::Invalid {
                origin: origin.to_string(),
                line,
                column,
                message,
            }
        })?;
        raw.validate().map_err(|(span, message)| {
            let (line, column) = line_column(text, span.start);
            ConfigError::Invalid {
                origin: origin.to_string(),
                line,
                column,
                message,
            }
        })
    }
}

/// The log format: `value` of `PGTASKD_LOG_FORMAT` when it is set and not empty, else the
/// file's.
fn log_format(
    file: LogFormat,
    value: Option<std::ffi::OsString>,
) -> Result<LogFormat, ConfigError> {
    let Some(value) = value else { return Ok(file) };
    match value.to_str() {
        Some("") => Ok(file),
        Some("text") => Ok(LogFormat::Text),
        Some("json") => Ok(LogFormat::Json),
        _ => Err(ConfigError::Env {
            name: LOG_FORMAT_ENV,
            message: format!("{value:?} is not a log format (write \"text\" or \"json\")"),
        }),
    }
}

/// The 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The dotted key (`table.key`) whose line holds byte `offset`, for messages that name a
/// value but not its key.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?.trim();
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    let table = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_string(),
    })
}

type Invalid = (std::ops::Range<usize>, String);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
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
    listen: Option<SocketAddr>,
    token_file: Option<PathBuf>,
    max_body: Option<Spanned<usize>>,
    max_connections: Option<Spanned<usize>>,
    #[serde(default, deserialize_with = "duration")]
    header_timeout: Option<Spanned<Duration>>,
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

impl RawConfig {
    fn validate(self) -> Result<Config, Invalid> {
        let database = DatabaseConfig {
            url: self.database.url,
            pool_size: match &self.database.pool_size {
                Some(v) => positive("database.pool_size", v)?,
                None => DEFAULT_POOL_SIZE,
            },
            connect_timeout: match &self.database.connect_timeout {
                Some(v) => nonzero("database.connect_timeout", v)?,
                None => DEFAULT_CONNECT_TIMEOUT,
            },
            statement_timeout: self
                .database
                .statement_timeout
                .map_or(DEFAULT_STATEMENT_TIMEOUT, Spanned::into_inner),
        };
        let queues = match self.worker.queues {
            None => vec![DEFAULT_QUEUE.to_string()],
            Some(queues) => {
                let span = queues.span();
                let queues = queues.into_inner();
                if queues.is_empty() {
                    return Err((span, "worker.queues must name at least one queue".into()));
                }
                if queues.iter().any(|q| q.trim().is_empty()) {
                    return Err((span, "worker.queues has an empty queue name".into()));
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
            listen: self.http.listen,
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
        };
        let level = match self.log.level {
            None => DEFAULT_LOG_LEVEL.to_string(),
            Some(level) => {
                if let Err(err) = tracing_subscriber::EnvFilter::try_new(level.get_ref()) {
                    return Err((
                        level.span(),
                        format!("log.level {:?} is not a filter: {err}", level.get_ref()),
                    ));
                }
                level.into_inner()
            }
        };
        Ok(Config {
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
            log: LogConfig {
                format: self.log.format.unwrap_or(LogFormat::Text),
                level,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(text: &str) -> (usize, String) {
        match Config::from_toml(text, "test.toml") {
            Err(ConfigError::Invalid { line, message, .. }) => (line, message),
            other => panic!("expected an invalid config, got {other:?}"),
        }
    }

    #[test]
    fn empty_file_gives_every_default() {
        let config = Config::from_toml("", "test.toml").unwrap();
        assert_eq!(config.database.url, None);
        assert_eq!(config.database.pool_size, DEFAULT_POOL_SIZE);
        assert_eq!(config.worker.concurrency, DEFAULT_CONCURRENCY);
        assert_eq!(config.worker.queues, vec!["default".to_string()]);
        assert_eq!(config.worker.poll_interval, DEFAULT_POLL_INTERVAL);
        assert_eq!(config.worker.lease, DEFAULT_LEASE);
        assert_eq!(config.worker.max_inflight_bytes, 256 * 1024 * 1024);
        assert_eq!(config.worker.max_payload_bytes, None);
        assert_eq!(config.shutdown.grace, DEFAULT_SHUTDOWN_GRACE);
        assert_eq!(config.retention.finished_after, None);
        assert_eq!(config.http.listen, None);
        assert_eq!(config.http.max_connections, DEFAULT_HTTP_MAX_CONNECTIONS);
        assert_eq!(config.http.header_timeout, DEFAULT_HTTP_HEADER_TIMEOUT);
        assert_eq!(config.log.format, LogFormat::Text);
        assert_eq!(config.log.level, "info");
    }

    #[test]
    fn every_key_is_read() {
        let text = r#"
            [database]
            url = "postgres://u@db/app"
            pool_size = 4
            connect_timeout = "2s"
            statement_timeout = "0s"
            [worker]
            concurrency = 32
            queues = ["default", "mail"]
            poll_interval = "250ms"
            lease = "1m"
            max_inflight_bytes = "64MiB"
            max_payload_bytes = 1000000
            [shutdown]
            grace = "5s"
            [retention]
            finished_after = "7days"
            [http]
            listen = "127.0.0.1:8080"
            token_file = "/etc/pgtaskd/token"
            max_body = 4096
            max_connections = 64
            header_timeout = "3s"
            [log]
            format = "json"
            level = "pgtaskd=debug"
        "#;
        let config = Config::from_toml(text, "test.toml").unwrap();
        assert_eq!(config.database.url.as_deref(), Some("postgres://u@db/app"));
        assert_eq!(config.database.pool_size, 4);
        assert_eq!(config.database.connect_timeout, Duration::from_secs(2));
        assert_eq!(config.database.statement_timeout, Duration::ZERO);
        assert_eq!(config.worker.concurrency, 32);
        assert_eq!(config.worker.queues, vec!["default", "mail"]);
        assert_eq!(config.worker.poll_interval, Duration::from_millis(250));
        assert_eq!(config.worker.lease, Duration::from_secs(60));
        assert_eq!(config.worker.max_inflight_bytes, 64 << 20);
        assert_eq!(config.worker.max_payload_bytes, Some(1_000_000));
        assert_eq!(config.shutdown.grace, Duration::from_secs(5));
        assert_eq!(
            config.retention.finished_after,
            Some(Duration::from_secs(7 * 86400))
        );
        assert_eq!(config.http.listen, Some("127.0.0.1:8080".parse().unwrap()));
        assert_eq!(
            config.http.token_file,
            Some(PathBuf::from("/etc/pgtaskd/token"))
        );
        assert_eq!(config.http.max_body, 4096);
        assert_eq!(config.http.max_connections, 64);
        assert_eq!(config.http.header_timeout, Duration::from_secs(3));
        assert_eq!(config.log.format, LogFormat::Json);
        assert_eq!(config.log.level, "pgtaskd=debug");
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let cases = [
            (
                "[worker]\nconcurrency = 2\nconcurency = 3\n",
                3,
                "concurency",
            ),
            ("[databse]\nurl = \"x\"\n", 1, "databse"),
            ("\n\n[log]\nformat = \"text\"\ncolour = true\n", 5, "colour"),
        ];
        for (text, want_line, key) in cases {
            let (line, message) = invalid(text);
            assert_eq!(line, want_line, "{text:?}: {message}");
            assert!(message.contains(key), "{text:?}: {message}");
        }
    }

    #[test]
    fn bad_values_are_named_with_their_line() {
        let cases = [
            (
                "[worker]\npoll_interval = \"soon\"\n",
                2,
                "invalid duration",
            ),
            ("[worker]\nlease = 30\n", 2, "worker.lease"),
            ("[worker]\nconcurrency = 0\n", 2, "worker.concurrency"),
            ("[worker]\n\nqueues = []\n", 3, "worker.queues"),
            (
                "[worker]\npoll_interval = \"0s\"\n",
                2,
                "worker.poll_interval",
            ),
            ("[database]\npool_size = -1\n", 2, "pool_size"),
            (
                "[worker]\nmax_inflight_bytes = \"lots\"\n",
                2,
                "invalid size",
            ),
            (
                "[worker]\n\nmax_payload_bytes = 0\n",
                3,
                "worker.max_payload_bytes",
            ),
            ("[log]\nformat = \"xml\"\n", 2, "xml"),
            ("[log]\nlevel = \"[[[\"\n", 2, "log.level"),
            ("[http]\nlisten = \"nowhere\"\n", 2, "address"),
            ("[worker\n", 1, "expected `]`"),
        ];
        for (text, want_line, needle) in cases {
            let (line, message) = invalid(text);
            assert_eq!(line, want_line, "{text:?}: {message}");
            assert!(
                message.to_lowercase().contains(needle),
                "{text:?}: {message:?} lacks {needle:?}"
            );
        }
    }

    #[test]
    fn sizes_take_iec_and_si_units() {
        for (text, bytes) in [
            ("\"256MiB\"", 256 << 20),
            ("\"1 GiB\"", 1 << 30),
            ("\"1GB\"", 1_000_000_000),
            ("\"512KiB\"", 512 << 10),
            ("4096", 4096),
        ] {
            let config =
                Config::from_toml(&format!("[worker]\nmax_inflight_bytes = {text}\n"), "t")
                    .unwrap();
            assert_eq!(config.worker.max_inflight_bytes, bytes, "{text}");
        }
    }

    #[test]
    fn a_named_file_that_does_not_exist_is_an_error() {
        let err = Config::load(Some(Path::new("/nonexistent/pgtaskd.toml"))).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/pgtaskd.toml"));
    }

    #[test]
    fn key_at_names_the_table_and_key_of_a_line() {
        let text = "[worker]\nlease = 3\n[database]\n  pool_size = -1\n";
        assert_eq!(key_at(text, 10).as_deref(), Some("worker.lease"));
        assert_eq!(
            key_at(text, text.find("-1").unwrap()).as_deref(),
            Some("database.pool_size")
        );
        assert_eq!(key_at("[worker]\n", 0), None);
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("ab\ncd", 99), (2, 3));
    }

    #[test]
    fn log_format_variable_overrides_the_file_and_refuses_other_values() {
        let var = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(log_format(LogFormat::Text, None).unwrap(), LogFormat::Text);
        assert_eq!(
            log_format(LogFormat::Json, var("")).unwrap(),
            LogFormat::Json
        );
        assert_eq!(
            log_format(LogFormat::Text, var("json")).unwrap(),
            LogFormat::Json
        );
        assert_eq!(
            log_format(LogFormat::Json, var("text")).unwrap(),
            LogFormat::Text
        );
        let err = log_format(LogFormat::Text, var("JSON")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "PGTASKD_LOG_FORMAT: \"JSON\" is not a log format (write \"text\" or \"json\")"
        );
    }
}
