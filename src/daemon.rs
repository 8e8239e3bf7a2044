//! `pgtaskd run`: wires the listener, the pool and the worker together, and stops them in
//! order.
//!
//! Start: take a fresh instance id; bind and start the HTTP server, if any, so that `/healthz`
//! answers and `/readyz` says why while the daemon waits; connect (retrying while the
//! database is unreachable, but not when it refuses the settings: that is a configuration
//! error, exit 78); check the database encoding and schema (or migrate, with `--migrate`);
//! check that the LISTEN session (`database.listen_url`) reaches PostgreSQL itself and, behind
//! a transaction pooler, that the role gives the transaction defaults pgtaskd relies on
//! (`db::pooler`; exit 78 otherwise); record the daemon in `pgtaskd.daemons`
//! (`maintenance::presence`); start the listener and the worker. Once running, a
//! refused session (a rotated password) is retried with backoff like an outage, and
//! readiness, `STATUS=` and the log say why.
//!
//! Stop, when the [`Shutdown`] fires: stop claiming, let running tasks finish within the
//! grace, stop the analyzers that still run, commit or release every claim, delete the
//! daemon's row in `pgtaskd.daemons`, then return.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::analyzer::Analyzer;
use crate::backoff::Backoff;
use crate::config::Config;
use crate::config::Pooler;
use crate::db::listen::{self, ListenEvents};
use crate::db::migrate::{self, SchemaError};
use crate::db::pooler::{self, PoolerError};
use crate::db::{BadConnectionString, ConnectSettings, DbError};
use crate::health::{self, Health};
use crate::http::{self, HttpError};
use crate::maintenance;
use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::shutdown::Shutdown;
use crate::worker::Workers;
use tokio_util::sync::CancellationToken;

const STARTUP_RETRY_BASE: Duration = Duration::from_millis(200);
const STARTUP_RETRY_CAP: Duration = Duration::from_secs(10);

