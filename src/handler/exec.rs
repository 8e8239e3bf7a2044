//! The `exec` handler: one child process per task, the payload on its stdin, its stdout the
//! task's output.
//!
//! # A run, from start to answer
//!
//! 1. **Start** (`child.rs`). `command` is an argv: no shell, and the payload is never in it.
//!    The child gets the daemon's environment minus its secrets and settings, plus
//!    `PGTASKD_TASK_ID`, `PGTASKD_ATTEMPT`, `PGTASKD_QUEUE`, `PGTASKD_CLAIM`, `PGTASKD_PARENTS`
//!    (a task with parents), `PGTASKD_PROGRESS` (an earlier attempt's progress),
//!    `PGTASKD_PROGRESS_FD` and `TRACEPARENT` ([`child_env`]), and no descriptor but its three
//!    pipes and, when its progress is read, the write end of a fourth as descriptor 3. It runs as the queue's `user`
//!    and `group` when given (`HOME`, `USER` and `LOGNAME` then the user's). It leads a
//!    process group of its own, and is SIGKILLed by the kernel if the daemon dies
//!    (`PR_SET_PDEATHSIG`). A command that cannot be started is an
//!    [`FailureKind::Unreachable`] failure naming the program and the OS's error.
//! 2. **Feed and read.** One loop writes the payload to stdin while it reads stdout and
//!    stderr, so a child that writes before it reads cannot deadlock; stdin is closed after
//!    the last byte. A child that exits without reading it all is not an error (the broken
//!    pipe ends the writing only). stdout is kept up to `max_output` bytes; stderr only its
//!    last [`STDERR_TAIL`] bytes (a ring): memory stays bounded whatever the child writes.
//!    The progress pipe is read in the same loop, its lines handed to a
//!    [`Sink`] (which holds at most one line's bound): a child writing
//!    progress faster than it is read waits on the pipe, never on the database.
//! 3. **Stop**, when needed. `timeout` passing or `cancel` firing: SIGTERM to the group, then
//!    SIGKILL to the group `kill_after` later if the child has not exited. stdout going over
//!    `max_output`: SIGKILL to the group at once, nothing more is read.
//! 4. **Exit.** The direct child is always awaited (a stop asked for is never taken for a stop
//!    done). Then whatever it left running in its group (a `sleep 1000 &`) is SIGKILLed, what
//!    the pipes already hold is read without waiting, and every pipe is closed: a grandchild
//!    holding stdout open cannot hang the run.
//! 5. **Answer.** Exit 0 with UTF-8 stdout within `max_output`: [`Ran::Succeeded`]. Exit 65
//!    (`EX_DATAERR`): [`Retry::Never`]. Any other failure: [`Retry::Later`]. The message holds
//!    the exit status (or signal, or "timed out after 5m") and the last bytes of stderr.
//!
//! A process that leaves the group (`setsid`, a daemonizing double fork) is not tracked: it is
//! neither waited for nor killed, and if it holds the child's stdout or stderr, what it writes
//! after the child's exit is lost.
//!
//! | file | owns |
//! | --- | --- |
//! | `exec.rs` | the run: supervising the child, stopping it, the answer |
//! | `exec/pipes.rs` | the feed-and-read loop over the child's pipes, and reading what they hold at its exit |
//! | `exec/child.rs` | starting the child in its group; signalling the group |
//! | `exec/spawn.rs` | starting a child without `fork`, its descriptors closed and its credentials switched; waiting for its exit |
//! | `exec/argv.rs` | what the child is given to `execve`: argv, environment, the paths tried, the shell's argv |
//! | `exec/env.rs` | the child's environment ([`child_env`]) |
//! | `exec/output.rs` | bounded stdout, the stderr ring, reading a pipe without waiting |

mod argv;
mod child;
mod env;
mod output;
mod pipes;
mod spawn;

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Failure, FailureKind, Job, Ran, Retry};
use crate::privileges::RunAs;
use crate::progress::Sink;
pub use env::{child_env, is_removed};
use output::StderrTail;
pub use output::STDERR_TAIL;
use pipes::Pipes;
use spawn::Child;

/// The exit status that fails a task for good: its input is bad (`EX_DATAERR` of sysexits.h).
pub const EX_DATAERR: i32 = 65;

/// The exit status that asks to run the task later without using an attempt, the delay as the
/// first line of stdout (`EX_TEMPFAIL` of sysexits.h: "try again later").
pub const EX_TEMPFAIL: i32 = 75;

/// The longest snooze: a longer one asked for is cut to this.
pub const MAX_SNOOZE: Duration = Duration::from_secs(366 * 24 * 3600);

