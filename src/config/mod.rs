//! Configuration: the TOML file of docs/design.md, "Configuration", read and validated.
//!
//! Reading is split in two, so that parsing is unit-tested without files: [`Config::load`]
//! finds and reads the file, [`Config::from_toml`] parses a string. The raw structs mirror the
//! file (`deny_unknown_fields`, so a misspelt key is an error naming the key and its line); the
//! validated [`Config`] carries every default, each a named constant below.
//!
//! This module owns the validated [`Config`], its sections, the defaults and [`ConfigError`];
//! `main` loads it once and hands its sections to the daemon, the database settings, the worker
//! and the HTTP server. Beside it: `raw.rs`, the structs that mirror the file and their
//! validation; `filter.rs`, what `log.level` may be; `wording.rs`, what each key takes in
//! plain words; `location.rs`, the line, column and key an error points at.
//!
//! The connection string is settled here, first match wins: `--database-url` (which `main`
//! passes to [`Config::set_database_url`]), `PGTASKD_DATABASE_URL` (applied by
//! [`Config::load`]), `database.url` in the file. What a string leaves unset, or no string at
//! all, is filled from the libpq variables and defaults in [`crate::db::settings`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use location::{key_at, line_column};
use raw::RawConfig;

mod filter;
mod location;
mod raw;
#[cfg(test)]
mod tests;
mod wording;

/// The file read when neither `--config` nor `PGTASKD_CONFIG` names one, if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/pgtaskd/pgtaskd.toml";
/// The most a configuration file may hold: 1 MiB. A configuration is a few kilobytes; a path
/// such as `/dev/zero` would otherwise be read until memory runs out.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The environment variable that names the configuration file.
pub const CONFIG_ENV: &str = "PGTASKD_CONFIG";
/// The environment variable that, when set and not empty, overrides `database.url`.
pub const DATABASE_URL_ENV: &str = "PGTASKD_DATABASE_URL";
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
/// Payload bytes the HTTP answers of one daemon hold at most, a single larger payload aside.
pub const DEFAULT_HTTP_MAX_INFLIGHT_BYTES: u64 = 256 << 20;
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// How often the daemon reads the vacuum health (docs/design.md, "Vacuum health").
pub const DEFAULT_HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(15);
/// How long the xmin horizon may be held back before the log and `/readyz` say so.
pub const DEFAULT_XMIN_HORIZON_WARNING: Duration = Duration::from_secs(5 * 60);

/// A configuration that was read and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file this was read from; `None` when none was, and the defaults apply.
    pub file: Option<PathBuf>,
    pub database: DatabaseConfig,
    pub worker: WorkerConfig,
    pub shutdown: ShutdownConfig,
    pub retention: RetentionConfig,
    pub http: HttpConfig,
    pub vacuum_health: VacuumHealthConfig,
    pub log: LogConfig,
    /// What the file said that is still read but should change (an old section name); the
    /// daemon logs each at start and `check-config` prints them.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseConfig {
    /// A libpq URL or key=value string; `None` falls back to the environment.
    pub url: Option<String>,
    /// Where `url` came from.
    pub url_source: UrlSource,
    /// Most worker connections one daemon holds; the listener's connection is extra.
    pub pool_size: usize,
    pub connect_timeout: Duration,
    /// `statement_timeout` of the daemon's sessions; zero turns it off.
    pub statement_timeout: Duration,
    /// The connection string of the one LISTEN session, which must reach PostgreSQL itself;
    /// `None`: the same as `url`.
    pub listen_url: Option<String>,
    /// What `url` leads to: PostgreSQL itself, or a pooler in transaction mode.
    pub pooler: Pooler,
}