/// How `run` was asked to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Apply pending migrations before starting.
    pub migrate: bool,
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The connection settings cannot be used.
    #[error("configuration error")]
    Settings(#[from] BadConnectionString),
    /// The HTTP token file cannot be used.
    #[error("configuration error")]
    Token(#[source] HttpError),
    /// The HTTP address cannot be bound.
    #[error(transparent)]
    Bind(HttpError),
    /// The database is not one this binary can work with: not UTF8, or a schema it does not
    /// know.
    #[error("configuration error")]
    Schema(#[source] SchemaError),
    /// The HTTP client of the `http` handlers cannot be built.
    #[error("cannot build the HTTP client of the http handlers: {0}")]
    HttpClient(String),
    /// The sessions lead to a connection pooler where pgtaskd cannot work as configured
    /// (docs/operations.md, "Behind PgBouncer").
    #[error("configuration error: {0}")]
    Pooler(String),
    /// Another live daemon runs one of this daemon's queues with a handler, where this one
    /// would run it with the built-in text-stats.
    #[error("configuration error")]
    HandlerConflict(#[from] maintenance::presence::HandlerConflict),
    /// The database answered the start-up's statements with an error.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A stop gave up on a database that did not take its last writes (it did not answer,
    /// or refused them: a full disk): these claims stay RUNNING until their leases expire.
    #[error("stopped with {0} claim(s) unsettled: the database did not take their last writes (see the warnings above); their leases expire and another daemon runs them again")]
    Unsettled(usize),
}

impl From<PoolerError> for DaemonError {
    fn from(err: PoolerError) -> Self {
        match err {
            PoolerError::Db(err) => DaemonError::Db(err),
            PoolerError::Misplaced(message) => DaemonError::Pooler(message),
        }
    }
}

impl From<SchemaError> for DaemonError {
    fn from(err: SchemaError) -> Self {
        match err {
            SchemaError::Db(err) => DaemonError::Db(err),
            other => DaemonError::Schema(other),
        }
    }
}

/// A fresh id for this process: host, process id and a key of ten random characters of
/// `[0-9a-z]` (about 52 bits, from the OS's randomness), short enough for `application_name`.
/// The key alone is what its claims write as `lease_owner` ([`crate::queue::lease_key`]): it
/// is the daemon's identity on its leases, which two daemons must never share.
pub fn new_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".to_string());
    let host: String = host.chars().take(32).collect();
    format!(
        "{host}:{}:{}",
        std::process::id(),
        lease_key_chars(random_u64())
    )
}

/// Ten characters of `[0-9a-z]` from `n`: its value modulo 36^10, in base 36.
fn lease_key_chars(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut key = [b'0'; 10];
    for digit in key.iter_mut().rev() {
        *digit = DIGITS[(n % 36) as usize];
        n /= 36;
    }
    String::from_utf8_lossy(&key).into_owned()
}

/// 64 bits from the kernel's random source (`getrandom(2)`), else from the process's own
/// generator, seeded by the clock (a kernel without the call).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is 8 writable bytes, and the call writes at most that many.
    let read = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if read == 8 {
        u64::from_ne_bytes(bytes)
    } else {
        fastrand::u64(..)
    }
}

/// Run the daemon until `shutdown` fires and every claim is committed or released.
///
/// # Errors
///
/// A bad connection string, an unreadable HTTP token file, an HTTP address that cannot be
/// bound, settings the database refuses at start ([`DbError::Rejected`]: a wrong password, an
/// unknown role, no such database), a database that is not UTF8 or a schema this binary does
/// not know, or a database that answers the start-up's statements with an error. A database
/// that is down is waited for, not an error.
pub async fn run(
    config: &Config,
    analyzer: Arc<dyn Analyzer>,
    shutdown: Shutdown,
    options: RunOptions,
) -> Result<(), DaemonError> {
    let instance = new_instance_id();
    let settings = ConnectSettings::new(&config.database, &instance)?;
    // The LISTEN session's, and those of the other sessions that need one of their own.
    let direct = ConnectSettings::listen(&config.database, &instance)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    tracing::info!(instance = %instance, concurrency = config.worker.concurrency,
        queues = ?config.worker.queues, "pgtaskd starting");
    let health = Arc::new(Health::new());
    let metrics = Arc::new(Metrics::serving(&config.worker.queues));
    // The handlers' progress reports, from the exec lanes and the HTTP route.
    let progress = Progress::new(Arc::clone(&metrics));
    let background = CancellationToken::new();
    let _stop_background = background.clone().drop_guard();
    tokio::spawn(health::watchdog(background.clone()));

    // The HTTP server starts before the database is waited for: it answers `/healthz`, and
    // `/readyz` says what the daemon waits for. The pool opens sessions only when asked.
    let pool = settings.pool();
    tokio::spawn(
        pool.clone()
            .watch_replication(settings.clone(), background.clone()),
    );
    // The HTTP waiters, fed by the listener; `None` without an HTTP server.
    let completions = config
        .http
        .listen
        .as_ref()
        .map(|_| http::Completions::new());
    if let Some(addr) = &config.http.listen {
        let token = match &config.http.token_file {
            Some(path) => Some(http::read_token(path).map_err(DaemonError::Token)?),
            None => None,
        };
        let listener = http::bind(addr).await.map_err(DaemonError::Bind)?;
        let loopback = listener
            .local_addr()
            .is_ok_and(|bound| bound.ip().is_loopback());
        let state = http::AppState {
            pool: pool.clone(),
            metrics: Arc::clone(&metrics),
            health: Arc::clone(&health),
            token,
            completions: completions.clone().expect("made when http.listen is set"),
            served: config.worker.queues.clone().into(),
            waiters: http::waiters(config.http.max_connections),
            progress: Arc::clone(&progress),
            loopback,
        };
        let router = http::router(state, config.http.max_body);
        tokio::spawn(http::serve(
            listener,
            router,
            http::Limits::from(&config.http),
            background.clone(),
        ));
    }

    let stop = shutdown.stopping();
    let listen_setting = pooler::listen_setting(&config.database);
    let start = Start {
        settings: &settings,
        direct: &direct,
        listen_setting,
        options,
    };
    if !prepare_schema(&start, &health, &stop).await? {
        tracing::info!("shutdown before the database was reached");
        return Ok(());
    }

    let worker = Workers::new(config, &pool, &analyzer, &instance, &metrics, &progress)
        .map_err(DaemonError::HttpClient)?;
    // Written once a second; once more when the last lane has stopped.
    let flusher_stop = CancellationToken::new();
    let flusher = tokio::spawn(Arc::clone(&progress).run(pool.clone(), flusher_stop.clone()));
    // Listed in `pgtaskd.daemons` before it is ready: every lane's queues, once.
    let presence = maintenance::presence::Presence::start(
        &pool,
        &instance,
        &config.worker.queues,
        &config.handler_fingerprints(),
        config.worker.poll_interval,
        worker.withheld(),
    )
    .await?;
    let listener = tokio::spawn(listen::run(
        direct.clone(),
        DaemonEvents {
            worker: worker.clone(),
            health: Arc::clone(&health),
            metrics: Arc::clone(&metrics),
            connects: AtomicU64::new(0),
            completions: completions.clone(),
        },
        background.clone(),
    ));
    if let Some(completions) = &completions {
        // The safety net of the HTTP waiters: one read per tick for all of them.
        tokio::spawn(Arc::clone(completions).poll(
            pool.clone(),
            config.worker.poll_interval,
            background.clone(),
        ));
    }
    maintenance::start(
        config,
        &pool,
        &direct,
        worker.instance(),
        &metrics,
        &health,
        &background,
    );
    // Ready once the listener is up and each lane's first claim after it came up was answered
    // (not once its backlog is drained: a scan claims on while tasks wait).
    let readiness = tokio::spawn({
        let health = Arc::clone(&health);
        let worker = worker.clone();
        async move {
            health.wait_listening().await;
            worker.scanned().await;
            health.started();
        }
    });

    worker.run(stop).await;
    readiness.abort();
    health.stopping();
    tracing::info!(running = worker.running(), "no more claims");
    let unsettled = worker
        .shutdown(config.shutdown.grace, shutdown.hurrying())
        .await;
    flusher_stop.cancel();
    let _ = flusher.await;
    presence.stop().await;
    background.cancel();
    let _ = listener.await;
    if unsettled > 0 {
        return Err(DaemonError::Unsettled(unsettled));
    }
    tracing::info!("pgtaskd stopped");
    Ok(())
}

/// What the start-up checks need.
struct Start<'a> {
    /// `database.url`'s settings.
    settings: &'a ConnectSettings,
    /// The LISTEN session's.
    direct: &'a ConnectSettings,
    /// Where `direct` came from, in the words of the configuration.
    listen_setting: &'a str,
    options: RunOptions,
}

