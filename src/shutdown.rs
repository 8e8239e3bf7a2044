//! Signals -> two cancellation tokens: stop claiming, then hurry. Nothing else.
//!
//! The first SIGTERM or SIGINT fires [`Shutdown::stopping`]: the worker stops claiming at
//! once and running tasks get `shutdown.grace` to finish. The second fires
//! [`Shutdown::hurrying`]: the rest of the grace is skipped. SIGQUIT fires both at once: a
//! fast stop that skips the grace and still gives every claim back. Any further signal is
//! logged and changes nothing, so repeated signals never crash the daemon.
//!
//! Every other signal whose default would end the daemon is answered too, so that none ends
//! it with its claims RUNNING (docs/operations.md, "Signals", has the table):
//!
//! | signal | answer | why |
//! | --- | --- | --- |
//! | SIGPWR, SIGXCPU | a stop, as SIGTERM | the power is failing; the soft CPU time limit was reached, and the hard one's SIGKILL follows (the kernel repeats SIGXCPU each CPU second: the second hurries) |
//! | SIGHUP | logged, saying that the configuration is not reloaded | there is no reload |
//! | SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGSTKFLT, SIGTRAP, SIGSYS, SIGRTMIN..=SIGRTMAX | logged and ignored | nothing in the daemon asks for them |
//! | SIGXFSZ | ignored, logged the first time only | a file (the log) reached `RLIMIT_FSIZE`: the write fails with `EFBIG` and the log line is dropped; logging each one would write into the very file that raised it |
//! | SIGPIPE | ignored, not handled here | the Rust runtime ignores it before `main`; a write to a closed pipe fails with `EPIPE`, and a handler that logs would log into that pipe |
//!
//! Left at their defaults, and ending the daemon as SIGKILL does (its claims RUNNING until
//! their leases expire): SIGKILL and SIGSTOP, which cannot be handled; SIGSEGV, SIGBUS,
//! SIGILL and SIGFPE, raised by a faulting instruction, which a handler that returns would
//! only execute again (the Rust runtime's SIGSEGV and SIGBUS handlers report a stack
//! overflow and then let the signal kill); SIGABRT, which `abort` raises and systemd's
//! watchdog sends to a daemon whose runtime stopped answering, where a handler would run
//! nowhere and only trade the core dump for the SIGKILL that follows; and signal 32, which
//! glibc keeps for itself below SIGRTMIN and refuses a handler for (signal 33, its other
//! one, has glibc's own handler, which ignores a signal sent by `kill`). A handler here is
//! the daemon's own: the exec handler's children start with every signal at its default
//! (`handler/exec/spawn.rs`; `execve` resets caught signals).
//!
//! Tests trigger the same tokens by calling [`Shutdown::trigger`] and [`Shutdown::fast`]
//! instead of sending signals.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use libc::{
    c_int, SIGALRM, SIGHUP, SIGINT, SIGIO, SIGPROF, SIGPWR, SIGQUIT, SIGSTKFLT, SIGSYS, SIGTERM,
    SIGTRAP, SIGUSR1, SIGUSR2, SIGVTALRM, SIGXCPU, SIGXFSZ,
};
use tokio_util::sync::CancellationToken;

/// The shutdown trigger handed to [`crate::daemon::run`].
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    stop: CancellationToken,
    hurry: CancellationToken,
    /// Set once a SIGXFSZ was logged: later ones are not.
    file_size_logged: Arc<AtomicBool>,
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

    /// Answer every signal `handled` names as docs/operations.md, "Signals", says, from now on.
    ///
    /// # Errors
    ///
    /// The signal handlers could not be installed.
    pub fn on_signals(&self) -> std::io::Result<()> {
        let mut signals = signal_hook_tokio::Signals::new(handled())?;
        let shutdown = self.clone();
        tokio::spawn(async move {
            while let Some(signal) = signals.next().await {
                shutdown.on_signal(signal);
            }
        });
        Ok(())
    }

    /// What one signal does.
    fn on_signal(&self, signal: c_int) {
        let Some((name, answer)) = answer(signal) else {
            tracing::info!(signal, "signal received; ignored");
            return;
        };
        let name = name.as_str();
        match answer {
            Answer::Stop => {
                match signal {
                    SIGPWR => tracing::warn!(signal = name, "the power is failing; stopping"),
                    SIGXCPU => tracing::warn!(
                        signal = name,
                        "the soft limit of CPU time was reached; stopping before the hard limit's SIGKILL"
                    ),
                    _ => tracing::info!(signal = name, "signal received"),
                }
                self.trigger();
            }
            Answer::FastStop => {
                tracing::info!(signal = name, "signal received");
                self.fast();
            }
            Answer::NoReload => {
                tracing::warn!(
                    signal = name,
                    "SIGHUP: the configuration is not reloaded; restart pgtaskd to apply a change"
                );
            }
            Answer::Ignored => tracing::info!(signal = name, "signal received; ignored"),
            Answer::FileSize => {
                if !self.file_size_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        signal = name,
                        "a file reached the size limit (RLIMIT_FSIZE, ulimit -f): writes past it \
                         fail and log lines past it are dropped; further SIGXFSZ are not logged"
                    );
                }
            }
        }
    }
}

