//! Connecting to PostgreSQL as `psql` would, with deadlines on every session.
//!
//! Where the connection comes from, first match wins: `database.url` in the configuration,
//! `PGTASKD_DATABASE_URL`, then an empty string. Whatever that string leaves unset is taken
//! from the libpq environment variables (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
//! `PGDATABASE`, `PGCONNECT_TIMEOUT`; `PGSSLMODE` and `PGSSLROOTCERT` in [`super::tls`]) and then libpq's defaults (the Unix socket
//! in `/var/run/postgresql` or `/tmp` when one is there, else `localhost`; port 5432; the
//! operating-system user, from the password database as libpq does; a database named like
//! the user).
//!
//! Every session gets `application_name = pgtaskd/<instance id>`, TCP keepalives and a
//! user timeout, so that a dead peer is noticed in seconds. Daemon sessions also get
//! `statement_timeout`, `lock_timeout` and `idle_in_transaction_session_timeout`.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::{self, SslMode, TlsError};
use super::{DbError, Pool};
use crate::config::DatabaseConfig;

/// The environment variable read when `database.url` is not set.
pub const DATABASE_URL_ENV: &str = "PGTASKD_DATABASE_URL";

/// How long a connection may sit in the pool's queue before it is an outage.
const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(30);
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
    config: Config,
    tls: MakeRustlsConnect,
    ssl_mode: SslMode,
    pool_size: usize,
    connect_timeout: Duration,
    query_deadline: Duration,
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
    #[error("invalid database connection string")]
    Parse(#[source] tokio_postgres::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

impl ConnectSettings {
    /// Resolve the connection settings for a process whose instance id is `instance`.
    ///
    /// # Errors
    ///
    /// A connection string that does not parse.
    pub fn new(database: &DatabaseConfig, instance: &str) -> Result<Self, BadConnectionString> {
        let url = database
            .url
            .clone()
            .or_else(|| std::env::var(DATABASE_URL_ENV).ok())
            .unwrap_or_default();
        let split = tls::split(&url);
        let mut config = Config::from_str(&split.rest).map_err(BadConnectionString::Parse)?;
        apply_libpq_env(&mut config, |name| std::env::var(name).ok())
            .map_err(BadConnectionString::Parse)?;
        apply_libpq_defaults(&mut config);
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
        let mut settings = ConnectSettings {
            config,
            tls,
            ssl_mode,
            pool_size: database.pool_size,
            connect_timeout,
            query_deadline: query_deadline(database.statement_timeout),
        };
        settings.add_session_timeouts(database.statement_timeout);
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

    /// Deadlines for the daemon's sessions, passed as startup options so that they hold
    /// from the first statement on and survive a pool's connection reuse.
    fn add_session_timeouts(&mut self, statement_timeout: Duration) {
        let mut options = self.config.get_options().unwrap_or_default().to_string();
        for (name, value) in [
            ("statement_timeout", statement_timeout),
            ("lock_timeout", statement_timeout),
            (
                "idle_in_transaction_session_timeout",
                IDLE_IN_TRANSACTION_TIMEOUT,
            ),
        ] {
            if !options.is_empty() {
                options.push(' ');
            }
            options.push_str(&format!("-c {name}={}", value.as_millis()));
        }
        self.config.options(&options);
    }

    /// Open one session and drive its connection on a task of its own.
    ///
    /// # Errors
    ///
    /// [`DbError::Unavailable`] when the server cannot be reached in time.
    pub async fn connect(&self) -> Result<Client, DbError> {
        let connecting = self.config.connect(self.tls.clone());
        let (client, connection) = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| DbError::unavailable("timed out connecting to the database"))?
            .map_err(|err| DbError::Unavailable(Box::new(err)))?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "database connection ended");
            }
        });
        Ok(client)
    }

    /// A pool of at most `database.pool_size` sessions, opened on demand, with a
    /// client-side deadline of twice `statement_timeout` on each operation.
    pub fn pool(&self) -> Pool {
        let manager = Manager::from_config(
            self.config.clone(),
            self.tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .create_timeout(Some(self.connect_timeout))
            .recycle_timeout(Some(self.connect_timeout))
            .build()
            .expect("a pool with a runtime always builds");
        Pool::new(pool, self.query_deadline)
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

/// Fill what the connection string left unset from libpq's environment variables.
fn apply_libpq_env(
    config: &mut Config,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), tokio_postgres::Error> {
    // Whatever the string sets wins; the rest goes through the same parser as a string would,
    // so that an environment value means exactly what libpq makes of it.
    let mut extra = Vec::new();
    if config.get_hosts().is_empty() {
        if let Some(host) = env("PGHOST") {
            extra.push(("host", host));
        }
    }
    if config.get_ports().is_empty() {
        if let Some(port) = env("PGPORT") {
            extra.push(("port", port));
        }
    }
    if config.get_user().is_none() {
        if let Some(user) = env("PGUSER") {
            extra.push(("user", user));
        }
    }
    if config.get_password().is_none() {
        if let Some(password) = env("PGPASSWORD") {
            extra.push(("password", password));
        }
    }
    if config.get_dbname().is_none() {
        if let Some(dbname) = env("PGDATABASE") {
            extra.push(("dbname", dbname));
        }
    }
    if config.get_connect_timeout().is_none() {
        if let Some(seconds) = env("PGCONNECT_TIMEOUT") {
            extra.push(("connect_timeout", seconds));
        }
    }
    if extra.is_empty() {
        return Ok(());
    }
    let text: Vec<String> = extra
        .iter()
        .map(|(key, value)| {
            format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            )
        })
        .collect();
    let from_env = Config::from_str(&text.join(" "))?;
    for host in from_env.get_hosts() {
        match host {
            Host::Tcp(name) => config.host(name),
            Host::Unix(path) => config.host_path(path),
        };
    }
    for port in from_env.get_ports() {
        config.port(*port);
    }
    if let Some(user) = from_env.get_user() {
        config.user(user);
    }
    if let Some(password) = from_env.get_password() {
        config.password(password);
    }
    if let Some(dbname) = from_env.get_dbname() {
        config.dbname(dbname);
    }
    if let Some(timeout) = from_env.get_connect_timeout() {
        config.connect_timeout(*timeout);
    }
    Ok(())
}

/// libpq's defaults for what neither the string nor the environment set.
fn apply_libpq_defaults(config: &mut Config) {
    if config.get_hosts().is_empty() {
        let socket_dir = ["/var/run/postgresql", "/tmp"]
            .into_iter()
            .find(|dir| has_socket(dir, config.get_ports().first().copied()));
        match socket_dir {
            Some(dir) => config.host_path(dir),
            None => config.host("localhost"),
        };
    }
    if config.get_user().is_none() {
        let user = os_user()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "postgres".to_string());
        config.user(&user);
    }
}

