//! The connection settings: what to connect to, how, and with which deadlines, resolved
//! once into [`ConnectSettings`] as `psql` would resolve them. Opening sessions with them is
//! `db::open`'s job; verifying the server's certificate is [`super::tls`]'s.
//!
//! Where the connection comes from, first match wins: `database.url` in the configuration
//! (which [`crate::config`] has already replaced with `--database-url` or
//! `PGTASKD_DATABASE_URL` when one is given), `PGTASKD_DATABASE_URL` for a configuration
//! built without [`crate::config::Config::load`], then an empty string ([`conninfo`] reads it). Whatever that string
//! leaves unset is taken from the libpq environment variables and then libpq's defaults
//! (`libpq.rs`); `sslmode` and `sslrootcert` likewise from the string, else `PGSSLMODE` and
//! `PGSSLROOTCERT`, else `prefer` and the default roots; `target_session_attrs` from the
//! string, else `PGTARGETSESSIONATTRS`, else `any`.
//!
//! A string may name several servers (`host=a,b port=5432,5433`, or
//! `postgresql://a:5432,b:5433/db`; `PGHOST` and `PGPORT` take the same lists): every session
//! is opened by trying them in order, the first that accepts it wins, and with
//! `target_session_attrs=read-write` one whose sessions are read-only (a standby) is passed
//! over. So the pool, the LISTEN connection and the one-shot commands all follow a primary
//! that a failover manager moved. The connect timeout holds for each server tried.
//!
//! Every session gets `application_name = pgtaskd/<instance id>`, TCP keepalives and a
//! user timeout, so that a dead peer is noticed in seconds. Every session also sets, as
//! startup options, what pgtaskd relies on and a database or role default could change
//! (docs/design.md, "Sessions set what they rely on"): `statement_timeout`, `lock_timeout`
//! and `idle_in_transaction_session_timeout`, and read-committed, read-write, not deferrable
//! transactions. A setting given in the connection string's own `options` comes first, so
//! these win over it as over the database's and the role's defaults. Behind a transaction
//! pooler (`database.pooler = "transaction"`) `database.url`'s sessions send none, and the
//! LISTEN session's settings come from `database.listen_url` ([`ConnectSettings::listen`]).

pub mod conninfo;
mod libpq;

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::{self, SslMode, TlsError};
use crate::config::{DatabaseConfig, Pooler};

pub use crate::config::DATABASE_URL_ENV;

/// A session that stays idle inside a transaction this long is ended by the server.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// The client-side deadline of an operation when `statement_timeout` is off.
const QUERY_DEADLINE_WITHOUT_TIMEOUT: Duration = Duration::from_secs(60);
/// TCP keepalive: first probe after this much silence, then one per interval.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unacknowledged data older than this closes the connection.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// Everything needed to open a session: the resolved libpq settings and the deadlines.
#[derive(Clone)]
pub struct ConnectSettings {
    pub(in crate::db) config: Config,
    pub(in crate::db) tls: MakeRustlsConnect,
    ssl_mode: SslMode,
    pub(in crate::db) pool_size: usize,
    /// The deadline of opening one session: the connect timeout for each server that may be
    /// tried.
    pub(in crate::db) connect_deadline: Duration,
    pub(in crate::db) query_deadline: Duration,
    pooler: Pooler,
}

impl std::fmt::Debug for ConnectSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio_postgres::Config's Debug already redacts the password.
        f.debug_struct("ConnectSettings")
            .field("config", &self.config)
            .field("ssl_mode", &self.ssl_mode)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// A connection string that could not be used (exit 78).