/// The delay a snoozing command wrote as its first line of stdout: a duration (`30s`, `5m`,
/// `1h 30m`) or a number of seconds (`30`, `2.5`); `None` (the queue's backoff) for anything
/// else. At most [`MAX_SNOOZE`].
pub fn snooze_delay(stdout: &[u8]) -> Option<Duration> {
    let line = stdout.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim();
    let delay = match line.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds >= 0.0 => {
            Duration::try_from_secs_f64(seconds).ok()?
        }
        Ok(_) => return None,
        Err(_) => humantime::parse_duration(line).ok()?,
    };
    Some(delay.min(MAX_SNOOZE))
}

/// A queue's `exec` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// argv: the program and its arguments; no shell.
    pub command: Vec<String>,
    /// Then SIGTERM to the child's process group.
    pub timeout: Duration,
    /// After SIGTERM (timeout, cancel, shutdown), SIGKILL this much later.
    pub kill_after: Duration,
    /// The most bytes of stdout kept as the output; over it the attempt fails.
    pub max_output: usize,
    /// `user` and `group`: who the child runs as; the daemon's own user when `None`.
    pub run_as: Option<RunAs>,
}

/// Run `spec.command` for `job`, with `payload` on its stdin.
///
/// Returns only once the child has exited, whatever happens (see the module's lifecycle);
/// [`Ran::Canceled`] when `cancel` fired before the child exited (even while a timeout or an
/// overflow was already stopping it). Await it on a runtime's worker thread, not
/// inside `spawn_blocking` (the child's `PR_SET_PDEATHSIG` is tied to the thread that
/// started it).
pub async fn run(spec: &ExecSpec, job: &Job, payload: &[u8], cancel: &CancellationToken) -> Ran {
    run_reporting(spec, job, payload, cancel, None).await
}

/// [`run`], with the child's progress reports read from the descriptor
/// `PGTASKD_PROGRESS_FD` names and handed to `progress`, when given (without, the child has
/// no such descriptor). What the pipe holds when the child exits is read too, and the last
/// line without its newline counts.
pub async fn run_reporting(
    spec: &ExecSpec,
    job: &Job,
    payload: &[u8],
    cancel: &CancellationToken,
    progress: Option<&mut Sink>,
) -> Ran {
    if cancel.is_cancelled() {
        return Ran::Canceled;
    }
    let Some(program) = spec.command.first() else {
        return Ran::Failed(later(
            FailureKind::Unreachable,
            "the exec command is empty".into(),
        ));
    };
    let (mut child, mut group) = match child::spawn(spec, job, progress.is_some()) {
        Ok(started) => started,
        Err(error) => {
            return Ran::Failed(later(
                FailureKind::Unreachable,
                format!("cannot start `{program}`: {error}"),
            ))
        }
    };
    let mut pipes = Pipes::new(&mut child, payload, spec.max_output, progress);
    let (status, stop) = supervise(spec, &mut child, &group, &mut pipes, cancel).await;
    group.kill_leftovers();
    pipes.drain();
    answer(spec, program, status, stop, pipes)
}

/// Send `signal` to the child's group and to the child itself: a child that moved itself
/// into another group (its own `setpgid`) is out of the group's reach, never out of this.
fn stop_child(child: &Child, group: &child::Group, signal: libc::c_int) {
    group.signal(signal);
    child.signal(signal);
}

/// Why the daemon stopped the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Timeout,
    Canceled,
    /// stdout went over `max_output`.
    Over,
}

/// Feed and read the child until it exits; stop it on a timeout, a cancel or too much stdout.
/// Returns its exit status and why it was stopped, if it was.
async fn supervise(
    spec: &ExecSpec,
    child: &mut Child,
    group: &child::Group,
    pipes: &mut Pipes<'_>,
    cancel: &CancellationToken,
) -> (io::Result<ExitStatus>, Option<Stop>) {
    let timeout = tokio::time::sleep(spec.timeout);
    let canceled = cancel.cancelled();
    let kill = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timeout, canceled, kill);
    let mut stop = None;
    let mut kill_armed = false;
    loop {
        // Biased: an exit first (the work is done), and the stop conditions before the pipes,
        // which a flooding child keeps ready.
        let stopping = tokio::select! {
            biased;
            status = child.wait() => return (status, stop),
            () = &mut timeout, if stop.is_none() => Stop::Timeout,
            // A cancel also wins over a timeout or an overflow already stopping the child.
            () = &mut canceled, if stop != Some(Stop::Canceled) => Stop::Canceled,
            () = &mut kill, if kill_armed => {
                stop_child(child, group, libc::SIGKILL);
                kill_armed = false;
                continue;
            }
            within = pipes.step() => {
                if within {
                    continue;
                }
                Stop::Over
            }
        };
        pipes.stdin = None;
        match stopping {
            Stop::Over => {
                stop_child(child, group, libc::SIGKILL);
                kill_armed = false;
            }
            // The first stop asks; SIGKILL follows `kill_after` later.
            _ if stop.is_none() => {
                stop_child(child, group, libc::SIGTERM);
                kill.as_mut().reset(after(spec.kill_after));
                kill_armed = true;
            }
            _ => {}
        }
        if stop.is_none() || stopping == Stop::Canceled {
            stop = Some(stopping);
        }
    }
}

