//! Starting an `exec` handler's child in a process group of its own, and signalling that group.
//!
//! The child is started without `fork` (`spawn.rs`). It is the leader of a new session and so
//! of a new group (`setsid()`, which also leaves it no controlling terminal), so one
//! `kill(-pgid, ...)` reaches it and whatever it started that stayed in the group. It is also asked to be SIGKILLed by the kernel when the thread that started
//! it ends (`PR_SET_PDEATHSIG`): a daemon that is SIGKILLed itself leaves no direct child
//! running. The request is per thread, so `super::run` must be awaited on a runtime's worker
//! (which lives as long as the runtime), never inside `spawn_blocking`, whose threads end when
//! idle.

use std::io;

use super::env::child_env;
use super::spawn::{self, Child};
use super::ExecSpec;
use crate::handler::Job;

/// Start `spec.command` for `job` with its three standard streams piped (and, with
/// `progress`, the progress pipe as `PGTASKD_PROGRESS_FD`), in a new process group, as
/// `spec.run_as` when given, with the environment [`child_env`] gives.
///
/// # Errors
///
/// The program cannot be started (missing, not executable...): the OS's error.
pub fn spawn(spec: &ExecSpec, job: &Job, progress: bool) -> io::Result<(Child, Group)> {
    let (program, args) = spec
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the command is empty"))?;
    let run_as = spec.run_as.as_ref();
    let user = run_as.and_then(|run_as| run_as.user.as_ref());
    let progress_fd = progress.then_some(spawn::PROGRESS_FD);
    let env = child_env(std::env::vars_os(), job, user, progress_fd);
    let child = spawn::spawn(program, args, &env, run_as, progress)?;
    let pgid = child.id();
    Ok((child, Group { pgid, live: true }))
}

/// The child's process group, SIGKILLed when dropped unless [`Group::kill_leftovers`] ran.
///
/// Signals go to the group only while its leader (the direct child) is not reaped, or right
/// after, from [`Group::kill_leftovers`]: a group id is not given to a new process while the
/// group has members, so the signal cannot reach a stranger.
#[derive(Debug)]
pub struct Group {
    pgid: libc::pid_t,
    live: bool,
}

impl Group {
    /// Send `signal` to every process of the group (none left is not an error).
    pub fn signal(&self, signal: libc::c_int) {
        if self.live {
            // SAFETY: a plain system call; `-pgid` (pgid > 1) names a process group.
            unsafe {
                libc::kill(-self.pgid, signal);
            }
        }
    }

    /// The direct child has exited: SIGKILL whatever it left in its group, and forget it.
    pub fn kill_leftovers(&mut self) {
        self.signal(libc::SIGKILL);
        self.live = false;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// The name of `signal` (`SIGKILL`), when it has a common one.
pub fn signal_name(signal: libc::c_int) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}