#[derive(Debug, thiserror::Error)]
pub enum BadConnectionString {
    #[error(
        "invalid database connection string (write a postgresql:// or postgres:// URL, or \
         key=value pairs such as \"host=db user=app\")"
    )]
    Parse(#[source] tokio_postgres::Error),
    #[error(
        "a {0}:// URL is not a PostgreSQL connection string: write postgresql://... or \
         postgres://..., or key=value pairs such as \"host=db user=app\""
    )]
    Scheme(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(
        "could not match {ports} port numbers to {hosts} hosts: give one port for all, \
         or one per host"
    )]
    Ports { hosts: usize, ports: usize },
    #[error(
        "unsupported target_session_attrs {0:?}: pgtaskd writes, so use \"read-write\" \
         (skip servers that do not accept writes) or \"any\""
    )]
    TargetSessionAttrs(String),
    /// `database.listen_url` (not `database.url`) is the string that could not be used.
    #[error("database.listen_url")]
    ListenUrl {
        #[source]
        inner: Box<BadConnectionString>,
    },
}

impl ConnectSettings {
    /// Resolve the connection settings of `database.url` (the pool's and the one-shot
    /// commands') for a process whose instance id is `instance`. Behind a transaction pooler
    /// (`database.pooler = "transaction"`) they carry no startup options: the pooler would
    /// refuse them, or drop them and hand the session to other clients.
    ///
    /// # Errors
    ///
    /// A connection string that does not parse.
    pub fn new(database: &DatabaseConfig, instance: &str) -> Result<Self, BadConnectionString> {
        let pooler = database.pooler;
        ConnectSettings::resolve(&pool_url(database), database, instance, pooler)
    }

    /// Resolve the connection settings of the LISTEN session: `database.listen_url`, else the
    /// same string as [`ConnectSettings::new`]. These always carry the startup options: they
    /// must lead to PostgreSQL itself, with no pooler between (docs/operations.md, "Behind
    /// PgBouncer").
    ///
    /// # Errors
    ///
    /// A connection string that does not parse.
    pub fn listen(database: &DatabaseConfig, instance: &str) -> Result<Self, BadConnectionString> {
        match &database.listen_url {
            None => ConnectSettings::resolve(&pool_url(database), database, instance, Pooler::None),
            Some(url) => {
                ConnectSettings::resolve(url, database, instance, Pooler::None).map_err(|inner| {
                    BadConnectionString::ListenUrl {
                        inner: Box::new(inner),
                    }
                })
            }
        }
    }

    /// Whether these sessions go through a transaction pooler (`database.pooler`).
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }

    fn resolve(
        url: &str,
        database: &DatabaseConfig,
        instance: &str,
        pooler: Pooler,
    ) -> Result<Self, BadConnectionString> {
        if let Some(scheme) = foreign_scheme(url) {
            return Err(BadConnectionString::Scheme(scheme.to_string()));
        }
        let split = conninfo::split(url);
        let mut config = Config::from_str(&split.rest).map_err(BadConnectionString::Parse)?;
        libpq::apply_env(&mut config, |name| std::env::var(name).ok())
            .map_err(BadConnectionString::Parse)?;
        libpq::apply_defaults(&mut config);
        let mode_text = split
            .sslmode
            .or_else(|| std::env::var("PGSSLMODE").ok())
            .unwrap_or_else(|| "prefer".to_string());
        let ssl_mode = SslMode::parse(&mode_text).ok_or(TlsError::SslMode(mode_text))?;
        let root_cert = split
            .sslrootcert
            .or_else(|| std::env::var("PGSSLROOTCERT").ok())
            .map(std::path::PathBuf::from);
        let tls = tls::connector(ssl_mode, root_cert.as_deref())?;
        config.ssl_mode(ssl_mode.negotiation());
        let attrs = split
            .target_session_attrs
            .or_else(|| std::env::var("PGTARGETSESSIONATTRS").ok())
            .unwrap_or_else(|| "any".to_string());
        config.target_session_attrs(session_attrs(&attrs)?);
        let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
        let ports = config.get_ports().len();
        if ports > 1 && ports != hosts {
            return Err(BadConnectionString::Ports { hosts, ports });
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(database.connect_timeout);
        }
        config
            .application_name(format!("pgtaskd/{instance}"))
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .tcp_user_timeout(TCP_USER_TIMEOUT);
        let connect_timeout = *config.get_connect_timeout().expect("set above");
        let tries = u32::try_from(hosts.max(1)).unwrap_or(u32::MAX);
        let mut settings = ConnectSettings {
            config,
            tls,
            ssl_mode,
            pool_size: database.pool_size,
            connect_deadline: connect_timeout.saturating_mul(tries),
            query_deadline: query_deadline(database.statement_timeout),
            pooler,
        };
        if pooler == Pooler::None {
            settings.add_session_timeouts(database.statement_timeout);
        }
        Ok(settings)
    }

    /// The resolved libpq settings (the password is redacted by its `Debug`).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The TLS connector for these settings.
    pub fn tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// The libpq `sslmode` in force.
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// Whether sessions must accept writes (`target_session_attrs=read-write`): then a
    /// session whose server turns read-only is to be replaced.
    pub fn requires_writes(&self) -> bool {
        self.config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite
    }

    /// What the daemon's sessions rely on, passed as startup options so that it holds from
    /// the first statement on, survives a pool's connection reuse, and wins over
    /// `ALTER DATABASE ... SET` and `ALTER ROLE ... SET` (a client's setting comes later).
    fn add_session_timeouts(&mut self, statement_timeout: Duration) {
        let mut options = self.config.get_options().unwrap_or_default().to_string();
        let millis = |d: Duration| d.as_millis().to_string();
        let settings = [
            ("statement_timeout", millis(statement_timeout)),
            ("lock_timeout", millis(statement_timeout)),
            (
                "idle_in_transaction_session_timeout",
                millis(IDLE_IN_TRANSACTION_TIMEOUT),
            ),
        ];
        let fixed = SESSION_DEFAULTS
            .iter()
            .map(|(name, value)| (*name, value.to_string()));
        for (name, value) in settings.into_iter().chain(fixed) {
            if !options.is_empty() {
                options.push(' ');
            }
            // A space inside a startup option's value is escaped with a backslash.
            options.push_str(&format!("-c {name}={}", value.replace(' ', "\\ ")));
        }
        self.config.options(&options);
    }
}