/// What the run comes to, once the child has exited and its pipes are read.
fn answer(
    spec: &ExecSpec,
    program: &str,
    status: io::Result<ExitStatus>,
    stop: Option<Stop>,
    pipes: Pipes<'_>,
) -> Ran {
    let Pipes { out, mut err, .. } = pipes;
    let mut failed = |kind: FailureKind, retry: Retry, what: String| {
        Ran::Failed(Failure {
            message: with_stderr(what, &mut err),
            retry,
            kind,
        })
    };
    let later = Retry::Later { after: None };
    let over = || {
        format!(
            "`{program}` wrote more than max_output ({} bytes) to stdout and was killed",
            spec.max_output
        )
    };
    let status = match status {
        Ok(status) => status,
        Err(error) => {
            let what = format!("cannot wait for `{program}` to exit: {error}");
            return failed(FailureKind::Exit, later, what);
        }
    };
    match stop {
        Some(Stop::Canceled) => return Ran::Canceled,
        Some(Stop::Timeout) => {
            let after = humantime::format_duration(spec.timeout);
            return failed(
                FailureKind::Timeout,
                later,
                format!("`{program}` timed out after {after}"),
            );
        }
        Some(Stop::Over) => return failed(FailureKind::Output, later, over()),
        None => {}
    }
    match (status.code(), status.signal()) {
        (Some(0), _) if out.is_over() => failed(FailureKind::Output, later, over()),
        (Some(0), _) => match String::from_utf8(out.into_bytes()) {
            Ok(output) => Ran::Succeeded { output },
            Err(error) => failed(
                FailureKind::Output,
                later,
                format!(
                    "`{program}` exited with status 0 but its stdout is not valid UTF-8 \
                     (byte {} is not)",
                    error.utf8_error().valid_up_to()
                ),
            ),
        },
        (Some(EX_TEMPFAIL), _) => Ran::Snoozed {
            after: snooze_delay(&out.into_bytes()),
        },
        (Some(code), _) => {
            let retry = if code == EX_DATAERR {
                Retry::Never
            } else {
                later
            };
            failed(
                FailureKind::Exit,
                retry,
                format!("`{program}` exited with status {code}"),
            )
        }
        (None, Some(signal)) => {
            let name = child::signal_name(signal)
                .map(|name| format!(" ({name})"))
                .unwrap_or_default();
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            failed(
                FailureKind::Signal,
                later,
                format!("`{program}` was killed by signal {signal}{name}{core}"),
            )
        }
        (None, None) => failed(
            FailureKind::Exit,
            later,
            format!("`{program}` ended: {status}"),
        ),
    }
}

/// `what` followed by stderr's last bytes, when the child wrote any.
fn with_stderr(what: String, err: &mut StderrTail) -> String {
    match err.text() {
        None => what,
        Some((tail, false)) => format!("{what}; stderr: {tail}"),
        Some((tail, true)) => format!("{what}; stderr (last {STDERR_TAIL} bytes): {tail}"),
    }
}

/// The instant `delay` from now (in about 30 years when it is longer than that).
fn after(delay: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(delay.min(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(now)
}

/// A failure worth another attempt, with the queue's backoff.
fn later(kind: FailureKind, message: String) -> Failure {
    Failure {
        message,
        retry: Retry::Later { after: None },
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snooze_delay_is_a_duration_or_seconds_on_the_first_line() {
        let secs = Duration::from_secs;
        assert_eq!(snooze_delay(b"30s\nwhy"), Some(secs(30)));
        assert_eq!(snooze_delay(b"1h 30m"), Some(secs(5400)));
        assert_eq!(snooze_delay(b" 45 \n"), Some(secs(45)));
        assert_eq!(snooze_delay(b"2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(snooze_delay(b"0"), Some(Duration::ZERO));
        assert_eq!(
            snooze_delay(b"100000000000"),
            Some(MAX_SNOOZE),
            "at most a year"
        );
        assert_eq!(snooze_delay(b"999y"), Some(MAX_SNOOZE));
        for none in [&b""[..], b"\n30s", b"soon", b"-5", b"NaN", b"inf", b"\xff"] {
            assert_eq!(
                snooze_delay(none),
                None,
                "{:?}",
                String::from_utf8_lossy(none)
            );
        }
    }
}
