//! Readiness, and what systemd is told about it (`Type=notify`).
//!
//! - `READY=1` once, when the schema was checked, the listener is connected and the first
//!   scan for work ran.
//! - `STATUS=` whenever the listener connects or loses the database, so that
//!   `systemctl status` says why a daemon is waiting.
//! - `WATCHDOG=1` at half of `WatchdogSec`, from a task of the daemon's own runtime: a wedged
//!   runtime stops pinging and is restarted, while a daemon correctly waiting for the database
//!   keeps pinging (the outage shows in STATUS and readiness instead).
//! - `STOPPING=1` when shutdown begins.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) every notification is a no-op.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

/// The daemon's readiness, shared by the listener, the HTTP server and systemd.
#[derive(Debug)]
pub struct Health {
    listening: watch::Sender<bool>,
    ready: AtomicBool,
    stopping: AtomicBool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            listening: watch::channel(false).0,
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
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

    /// Whether start-up finished (schema checked, listener up, first scan done).
    pub fn is_started(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn listener_connected(&self) {
        self.listening.send_replace(true);
        if self.is_started() {
            notify(&[NotifyState::Status("ready: listening for tasks")]);
        }
    }

    pub fn listener_lost(&self) {
        if self.listening.send_replace(false) {
            notify(&[NotifyState::Status(
                "waiting for the database: the listener connection was lost",
            )]);
        }
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

    /// Say why start-up is waiting.
    pub fn waiting(&self, why: &str) {
        notify(&[NotifyState::Status(why)]);
    }
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