/// The name of the effective operating-system user, as libpq takes it.
fn os_user() -> Option<String> {
    // SAFETY: getpwuid_r writes into the buffers given; the name is copied out before they go.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut buffer = vec![0 as libc::c_char; 4096];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::geteuid(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || entry.pw_name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(entry.pw_name)
            .to_str()
            .ok()
            .map(str::to_string)
    }
}

fn has_socket(dir: &str, port: Option<u16>) -> bool {
    Path::new(dir)
        .join(format!(".s.PGSQL.{}", port.unwrap_or(5432)))
        .exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_env(url: &str, vars: &[(&str, &str)]) -> Config {
        let mut config = Config::from_str(url).unwrap();
        let lookup = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        apply_libpq_env(&mut config, lookup).unwrap();
        config
    }

    #[test]
    fn environment_fills_what_the_string_left_unset() {
        let config = with_env(
            "postgres://app@db.example:6543/",
            &[
                ("PGHOST", "other"),
                ("PGPORT", "7000"),
                ("PGUSER", "nobody"),
                ("PGDATABASE", "jobs"),
                ("PGPASSWORD", "it's secret"),
            ],
        );
        assert_eq!(config.get_hosts(), &[Host::Tcp("db.example".into())]);
        assert_eq!(config.get_ports(), &[6543]);
        assert_eq!(config.get_user(), Some("app"));
        assert_eq!(config.get_dbname(), Some("jobs"));
        assert_eq!(config.get_password(), Some(&b"it's secret"[..]));
    }

    #[test]
    fn environment_alone_names_a_unix_socket_directory() {
        let config = with_env("", &[("PGHOST", "/run/pg"), ("PGPORT", "5433")]);
        assert_eq!(config.get_hosts(), &[Host::Unix("/run/pg".into())]);
        assert_eq!(config.get_ports(), &[5433]);
    }

    #[test]
    fn verify_full_in_the_string_requires_tls() {
        let database = DatabaseConfig {
            url: Some("host=localhost user=u dbname=d sslmode=verify-full".into()),
            pool_size: 1,
            connect_timeout: Duration::from_secs(1),
            statement_timeout: Duration::ZERO,
        };
        let settings = ConnectSettings::new(&database, "x").unwrap();
        assert_eq!(settings.ssl_mode(), SslMode::VerifyFull);
        assert_eq!(
            settings.config().get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[test]
    fn an_unknown_sslmode_is_an_error() {
        let database = DatabaseConfig {
            url: Some("host=localhost sslmode=sometimes".into()),
            pool_size: 1,
            connect_timeout: Duration::from_secs(1),
            statement_timeout: Duration::ZERO,
        };
        let err = ConnectSettings::new(&database, "x").unwrap_err();
        assert!(err.to_string().contains("sometimes"), "{err}");
    }

    #[test]
    fn settings_carry_application_name_and_session_timeouts() {
        let database = DatabaseConfig {
            url: Some("host=localhost user=u dbname=d".into()),
            pool_size: 3,
            connect_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_millis(1500),
        };
        let settings = ConnectSettings::new(&database, "host:1:ab").unwrap();
        let config = settings.config();
        assert_eq!(config.get_application_name(), Some("pgtaskd/host:1:ab"));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(2)));
        let options = config.get_options().unwrap();
        assert!(options.contains("-c statement_timeout=1500"), "{options}");
        assert!(options.contains("-c lock_timeout=1500"), "{options}");
        assert!(
            options.contains("-c idle_in_transaction_session_timeout=60000"),
            "{options}"
        );
    }

    #[test]
    fn a_bad_connection_string_is_an_error() {
        let database = DatabaseConfig {
            url: Some("postgres://[broken".into()),
            pool_size: 1,
            connect_timeout: Duration::from_secs(1),
            statement_timeout: Duration::ZERO,
        };
        assert!(ConnectSettings::new(&database, "x").is_err());
    }
}