/// `database.pooler`: what stands between `database.url` and PostgreSQL (docs/operations.md,
/// "Behind PgBouncer").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    /// Nothing, or a pooler that keeps a client on one server session (session mode).
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`): a client's
    /// transactions may each run on another server session, so nothing may outlive one.
    Transaction,
}

/// Where the connection string came from, for `check-config` to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlSource {
    /// No string: the libpq environment and defaults decide.
    Unset,
    /// `database.url` in the configuration file.
    File,
    /// `PGTASKD_DATABASE_URL`.
    Environment,
    /// The `--database-url` flag.
    Flag,
}

impl std::fmt::Display for UrlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UrlSource::Unset => "none (the libpq environment and defaults)",
            UrlSource::File => "database.url in the configuration file",
            UrlSource::Environment => DATABASE_URL_ENV,
            UrlSource::Flag => "--database-url",
        })
    }
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
    /// Where the optional HTTP server listens, `HOST:PORT` (the host an address or a name,
    /// resolved when the server binds); `None` turns it off.
    pub listen: Option<String>,
    pub token_file: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// Most connections open at once; at the cap a new one takes the place of the oldest idle
    /// one, or is closed at once when every one is answering a request.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (the whole head, not each
    /// byte); an idle keep-alive connection is closed after as long.
    pub header_timeout: Duration,
    /// The payload bytes that `GET /tasks/{id}` answers hold at most together; a read past
    /// it is 503, but a read always goes when no other holds any.
    pub max_inflight_bytes: u64,
}

/// `[vacuum_health]` (called `[health]` before; the old name is still read, with a warning).
#[derive(Debug, Clone, PartialEq)]
pub struct VacuumHealthConfig {
    /// How often the vacuum health of the task table is read; `/metrics` shows the last
    /// reading, so scrapes cost the database nothing for it.
    pub check_interval: Duration,
    /// A horizon held back longer than this is logged (at most once a minute) and given as a
    /// warning by `/readyz`, which stays ready.
    pub xmin_horizon_warning: Duration,
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
    #[error("config file {path} is larger than {MAX_CONFIG_BYTES} bytes (1 MiB), the most pgtaskd reads")]
    TooLarge { path: PathBuf },
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
    /// [`DEFAULT_CONFIG_PATH`] when it exists, else the defaults; then `PGTASKD_DATABASE_URL`,
    /// when set and not empty, overrides `database.url`, and `PGTASKD_LOG_FORMAT`, when set,
    /// overrides `log.format`.
    ///
    /// # Errors
    ///
    /// A named file that cannot be read, a file that does not validate, or a
    /// `PGTASKD_LOG_FORMAT` that is neither `text` nor `json`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let mut config = Config::load_file(path)?;
        if let Some(url) = std::env::var(DATABASE_URL_ENV)
            .ok()
            .filter(|u| !u.is_empty())
        {
            config.set_database_url(url, UrlSource::Environment);
        }
        config.log.format = log_format(config.log.format, std::env::var_os(LOG_FORMAT_ENV))?;
        check_log_env(std::env::var("RUST_LOG").ok().as_deref())?;
        Ok(config)
    }

    /// Put `url` in the place of the file's `database.url`: the environment's or the
    /// command line's, which win over the file.
    pub fn set_database_url(&mut self, url: String, source: UrlSource) {
        self.database.url = Some(url);
        self.database.url_source = source;
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
        let text = read_bounded(&path)?;
        let mut config = Config::from_toml(&text, &path.display().to_string())?;
        config.file = Some(path);
        Ok(config)
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
            let found = err.span().and_then(|span| text.get(span)).unwrap_or("");
            let message = match err.span().and_then(|span| key_at(text, span.start)) {
                Some(key) => match wording::plain(&key, found, message) {
                    Some(plain) => plain,
                    None if !message.contains(&key) => format!("{key}: {message}"),
                    None => message.to_string(),
                },
                None => message.to_string(),
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

/// The text of the file at `path`, at most [`MAX_CONFIG_BYTES`] of it.
fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let failed = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    String::from_utf8(bytes)
        .map_err(|err| failed(std::io::Error::new(std::io::ErrorKind::InvalidData, err)))
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

/// `RUST_LOG`, when set and not empty, must be a filter tracing takes: one it refuses would
/// otherwise be dropped without a word, and the daemon would log at `log.level` while the
/// operator believes otherwise.
fn check_log_env(directives: Option<&str>) -> Result<(), ConfigError> {
    match directives.map(str::trim).filter(|d| !d.is_empty()) {
        None => Ok(()),
        Some(directives) => tracing_subscriber::EnvFilter::try_new(directives)
            .map(|_| ())
            .map_err(|err| ConfigError::Env {
                name: "RUST_LOG",
                message: format!(
                    "{err}: expected tracing filter directives such as \"info\" or \"pgtaskd=debug,warn\""
                ),
            }),
    }
}

#[cfg(test)]
mod log_env_tests {
    use super::check_log_env;

    #[test]
    fn rust_log_is_a_filter_tracing_takes_or_unset() {
        assert!(check_log_env(None).is_ok());
        assert!(check_log_env(Some("")).is_ok());
        assert!(check_log_env(Some("pgtaskd=debug,warn")).is_ok());
        let err = check_log_env(Some("garbage===")).unwrap_err().to_string();
        assert!(err.starts_with("RUST_LOG: "), "{err}");
    }
}
