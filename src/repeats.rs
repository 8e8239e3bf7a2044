//! How a failure that repeats is logged: during an outage the same statement fails at every
//! heartbeat, poll or reconnect, and a line each time would bury the log (docs/operations.md,
//! "Logs": each outage and recovery once).
//!
//! A [`Repeats`] counts the failures of one kind since its last success. The first is said at
//! WARN; the next ones at DEBUG, with a WARN reminder and their count once a minute while they
//! go on; the first success after them is said once at INFO with how many there were and for
//! how long. The retry cadence is the caller's: this only decides what the log says.
//! `log_failure!` and `log_recovery!` log with the caller's own target, so `log.level` filters
//! them as before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a failure that goes on is said again at WARN.
pub const REMINDER: Duration = Duration::from_secs(60);

/// The failures of one kind since its last success.
#[derive(Debug, Default)]
pub struct Repeats {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the first failure since the last success came; `None` while all is well.
    since: Option<Instant>,
    /// Failures since the last success.
    failures: u64,
    /// When the log last said so at WARN.
    said_at: Option<Instant>,
}

/// What the log should say of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Say {
    /// The first since the last success: at WARN.
    First,
    /// A reminder, [`REMINDER`] after the last line at WARN: at WARN, with the failures so far.
    Reminder { failures: u64, since: Duration },
    /// A repeat: at DEBUG.
    Repeat,
}

/// The first success after failures: how many there were, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    pub failures: u64,
    pub after: Duration,
}

impl Repeats {
    /// No failure yet.
    pub const fn new() -> Repeats {
        Repeats {
            state: Mutex::new(State {
                since: None,
                failures: 0,
                said_at: None,
            }),
        }
    }

    /// Count a failure at `now`, and say how to log it.
    pub fn failed_at(&self, now: Instant) -> Say {
        let mut state = self.state.lock().expect("not poisoned");
        state.failures += 1;
        let since = *state.since.get_or_insert(now);
        match state.said_at {
            None => {
                state.said_at = Some(now);
                Say::First
            }
            Some(said) if now.saturating_duration_since(said) >= REMINDER => {
                state.said_at = Some(now);
                Say::Reminder {
                    failures: state.failures,
                    since: now.saturating_duration_since(since),
                }
            }
            Some(_) => Say::Repeat,
        }
    }

    /// [`Repeats::failed_at`] now.
    pub fn failed(&self) -> Say {
        self.failed_at(Instant::now())
    }

    /// Count a success at `now`: the failures it ends, if there were any.
    pub fn succeeded_at(&self, now: Instant) -> Option<Recovered> {
        let mut state = self.state.lock().expect("not poisoned");
        let since = state.since.take()?;
        let recovered = Recovered {
            failures: state.failures,
            after: now.saturating_duration_since(since),
        };
        *state = State::default();
        Some(recovered)
    }

    /// [`Repeats::succeeded_at`] now.
    pub fn succeeded(&self) -> Option<Recovered> {
        self.succeeded_at(Instant::now())
    }

    /// Count, now, the success of an attempt that began at `began`. One that began before the
    /// first of the failures (it was on its way when they started, as a claim overlapping the
    /// one that failed) says nothing of the database now, and ends none of them.
    pub fn succeeded_began(&self, began: Instant) -> Option<Recovered> {
        let now = Instant::now();
        let stale = {
            let state = self.state.lock().expect("not poisoned");
            state.since.is_some_and(|since| began < since)
        };
        if stale {
            None
        } else {
            self.succeeded_at(now)
        }
    }
}

/// Log failure `error` of the kind `repeats` counts, with `message` (and the fields after it,
/// as tracing takes them): at WARN the first time since the last success and once a
/// [`REMINDER`] after, at DEBUG otherwise.
macro_rules! log_failure {
    ($repeats:expr, $error:expr, $message:literal $(, $($field:tt)+)?) => {
        match $repeats.failed() {
            $crate::repeats::Say::First => ::tracing::warn!(
                error = %$error,
                $($($field)+ ,)?
                concat!(
                    $message,
                    "; until it works again, repeats are logged at debug level and counted once a minute"
                )
            ),
            $crate::repeats::Say::Reminder { failures, since } => ::tracing::warn!(
                error = %$error,
                failures,
                for_s = since.as_secs(),
                $($($field)+ ,)?
                concat!($message, "; still failing")
            ),
            $crate::repeats::Say::Repeat => {
                ::tracing::debug!(error = %$error, $($($field)+ ,)? $message)
            }
        }
    };
}

/// Log at INFO, with `message`, the first success after failures of the kind `repeats`
/// counts; nothing when there were none. With `began = INSTANT`, the success of an attempt
/// that began then ([`Repeats::succeeded_began`]).
macro_rules! log_recovery {
    ($repeats:expr, began = $began:expr, $message:literal) => {
        $crate::repeats::log_recovery!(@said $repeats.succeeded_began($began), $message)
    };
    ($repeats:expr, $message:literal) => {
        $crate::repeats::log_recovery!(@said $repeats.succeeded(), $message)
    };
    (@said $recovered:expr, $message:literal) => {
        if let Some(recovered) = $recovered {
            ::tracing::info!(
                failures = recovered.failures,
                after_ms = recovered.after.as_millis() as u64,
                $message
            );
        }
    };
}

pub(crate) use {log_failure, log_recovery};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_said_then_a_reminder_a_minute_later_then_the_recovery() {
        let repeats = Repeats::new();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(repeats.succeeded_at(at(0)), None, "nothing to recover from");
        assert_eq!(repeats.failed_at(at(1)), Say::First);
        for s in 2..61 {
            assert_eq!(repeats.failed_at(at(s)), Say::Repeat, "{s} s");
        }
        assert_eq!(
            repeats.failed_at(at(61)),
            Say::Reminder {
                failures: 61,
                since: Duration::from_secs(60)
            }
        );
        assert_eq!(repeats.failed_at(at(62)), Say::Repeat);
        assert_eq!(
            repeats.succeeded_at(at(70)),
            Some(Recovered {
                failures: 62,
                after: Duration::from_secs(69)
            })
        );
        assert_eq!(repeats.succeeded_at(at(71)), None, "said once");
        assert_eq!(repeats.failed_at(at(72)), Say::First, "a new outage");
    }

    #[test]
    fn a_success_that_began_before_the_failures_ends_none_of_them() {
        let repeats = Repeats::new();
        let began = Instant::now();
        assert_eq!(repeats.failed(), Say::First);
        assert_eq!(repeats.succeeded_began(began), None, "on its way before");
        assert_eq!(repeats.failed(), Say::Repeat, "the same outage");
        assert!(repeats.succeeded_began(Instant::now()).is_some());
    }
}