/// The transaction defaults every statement of pgtaskd is written for. A database default
/// of `serializable` made every claim conflict with its neighbours' (a 20,000-task drain
/// took 15 times as long, with thousands of retries); `default_transaction_read_only = on`
/// failed every write while the server answered reads.
const SESSION_DEFAULTS: [(&str, &str); 3] = [
    ("default_transaction_isolation", "read committed"),
    ("default_transaction_read_only", "off"),
    ("default_transaction_deferrable", "off"),
];

/// `database.url`, else `PGTASKD_DATABASE_URL` (for a configuration built without
/// [`crate::config::Config::load`]), else the empty string.
fn pool_url(database: &DatabaseConfig) -> String {
    database
        .url
        .clone()
        .or_else(|| std::env::var(DATABASE_URL_ENV).ok())
        .unwrap_or_default()
}

/// The scheme of a URL that is not PostgreSQL's (`mysql://...`), which would otherwise be
/// read as a malformed key=value string.
fn foreign_scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.trim_start().split_once("://")?;
    let is_scheme = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (is_scheme && scheme != "postgres" && scheme != "postgresql").then_some(scheme)
}

/// libpq's `target_session_attrs` values that a daemon can use: `any` takes the first server
/// that accepts the session, `read-write` the first whose sessions accept writes. The others
/// (`read-only`, `primary`, `standby`, `prefer-standby`) would either choose servers where
/// the daemon cannot work or differ from `read-write` only in ways that do not help it.
fn session_attrs(text: &str) -> Result<TargetSessionAttrs, BadConnectionString> {
    match text {
        "any" => Ok(TargetSessionAttrs::Any),
        "read-write" => Ok(TargetSessionAttrs::ReadWrite),
        other => Err(BadConnectionString::TargetSessionAttrs(other.to_string())),
    }
}

/// The client-side deadline of one pooled operation: twice the server's
/// `statement_timeout`, so that the server's own timeout normally answers first, or a minute
/// when that timeout is off.
fn query_deadline(statement_timeout: Duration) -> Duration {
    if statement_timeout.is_zero() {
        QUERY_DEADLINE_WITHOUT_TIMEOUT
    } else {
        statement_timeout * 2
    }
}

#[cfg(test)]
mod tests;
