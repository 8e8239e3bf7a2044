//! Signals -> two cancellation tokens: stop claiming, then hurry. Nothing else.
//!
//! The first SIGTERM or SIGINT fires [`Shutdown::stopping`]: the worker stops claiming at
//! once and running tasks get `shutdown.grace` to finish. The second fires
//! [`Shutdown::hurrying`]: the rest of the grace is skipped. Any further signal is logged and
//! changes nothing, so repeated signals never crash the daemon. Tests trigger the same tokens
//! by calling [`Shutdown::trigger`] instead of sending signals.

use futures_util::StreamExt;
use signal_hook::consts::{SIGINT, SIGTERM};
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

    /// Trigger this shutdown on every SIGTERM and SIGINT, from now on.
    ///
    /// # Errors
    ///
    /// The signal handlers could not be installed.
    pub fn on_signals(&self) -> std::io::Result<()> {
        let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT])?;
        let shutdown = self.clone();
        tokio::spawn(async move {
            while let Some(signal) = signals.next().await {
                let name = if signal == SIGTERM {
                    "SIGTERM"
                } else {
                    "SIGINT"
                };
                tracing::info!(signal = name, "signal received");
                shutdown.trigger();
            }
        });
        Ok(())
    }
}

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
}
