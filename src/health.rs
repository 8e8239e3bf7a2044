//! Readiness, and what systemd is told about it (`Type=notify`).
//!
//! - `READY=1` once, when the schema was checked, the listener is connected and the first
//!   claim after it was answered (or the first scan found nothing): a backlog being worked
//!   through does not hold readiness back.
//! - `STATUS=` whenever the listener connects or loses the database, and whenever the reason
//!   it waits changes (the database down at start, a session refused after a password was
//!   rotated), so that `systemctl status` says why a daemon is waiting. `/readyz` gives the same
//!   reason.
//! - `WATCHDOG=1` at half of `WatchdogSec`, from a task of the daemon's own runtime: a wedged
//!   runtime stops pinging and is restarted, while a daemon correctly waiting for the database
//!   keeps pinging (the outage shows in STATUS and readiness instead).
//! - `STOPPING=1` when shutdown begins.
//!
//! Beside readiness, warnings that do not make the daemon unready: an xmin horizon held back
//! past `vacuum_health.xmin_horizon_warning`, set by the vacuum-health watch (`src/maintenance/vacuum_health.rs`) and
//! given by `/readyz` with its 200 (docs/design.md, "Vacuum health").
//!
//! Without `NOTIFY_SOCKET` (not under systemd) every notification is a no-op.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use sd_notify::NotifyState;

use crate::db::DbError;
use tokio_util::sync::CancellationToken;

/// The daemon's readiness, shared by the listener, the HTTP server and systemd.
#[derive(Debug)]
pub struct Health {
    listening: watch::Sender<bool>,
    ready: AtomicBool,
    stopping: AtomicBool,
    /// Why the database cannot be used, while the daemon waits for it.
    why: Mutex<Option<String>>,
    /// What holds the xmin horizon back, while it is held past the warning threshold.
    horizon: Mutex<Option<String>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            listening: watch::channel(false).0,
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            why: Mutex::new(None),
            horizon: Mutex::new(None),
        }
    }
}

impl Health {
    pub fn new() -> Health {
        Health::default()
    }

    /// Whether the LISTEN connection is up.
    pub fn is_listening(&self) -> bool {
        *self.listening.borrow()
    }

    /// Wait until the LISTEN connection is up.
    pub async fn wait_listening(&self) {
        let mut rx = self.listening.subscribe();
        let _ = rx.wait_for(|up| *up).await;
    }

    /// Wait until the LISTEN connection is down (at once if it is).
    pub async fn wait_not_listening(&self) {
        let mut rx = self.listening.subscribe();
        let _ = rx.wait_for(|up| !*up).await;
    }

    /// Whether start-up finished (schema checked, listener up, first claim answered).
    pub fn is_started(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn listener_connected(&self) {
        self.listening.send_replace(true);
        self.reached();
        if self.is_started() {
            notify(&[NotifyState::Status("ready: listening for tasks")]);
        }
    }

    /// The listener lost the database, or could not reach it again, because of `why`.
    /// Returns whether that reason is new (the first, or another than the last).
    pub fn listener_lost(&self, why: &str) -> bool {
        self.listening.send_replace(false);
        self.waiting(why)
    }

    /// The database answered: nothing to wait for.
    pub fn reached(&self) {
        *self.why.lock().expect("health poisoned") = None;
    }

    /// Why the daemon is waiting for the database, while it is.
    pub fn why_waiting(&self) -> Option<String> {
        self.why.lock().expect("health poisoned").clone()
    }

    /// The xmin horizon is held back past the threshold (`Some`, saying by what), or not.
    pub fn horizon_held(&self, warning: Option<String>) {
        *self.horizon.lock().unwrap_or_else(PoisonError::into_inner) = warning;
    }

    /// What readiness warns of while staying ready: a held xmin horizon.
    pub fn warnings(&self) -> Vec<String> {
        self.horizon
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Start-up is over: tell systemd once.
    pub fn started(&self) {
        if !self.ready.swap(true, Ordering::Relaxed) {
            tracing::info!("ready");
            notify(&[
                NotifyState::Ready,
                NotifyState::Status("ready: listening for tasks"),
            ]);
        }
    }

    /// Whether shutdown began.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Shutdown began.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        notify(&[
            NotifyState::Stopping,
            NotifyState::Status("stopping: draining running tasks"),
        ]);
    }

    /// The database cannot be used because of `why`: tell systemd when that reason is new,
    /// and keep it for readiness. Returns whether it is new.
    pub fn waiting(&self, why: &str) -> bool {
        let mut last = self.why.lock().expect("health poisoned");
        if last.as_deref() == Some(why) {
            return false;
        }
        *last = Some(why.to_string());
        drop(last);
        notify(&[NotifyState::Status(&format!(
            "waiting for the database: {why}"
        ))]);
        true
    }
}

/// Whether sessions on the server `client` is connected to accept writes: a hot standby
/// (`pg_is_in_recovery()`) does not, nor does a session whose `transaction_read_only` is on
/// although pgtaskd's own startup options turn the default off (a connection pooler that
/// drops them). Read by `run` before it reports ready and by `check-config --connect`.
///
/// # Errors
///
/// [`DbError::Unavailable`] saying why, when the server does not accept writes (a standby
/// may be promoted: it is waited for, as an outage is); the database's error otherwise.
pub async fn check_writable(client: &tokio_postgres::Client) -> Result<(), DbError> {
    let row = client
        .query_typed_one(
            "SELECT pg_catalog.current_setting('transaction_read_only'),
                    pg_catalog.pg_is_in_recovery()",
            &[],
        )
        .await?;
    let read_only: String = row.get(0);
    let recovery: bool = row.get(1);
    if recovery {
        return Err(DbError::unavailable(
            "the server does not accept writes: pg_is_in_recovery() is true (a hot standby); \
             pgtaskd needs the primary",
        ));
    }
    if read_only == "on" {
        return Err(DbError::unavailable(
            "the server does not accept writes: transaction_read_only is on in pgtaskd's \
             sessions (are its startup options dropped on the way, by a connection pooler?)",
        ));
    }
    Ok(())
}

/// Ping the systemd watchdog at half its interval until `stop` fires; returns at once when
/// the unit has no watchdog.
pub async fn watchdog(stop: CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    let period = (interval / 2).max(Duration::from_millis(10));
    loop {
        notify(&[NotifyState::Watchdog]);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

fn notify(states: &[NotifyState]) {
    if let Err(err) = sd_notify::notify(states) {
        tracing::warn!(error = %err, "cannot notify systemd");
    }
}
