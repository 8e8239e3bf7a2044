//! Configuration: the TOML file of docs/design.md, "Configuration", read and validated, with
//! every key also settable from the environment and the common ones from flags.
//!
//! Reading is split in two, so that parsing is unit-tested without files: [`Config::load_with`]
//! finds and reads the file, [`Config::resolve`] reads a string under an [`Overlay`] (the
//! environment and the flags). The raw structs mirror the file (`deny_unknown_fields`, so a
//! misspelt key is an error naming the key and its line); the validated [`Config`] carries
//! every default, each a named constant below, and where each value came from
//! ([`Config::source`]).
//!
//! Where a value comes from, first match wins: a flag of `run` or `check-config`
//! (`--database-url`, `--http-listen`, `--concurrency`, `--queues`), the environment variable
//! `PGTASKD_<SECTION>_<KEY>` (`PGTASKD_DATABASE_URL`, `PGTASKD_WORKER_LEASE`...), the file, the
//! default. The flags and variables are laid over the file's table before it is
//! deserialized, so every value goes through the same checks, and every error is reported,
//! each with its line or its variable (`resolve.rs`). What the connection string leaves
//! unset, or no string at all, is filled from the libpq variables and defaults in
//! [`crate::db::settings`].
//!
//! This module owns the validated [`Config`], its sections, the defaults and [`ConfigError`];
//! `main` loads it once and hands its sections to the daemon, the database settings, the worker
//! and the HTTP server. Beside it: `keys.rs`, the keys that may be set outside the file, their
//! variables and flags; `overlay.rs`, the environment and the flags gathered; `resolve.rs`,
//! the overlay laid over the file and every error collected; `raw.rs`, the structs that mirror
//! the file and their validation; `values.rs`, the rules of single values and the errors kept; `filter.rs`, what `log.level` may be; `wording.rs`, what each
//! key takes in plain words; `location.rs`, the line, column and key an error points at;
//! `queues.rs`, the `[queues.NAME]` sections, with `queues/preflight.rs`, what would fail
//! every task of a queue, checked before the first.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use keys::{Key, KEYS};
pub use overlay::{Overlay, Source};
pub use queues::{HandlerConfig, QueueConfig};
pub use values::DURATION_MAX;

#[cfg(test)]
mod env_tests;
mod filter;
pub use filter::with_quiet_pool;
pub mod keys;
mod location;
mod overlay;
pub mod queues;
mod raw;
mod resolve;
#[cfg(test)]
mod tests;
mod values;
mod wording;

/// The file read when neither `--config` nor `PGTASKD_CONFIG` names one, if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/pgtaskd/pgtaskd.toml";
/// The most a configuration file may hold: 1 MiB. A configuration is a few kilobytes; a path
/// such as `/dev/zero` would otherwise be read until memory runs out.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The environment variable that names the configuration file.
pub const CONFIG_ENV: &str = "PGTASKD_CONFIG";
/// The environment variable that, when set and not empty, overrides `database.url` (one of
/// the `PGTASKD_<SECTION>_<KEY>` of [`KEYS`]).
pub const DATABASE_URL_ENV: &str = "PGTASKD_DATABASE_URL";
/// The environment variable that, when set and not empty, overrides `log.format` (`text` or
/// `json`; one of the `PGTASKD_<SECTION>_<KEY>` of [`KEYS`]).
pub const LOG_FORMAT_ENV: &str = "PGTASKD_LOG_FORMAT";

pub const DEFAULT_POOL_SIZE: usize = 10;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_CONCURRENCY: usize = 8;
pub const DEFAULT_QUEUE: &str = "default";
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// A `worker.lease` under this is accepted with a warning (`1ms` for `1m` is an easy typo).
pub const SHORT_LEASE: Duration = Duration::from_secs(1);
/// A `worker.poll_interval` under this is accepted with a warning (`1ns`, or `1ms` for `1m`).
pub const SHORT_POLL: Duration = Duration::from_millis(10);
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
    /// The `[queues.NAME]` sections, by name: which handler runs each configured queue.
    pub queues: Vec<QueueConfig>,
    pub shutdown: ShutdownConfig,
    pub retention: RetentionConfig,
    pub http: HttpConfig,
    pub vacuum_health: VacuumHealthConfig,
    pub log: LogConfig,
    /// What the file said that is still read but should change (an old section name), and
    /// the environment variables that look like settings but name none; the daemon logs each
    /// at start and `check-config` prints them.
    pub warnings: Vec<String>,
    /// Where each key of [`KEYS`] came from, in its order: see [`Config::source`].
    pub sources: Vec<Source>,
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
    /// A value of an environment variable or a flag: `named` is `NAME="VALUE"` or
    /// `--flag "VALUE"`.
    #[error("{named}: {message}")]
    Setting { named: String, message: String },
    /// More than one of the above, in the order of the file, the environment's and the
    /// flags' after.
    #[error("{} errors:{}", .0.len(), list(.0))]
    Several(Vec<ConfigError>),
}