/// What a signal asks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// [`Shutdown::trigger`]: the first stops, the second hurries.
    Stop,
    /// [`Shutdown::fast`].
    FastStop,
    /// SIGHUP: logged, saying that nothing is reloaded.
    NoReload,
    /// Logged and otherwise ignored.
    Ignored,
    /// SIGXFSZ: ignored, logged the first time only.
    FileSize,
}

/// The signals answered, besides the real-time ones, with their names and answers.
const NAMED: [(c_int, &str, Answer); 16] = [
    (SIGTERM, "SIGTERM", Answer::Stop),
    (SIGINT, "SIGINT", Answer::Stop),
    (SIGPWR, "SIGPWR", Answer::Stop),
    (SIGXCPU, "SIGXCPU", Answer::Stop),
    (SIGQUIT, "SIGQUIT", Answer::FastStop),
    (SIGHUP, "SIGHUP", Answer::NoReload),
    (SIGUSR1, "SIGUSR1", Answer::Ignored),
    (SIGUSR2, "SIGUSR2", Answer::Ignored),
    (SIGALRM, "SIGALRM", Answer::Ignored),
    (SIGVTALRM, "SIGVTALRM", Answer::Ignored),
    (SIGPROF, "SIGPROF", Answer::Ignored),
    (SIGIO, "SIGIO", Answer::Ignored),
    (SIGSTKFLT, "SIGSTKFLT", Answer::Ignored),
    (SIGTRAP, "SIGTRAP", Answer::Ignored),
    (SIGSYS, "SIGSYS", Answer::Ignored),
    (SIGXFSZ, "SIGXFSZ", Answer::FileSize),
];

/// Every signal [`Shutdown::on_signals`] answers: [`NAMED`], then SIGRTMIN..=SIGRTMAX (as the
/// C library numbers them: glibc keeps 32 and 33 below them for itself).
fn handled() -> impl Iterator<Item = c_int> {
    NAMED
        .iter()
        .map(|(signal, _, _)| *signal)
        .chain(libc::SIGRTMIN()..=libc::SIGRTMAX())
}

/// The name and the answer of `signal`, `None` for one not answered. A real-time signal is
/// named as `kill -l` names it: SIGRTMIN, SIGRTMIN+1 .. SIGRTMAX-1, SIGRTMAX.
fn answer(signal: c_int) -> Option<(String, Answer)> {
    if let Some((_, name, answer)) = NAMED.iter().find(|(n, _, _)| *n == signal) {
        return Some(((*name).to_string(), *answer));
    }
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    if !(min..=max).contains(&signal) {
        return None;
    }
    let name = if signal == min {
        "SIGRTMIN".to_string()
    } else if signal == max {
        "SIGRTMAX".to_string()
    } else if signal - min <= (max - min) / 2 {
        format!("SIGRTMIN+{}", signal - min)
    } else {
        format!("SIGRTMAX-{}", max - signal)
    };
    Some((name, Answer::Ignored))
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

    #[test]
    fn a_fast_stop_stops_and_hurries_at_once_and_ignored_signals_change_nothing() {
        let shutdown = Shutdown::new();
        let ignored = NAMED
            .iter()
            .filter(|(_, _, answer)| !matches!(answer, Answer::Stop | Answer::FastStop))
            .map(|(signal, _, _)| *signal)
            .chain(libc::SIGRTMIN()..=libc::SIGRTMAX());
        for signal in ignored {
            shutdown.on_signal(signal);
        }
        shutdown.on_signal(SIGXFSZ);
        assert!(!shutdown.stopping().is_cancelled() && !shutdown.hurrying().is_cancelled());
        shutdown.on_signal(SIGQUIT);
        assert!(shutdown.stopping().is_cancelled() && shutdown.hurrying().is_cancelled());
        shutdown.on_signal(SIGQUIT);
        shutdown.on_signal(SIGTERM);
    }

    #[test]
    fn sigpwr_and_sigxcpu_stop_as_sigterm_does_and_a_second_one_hurries() {
        for signal in [SIGPWR, SIGXCPU] {
            let shutdown = Shutdown::new();
            shutdown.on_signal(signal);
            assert!(shutdown.stopping().is_cancelled() && !shutdown.hurrying().is_cancelled());
            shutdown.on_signal(signal);
            assert!(shutdown.hurrying().is_cancelled());
        }
    }

    #[test]
    fn real_time_signals_are_named_as_kill_l_names_them_and_ignored() {
        let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
        assert_eq!(answer(min), Some(("SIGRTMIN".into(), Answer::Ignored)));
        assert_eq!(
            answer(min + 1),
            Some(("SIGRTMIN+1".into(), Answer::Ignored))
        );
        assert_eq!(
            answer(max - 1),
            Some(("SIGRTMAX-1".into(), Answer::Ignored))
        );
        assert_eq!(answer(max), Some(("SIGRTMAX".into(), Answer::Ignored)));
        assert_eq!(answer(min - 1), None);
        let names: std::collections::HashSet<String> = (min..=max)
            .map(|signal| answer(signal).unwrap().0)
            .collect();
        assert_eq!(names.len(), (max - min + 1) as usize, "{names:?}");
    }
}