/// Check (or migrate) the schema, check that the sessions lead where they may, retrying
/// while the database is unreachable, and saying why in readiness and `STATUS=`. Returns
/// false when shutdown came first. Settings the database refuses are returned, not waited
/// for: they do not start working by themselves.
async fn prepare_schema(
    start: &Start<'_>,
    health: &Health,
    stop: &CancellationToken,
) -> Result<bool, DaemonError> {
    let mut backoff = Backoff::new(STARTUP_RETRY_BASE, STARTUP_RETRY_CAP);
    loop {
        let attempt = async {
            let mut client = start.settings.connect().await?;
            if start.options.migrate {
                let target = migrate::target(start.settings, &client).await?;
                tracing::info!(
                    host = %target.host,
                    port = target.port,
                    database = %target.database,
                    user = %target.user,
                    "migrating {target}"
                );
                let applied = migrate::migrate(&mut client).await?;
                if !applied.is_empty() {
                    tracing::info!(?applied, "migrations applied");
                }
            }
            let version = migrate::check(&client).await?;
            tracing::info!(version, "schema checked");
            // A standby answers the checks above, and would fail every claim.
            health::check_writable(&client).await?;
            pooler::check_defaults(&client, start.settings.pooler() == Pooler::Transaction).await?;
            pooler::check_listen(start.direct, start.listen_setting).await?;
            Ok::<(), DaemonError>(())
        };
        match attempt.await {
            Ok(()) => {
                health.reached();
                return Ok(true);
            }
            Err(DaemonError::Db(err)) if err.is_unavailable() => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    error = %err,
                    retry_in_ms = delay.as_millis() as u64,
                    "database unavailable; waiting for it"
                );
                health.waiting(&err.to_string());
                tokio::select! {
                    _ = stop.cancelled() => return Ok(false),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// The listener's events, delivered to the worker, the readiness and the metrics.
struct DaemonEvents {
    worker: Workers,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    connects: AtomicU64,
    /// The HTTP waiters, when there is an HTTP server.
    completions: Option<Arc<http::Completions>>,
}

impl ListenEvents for DaemonEvents {
    fn connected(&self) {
        if self.connects.fetch_add(1, Ordering::Relaxed) > 0 {
            self.metrics.listener_reconnected();
        }
        self.health.listener_connected();
        self.worker.relisten();
        self.worker.wake();
        // Completions may have been announced while nobody listened.
        if let Some(completions) = &self.completions {
            completions.wake_all();
        }
    }

    fn disconnected(&self, why: Option<&DbError>) {
        let reason = why.map_or_else(
            || "the listener connection was lost".to_string(),
            DbError::to_string,
        );
        let new = self.health.listener_lost(&reason);
        if let Some(err) = why.filter(|err| new && err.is_rejected()) {
            tracing::error!(
                error = %err,
                "the database refused the listener's session; retrying with backoff until the \
                 settings or the server are put right"
            );
        }
    }

    fn work_available(&self) {
        self.worker.wake();
    }

    fn cancel_requested(&self, id: i64) {
        self.worker.cancel_running(id);
    }

    fn wants_completions(&self) -> bool {
        self.completions.is_some()
    }

    fn completed(&self, ids: &mut dyn Iterator<Item = i64>) {
        if let Some(completions) = &self.completions {
            completions.completed(ids);
        }
    }
}