/// Each error on a line of its own.
fn list(errors: &[ConfigError]) -> String {
    errors.iter().map(|err| format!("\n  {err}")).collect()
}

impl ConfigError {
    /// `errors` as one error: the only one, or [`ConfigError::Several`].
    fn collect(mut errors: Vec<ConfigError>) -> ConfigError {
        if errors.len() == 1 {
            errors.remove(0)
        } else {
            ConfigError::Several(errors)
        }
    }
}

impl Config {
    /// How this daemon runs each queue of `worker.queues`, in that order
    /// ([`HandlerConfig::fingerprint`]; `text-stats` for a queue without a section).
    pub fn handler_fingerprints(&self) -> Vec<String> {
        self.worker
            .queues
            .iter()
            .map(|name| {
                self.queues
                    .iter()
                    .find(|queue| &queue.name == name)
                    .map_or(HandlerConfig::TextStats.fingerprint(), |queue| {
                        queue.handler.fingerprint()
                    })
            })
            .collect()
    }

    /// [`Config::load_with`] the environment and no flags.
    ///
    /// # Errors
    ///
    /// As [`Config::load_with`].
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::load_with(path, &Overlay::from_env(&[]))
    }

    /// Find and read the configuration file: `path` if given, else `PGTASKD_CONFIG`, else
    /// [`DEFAULT_CONFIG_PATH`] when it exists, else none (the defaults); then lay `overlay`
    /// (the `PGTASKD_<SECTION>_<KEY>` variables and the flags) over it.
    ///
    /// # Errors
    ///
    /// A named file that cannot be read; every value of the file, the environment or the
    /// flags that does not validate; a `RUST_LOG` tracing refuses.
    pub fn load_with(path: Option<&Path>, overlay: &Overlay) -> Result<Config, ConfigError> {
        let named = path
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from));
        let path = match named {
            Some(path) => Some(path),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                Some(PathBuf::from(DEFAULT_CONFIG_PATH))
            }
            None => None,
        };
        let config = match &path {
            Some(path) => {
                let text = read_bounded(path)?;
                let mut config = Config::resolve(&text, &path.display().to_string(), overlay)?;
                config.file = Some(path.clone());
                config
            }
            None => Config::resolve("", "defaults", overlay)?,
        };
        check_log_env(std::env::var("RUST_LOG").ok().as_deref())?;
        Ok(config)
    }

    /// Put `url` in the place of the file's `database.url`: the environment's or the
    /// command line's, which win over the file.
    pub fn set_database_url(&mut self, url: String, source: UrlSource) {
        self.database.url = Some(url);
        self.database.url_source = source;
    }

    /// Where the value of `section.name` came from; [`Source::Default`] for a key not in
    /// [`KEYS`].
    pub fn source(&self, section: &str, name: &str) -> &Source {
        resolve::index_of(section, name)
            .and_then(|index| self.sources.get(index))
            .unwrap_or(&Source::Default)
    }

    /// Parse and validate a configuration without the environment. `origin` names the text
    /// in error messages.
    ///
    /// # Errors
    ///
    /// As [`Config::resolve`].
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::resolve(text, origin, &Overlay::default())
    }

    /// Parse and validate a configuration with `overlay` laid over it. `origin` names the text
    /// in error messages.
    ///
    /// # Errors
    ///
    /// Every unknown key, value of the wrong type, and value out of range, each with its line
    /// (or its variable or flag); a syntax error of the file alone.
    pub fn resolve(text: &str, origin: &str, overlay: &Overlay) -> Result<Config, ConfigError> {
        resolve::resolve(text, origin, overlay)
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
