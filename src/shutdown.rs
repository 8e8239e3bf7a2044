//! Signals -> two cancellation tokens: stop claiming, then hurry. Nothing else.
//!
//! The first SIGTERM or SIGINT fires [`Shutdown::stopping`]: the worker stops claiming at
//! once and running tasks get `shutdown.grace` to finish. The second fires
//! [`Shutdown::hurrying`]: the rest of the grace is skipped. SIGQUIT fires both at once: a
//! fast stop that skips the grace and still gives every claim back. Any further signal is
//! logged and changes nothing, so repeated signals never crash the daemon.
//!
//! The other signals a service receives never end the daemon with its claims RUNNING:
//! SIGHUP (a reload, or a closed terminal) is logged, saying that the configuration is not
//! reloaded; SIGUSR1 and SIGUSR2 are logged and ignored. SIGPIPE is ignored (the Rust runtime
//! sets it so before `main`; a write to a closed pipe fails with `EPIPE` instead), and is
//! not handled here: a handler that logs would log into the very pipe that raised it.
//! docs/operations.md, "Signals", has the table; tests trigger the same tokens by calling
//! [`Shutdown::trigger`] and [`Shutdown::fast`] instead of sending signals.

use futures_util::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use tokio_util::sync::CancellationToken;

/// The shutdown trigger handed to [`crate::daemon::run`].
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    stop: CancellationToken,
    hurry: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Fires at the first request: stop claiming.
    pub fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Fires at the second request: skip the rest of the grace.
    pub fn hurrying(&self) -> CancellationToken {
        self.hurry.clone()
    }

    /// Request a shutdown: the first call stops claiming, the second hurries, later calls do
    /// nothing. Safe to call any number of times, from anywhere.
    pub fn trigger(&self) {
        if !self.stop.is_cancelled() {
            tracing::info!("shutdown requested: no more claims; running tasks may finish");
            self.stop.cancel();
        } else if !self.hurry.is_cancelled() {
            tracing::info!("second shutdown request: skipping the rest of the grace");
            self.hurry.cancel();
        } else {
            tracing::info!("shutdown already under way");
        }
    }

    /// A fast stop: stop claiming and skip the grace at once; the analyzers are told to
    /// stop and every claim is still committed or given back. Later requests change nothing.
    pub fn fast(&self) {
        if self.hurry.is_cancelled() {
            tracing::info!("shutdown already under way");
            return;
        }
        tracing::info!("fast shutdown requested: no more claims; stopping the handlers now");
        self.stop.cancel();
        self.hurry.cancel();
    }

    /// Answer every signal of `HANDLED` as docs/operations.md, "Signals", says, from now on.
    ///
    /// # Errors
    ///
    /// The signal handlers could not be installed.
    pub fn on_signals(&self) -> std::io::Result<()> {
        let mut signals = signal_hook_tokio::Signals::new(HANDLED.iter().map(|(n, _)| *n))?;
        let shutdown = self.clone();
        tokio::spawn(async move {
            while let Some(signal) = signals.next().await {
                shutdown.on_signal(signal);
            }
        });
        Ok(())
    }

    /// What one signal does.
    fn on_signal(&self, signal: i32) {
        let name = HANDLED
            .iter()
            .find(|(n, _)| *n == signal)
            .map_or("unknown", |(_, name)| name);
        match signal {
            SIGTERM | SIGINT => {
                tracing::info!(signal = name, "signal received");
                self.trigger();
            }
            SIGQUIT => {
                tracing::info!(signal = name, "signal received");
                self.fast();
            }
            SIGHUP => {
                tracing::warn!(
                    signal = name,
                    "SIGHUP: the configuration is not reloaded; restart pgtaskd to apply a change"
                );
            }
            _ => tracing::info!(signal = name, "signal received; ignored"),
        }
    }
}

/// The signals [`Shutdown::on_signals`] answers, with their names.
const HANDLED: [(i32, &str); 6] = [
    (SIGTERM, "SIGTERM"),
    (SIGINT, "SIGINT"),
    (SIGQUIT, "SIGQUIT"),
    (SIGHUP, "SIGHUP"),
    (SIGUSR1, "SIGUSR1"),
    (SIGUSR2, "SIGUSR2"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_trigger_stops_second_hurries_later_ones_change_nothing() {
        let shutdown = Shutdown::new();
        assert!(!shutdown.stopping().is_cancelled());
        shutdown.trigger();
        assert!(shutdown.stopping().is_cancelled());
        assert!(!shutdown.hurrying().is_cancelled());
        shutdown.trigger();
        assert!(shutdown.hurrying().is_cancelled());
        shutdown.trigger();
        shutdown.trigger();
        assert!(shutdown.stopping().is_cancelled() && shutdown.hurrying().is_cancelled());
    }

    #[test]
    fn a_fast_stop_stops_and_hurries_at_once_and_ignored_signals_change_nothing() {
        let shutdown = Shutdown::new();
        for signal in [SIGHUP, SIGUSR1, SIGUSR2] {
            shutdown.on_signal(signal);
        }
        assert!(!shutdown.stopping().is_cancelled() && !shutdown.hurrying().is_cancelled());
        shutdown.on_signal(SIGQUIT);
        assert!(shutdown.stopping().is_cancelled() && shutdown.hurrying().is_cancelled());
        shutdown.on_signal(SIGQUIT);
        shutdown.on_signal(SIGTERM);
    }
}
