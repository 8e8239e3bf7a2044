//! Starting a child without `fork`: `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does, with
//! the steps the exec handler needs between the clone and the `exec`, which `posix_spawn`
//! cannot take (`PR_SET_PDEATHSIG`), and the async child that results ([`Child`]).
//!
//! `fork` copies the daemon's page tables for every child, and the daemon then takes a
//! copy-on-write fault for each page it writes: that, not the child, was most of what a task
//! cost the daemon. With `CLONE_VM` the child runs in the daemon's memory, on a stack of its
//! own, while the thread that cloned it waits (`CLONE_VFORK`) until it has called `exec` or
//! exited; nothing is copied. Such a child must not touch what the daemon's other threads use
//! (no allocation, no lock, no `std`): it makes system calls alone, on data prepared before the
//! clone, and reports a failure by writing the error number into that data before `_exit`.
//!
//! The child, in order: every signal with a handler back to its default (the handlers are the
//! daemon's, and would run in its memory), SIGPIPE too (the daemon ignores it; a command
//! expects the default, as `std` gives it); `setsid()` (a session and a process group of its
//! own, no controlling terminal); the three pipes as its standard
//! streams, and, when asked, the write end of the progress pipe as descriptor
//! [`PROGRESS_FD`]; every other descriptor closed (`close_range(3, ~0, 0)`, from 4 with the
//! progress pipe, a loop of `close` on a kernel without it), those the daemon inherited from
//! whatever started it included, which are not close-on-exec; the queue's credentials when it has `user` or `group` (raw
//! `setgroups`, `setresgid`, then `setresuid`: glibc's wrappers would signal every thread of
//! the process to change theirs, and the child shares the daemon's memory and its signal
//! handlers' state); `PR_SET_PDEATHSIG` (SIGKILL; after the switch, which clears it), then
//! leaving at once if the daemon already died;
//! the daemon's signal mask back (every signal is blocked across the clone); `execve` of each
//! candidate path in turn (a bare name is looked up on the child's `PATH`, as `execvp` does),
//! and, as `execvp` does too, of `/bin/sh` with the candidate and the arguments when the
//! kernel cannot run the candidate itself (`ENOEXEC`: a script with no `#!` line).
//!
//! The child is reaped through SIGCHLD (tokio's signal stream, registered before the clone, so
//! no exit is missed), with `waitpid` on its own pid alone. A child dropped before it was
//! reaped is SIGKILLed and reaped later, by the next [`spawn`].

use std::ffi::{CString, OsString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::ptr;
use std::sync::Mutex;

use libc::{c_char, c_int, c_void};
use tokio::net::unix::pipe;
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::argv::{c_string, candidates, null_terminated, shell_argv, SHELL};
use crate::privileges::RunAs;

/// The child's stack until its `exec`: it makes a few system calls, on a few hundred bytes.
const STACK: usize = 64 * 1024;

/// The descriptor a child reads its progress pipe's write end on, when it has one
/// (`PGTASKD_PROGRESS_FD`): the first after the standard streams.
pub const PROGRESS_FD: c_int = 3;

/// The lowest descriptor the daemon keeps the child's end of the progress pipe on until the
/// clone, above the standard streams and [`PROGRESS_FD`], so that the child's `dup2` of its
/// standard streams cannot overwrite it.
const PROGRESS_FD_FROM: c_int = 10;

/// Children dropped before they were reaped (SIGKILLed already): reaped by the next spawn.
static ORPHANS: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// A started child: its three pipes and the progress pipe's read end, if asked for (the
/// daemon's ends, non-blocking and close-on-exec), and its exit.
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
    exits: Signal,
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    pub progress: Option<pipe::Receiver>,
}

/// Start `program` with `args` and the environment `env`, its standard streams piped and no
/// other descriptor open (but, with `progress`, the write end of a fourth pipe as
/// [`PROGRESS_FD`]), with the credentials of `run_as` if given, leading a new process
/// group, SIGKILLed by the kernel when the calling thread ends. Call it on a runtime's thread
/// (the pipes and the SIGCHLD stream are the runtime's).
///
/// # Errors
///
/// A NUL byte in an argument or the environment; the pipes, the stack or the clone failing;
/// a step of the child failing, the `execve` above all (no such program, not executable...),
/// or the switch of credentials (`EPERM`): the OS's error.
pub fn spawn(
    program: &str,
    args: &[String],
    env: &[(OsString, OsString)],
    run_as: Option<&RunAs>,
    progress: bool,
) -> io::Result<Child> {
    reap_orphans();
    // Before the child exists, so that its exit cannot come before the stream.
    let exits = signal(SignalKind::child())?;
    let argv: Vec<CString> = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .map(|arg| c_string(arg.as_bytes().to_vec()))
        .collect::<io::Result<_>>()?;
    let envp: Vec<CString> = env
        .iter()
        .map(|(name, value)| {
            let mut pair = Vec::with_capacity(name.len() + value.len() + 1);
            pair.extend_from_slice(name.as_bytes());
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            c_string(pair)
        })
        .collect::<io::Result<_>>()?;
    let paths = candidates(program, env)?;
    let argv_ptrs = null_terminated(&argv);
    let envp_ptrs = null_terminated(&envp);
    let path_ptrs: Vec<*const c_char> = paths.iter().map(|path| path.as_ptr()).collect();
    let mut shell_argv_ptrs = shell_argv(&argv_ptrs);
    let (stdin_child, stdin) = pipe_pair()?;
    let (stdout, stdout_child) = pipe_pair()?;
    let (stderr, stderr_child) = pipe_pair()?;
    let progress_pipe = match progress {
        true => {
            let (read, write) = pipe_pair()?;
            Some((read, above(write, PROGRESS_FD_FROM)?))
        }
        false => None,
    };
    let mut stack: Box<[MaybeUninit<u128>]> = Box::new_uninit_slice(STACK / 16);
    let mut shared = Shared {
        paths: path_ptrs.as_ptr(),
        paths_len: path_ptrs.len(),
        argv: argv_ptrs.as_ptr(),
        shell_argv: shell_argv_ptrs.as_mut_ptr(),
        envp: envp_ptrs.as_ptr(),
        fds: [
            stdin_child.as_raw_fd(),
            stdout_child.as_raw_fd(),
            stderr_child.as_raw_fd(),
        ],
        progress: progress_pipe
            .as_ref()
            .map_or(-1, |(_, write)| write.as_raw_fd()),
        last_fd: last_fd(),
        switch: run_as.is_some(),
        uid: run_as.and_then(|run_as| run_as.user.as_ref().map(|user| user.uid)),
        gid: run_as.map_or(0, |run_as| run_as.gid),
        groups: run_as.map_or(ptr::null(), |run_as| run_as.groups.as_ptr()),
        groups_len: run_as.map_or(0, |run_as| run_as.groups.len()),
        parent: std::process::id() as libc::pid_t,
        last_signal: libc::SIGRTMAX(),
        mask: empty_sigset(),
        error: 0,
    };
    // SAFETY: `shared` and everything it points to (argv, the shell's argv, envp, paths, fds,
    // groups) outlive the clone: the calling thread is suspended until the child has called `execve`
    // or exited (CLONE_VFORK), and the child's stack is this thread's allocation, freed after.
    // The child runs `child` alone, which makes system calls only and writes nothing but the
    // shell's argv slot and `error`. Every signal is blocked around the clone so that no
    // handler of the daemon's runs in the child.
    let pid = unsafe {
        let mut all = empty_sigset();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut shared.mask);
        let top = stack.as_mut_ptr().add(stack.len()).cast::<c_void>();
        let pid = libc::clone(
            child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            ptr::addr_of_mut!(shared).cast::<c_void>(),
        );
        let cloned = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &shared.mask, ptr::null_mut());
        if pid < 0 {
            return Err(cloned);
        }
        pid
    };
    drop(stack);
    drop((stdin_child, stdout_child, stderr_child));
    let progress_read = progress_pipe.map(|(read, _write)| read);
    // SAFETY: the child wrote it, if at all, before it exited; it has exited or exec'd now.
    let error = unsafe { ptr::read_volatile(ptr::addr_of!(shared.error)) };
    if error != 0 {
        // It exited (status 127) after writing its error: reap it now.
        let _ = wait_blocking(pid);
        return Err(io::Error::from_raw_os_error(error));
    }
    let mut started = Child {
        pid,
        status: None,
        exits,
        stdin: None,
        stdout: None,
        stderr: None,
        progress: None,
    };
    started.stdin = Some(pipe::Sender::from_owned_fd_unchecked(non_blocking(stdin)?)?);
    started.stdout = Some(pipe::Receiver::from_owned_fd_unchecked(non_blocking(
        stdout,
    )?)?);
    started.stderr = Some(pipe::Receiver::from_owned_fd_unchecked(non_blocking(
        stderr,
    )?)?);
    if let Some(read) = progress_read {
        started.progress = Some(pipe::Receiver::from_owned_fd_unchecked(non_blocking(
            read,
        )?)?);
    }
    Ok(started)
}

impl Child {
    /// The child's process id (its group's id too), until it is reaped.
    pub fn id(&self) -> libc::pid_t {
        self.pid
    }

    /// Send `signal` to the child itself, unless it was reaped (its pid may then be
    /// another's). The group's signal misses a child that left its group (`setpgid` into
    /// another group of its session): this one does not.
    pub fn signal(&self, signal: libc::c_int) {
        if self.status.is_none() {
            // SAFETY: a plain system call on our own unreaped child.
            unsafe {
                libc::kill(self.pid, signal);
            }
        }
    }

    /// Wait for the child to exit and reap it. Cancel-safe: nothing is lost when dropped
    /// unfinished.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if self.exits.recv().await.is_none() {
                return Err(io::Error::other("the SIGCHLD stream ended"));
            }
        }
    }

    /// The exit status, reaping the child, if it has exited.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = try_wait(self.pid)?;
        }
        Ok(self.status)
    }
}

impl Drop for Child {
    /// A child not reaped yet is SIGKILLed, and reaped now or by the next spawn.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: a plain system call on our own unreaped child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
        }
        if !matches!(try_wait(self.pid), Ok(Some(_))) {
            ORPHANS
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(self.pid);
        }
    }
}

/// What the child reads, all prepared before the clone; `error` is what it writes.
struct Shared {
    paths: *const *const c_char,
    paths_len: usize,
    argv: *const *const c_char,
    /// The argv for [`SHELL`] ([`shell_argv`]), whose slot 1 the child sets to the candidate.
    shell_argv: *mut *const c_char,
    envp: *const *const c_char,
    /// The child's ends of the pipes: its stdin, stdout and stderr to be.
    fds: [c_int; 3],
    /// The write end of the progress pipe, at or above [`PROGRESS_FD_FROM`], to be
    /// [`PROGRESS_FD`]; -1 without.
    progress: c_int,
    /// Above the highest descriptor that may be open: where the loop of `close` stops when
    /// the kernel has no `close_range`.
    last_fd: c_int,
    /// Whether the credentials below are taken (`user` or `group` given).
    switch: bool,
    /// The uid taken, when `user` is given.
    uid: Option<libc::uid_t>,
    gid: libc::gid_t,
    /// The supplementary groups: `groups_len` ids.
    groups: *const libc::gid_t,
    groups_len: usize,
    parent: libc::pid_t,
    /// The highest signal number.
    last_signal: c_int,
    /// The signal mask of the thread that clones, restored in the child before `execve`.
    mask: libc::sigset_t,
    /// The error number of the step that failed, 0 while none did.
    error: c_int,
}

/// The child, from the clone to the `execve`: system calls only, on `Shared`.
extern "C" fn child(shared: *mut c_void) -> c_int {
    // SAFETY: `spawn` passes its `Shared`, alive until this child has exec'd or exited; the
    // calls are async-signal-safe system calls on prepared, NUL-terminated data.
    unsafe {
        let shared = &mut *shared.cast::<Shared>();
        let mut action: libc::sigaction = std::mem::zeroed();
        for signal in 1..=shared.last_signal {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            // The numbers glibc keeps for itself are refused: nothing to do for them.
            if libc::sigaction(signal, ptr::null(), &mut action) != 0 {
                continue;
            }
            let handler = action.sa_sigaction;
            let to_default =
                handler != libc::SIG_DFL && (handler != libc::SIG_IGN || signal == libc::SIGPIPE);
            if to_default {
                action.sa_sigaction = libc::SIG_DFL;
                action.sa_flags = 0;
                if libc::sigaction(signal, &action, ptr::null_mut()) != 0 {
                    fail(shared);
                }
            }
        }
        // A session of its own, and so a process group of its own (its id is the child's):
        // no controlling terminal, so that a command cannot open the terminal that started
        // the daemon (`/dev/tty`) and type into it (`TIOCSTI`) as the operator's shell.
        if libc::setsid() < 0 {
            fail(shared);
        }
        for (target, fd) in shared.fds.into_iter().enumerate() {
            let target = target as c_int;
            let done = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            };
            if done < 0 {
                fail(shared);
            }
        }
        // The progress pipe's write end, above the standard streams' targets (so untouched by
        // their `dup2`), at its number; `dup2` leaves the copy without close-on-exec.
        let mut first_closed: c_int = 3;
        if shared.progress >= 0 {
            if libc::dup2(shared.progress, PROGRESS_FD) < 0 {
                fail(shared);
            }
            first_closed = PROGRESS_FD + 1;
        }
        // Nothing of the daemon's but the three streams (and the progress pipe): the
        // descriptors it inherited are not close-on-exec (a pipe or a socket of whatever
        // started it).
        let high = libc::c_uint::MAX;
        if libc::syscall(
            libc::SYS_close_range,
            first_closed as libc::c_uint,
            high,
            0 as libc::c_uint,
        ) != 0
        {
            if errno() != libc::ENOSYS {
                fail(shared);
            }
            for fd in first_closed..shared.last_fd {
                libc::close(fd);
            }
        }
        // Raw system calls: glibc's `setgroups`, `setresgid` and `setresuid` change every
        // thread of the process, by a signal to each, and this child shares the daemon's
        // memory. Groups first, while the uid may still change them; the uid last.
        if shared.switch {
            let gid = shared.gid;
            if libc::syscall(libc::SYS_setgroups, shared.groups_len, shared.groups) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
            {
                fail(shared);
            }
            if let Some(uid) = shared.uid {
                if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
                    fail(shared);
                }
            }
        }
        // After the switch, which clears it.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            fail(shared);
        }
        // The daemon died before the request took effect: nobody would signal.
        if libc::getppid() != shared.parent {
            libc::_exit(1);
        }
        if libc::pthread_sigmask(libc::SIG_SETMASK, &shared.mask, ptr::null_mut()) != 0 {
            fail(shared);
        }
        // As execvp: a path not found, or not a directory, moves on to the next; a path that
        // is not executable too, but is the error if none is found. A file the kernel cannot
        // run (a script with no `#!` line) is run with the shell; if the shell cannot be
        // started either, the file's error is the answer.
        let mut denied = false;
        for i in 0..shared.paths_len {
            let path = *shared.paths.add(i);
            libc::execve(path, shared.argv, shared.envp);
            match errno() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => denied = true,
                libc::ENOEXEC => {
                    *shared.shell_argv.add(1) = path;
                    libc::execve(SHELL.as_ptr(), shared.shell_argv, shared.envp);
                    *libc::__errno_location() = libc::ENOEXEC;
                    fail(shared)
                }
                _ => fail(shared),
            }
        }
        let error = if denied { libc::EACCES } else { libc::ENOENT };
        *libc::__errno_location() = error;
        fail(shared)
    }
}

/// The child's way out when a step failed: the error number for the daemon, then exit 127.
///
/// # Safety
///
/// Only in the child, on the `Shared` it was given.
unsafe fn fail(shared: &mut Shared) -> ! {
    ptr::write_volatile(ptr::addr_of_mut!(shared.error), errno().max(1));
    libc::_exit(127)
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno, a valid pointer.
    unsafe { *libc::__errno_location() }
}

/// One past the highest descriptor the process may hold (`RLIMIT_NOFILE`'s soft limit, at
/// most 2^20): the end of the child's loop of `close` on a kernel without `close_range`.
fn last_fd() -> c_int {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit it is given room for.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if got != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return 1 << 20;
    }
    limit.rlim_cur.min(1 << 20) as c_int
}

/// A pipe, both ends closed on `exec`: (read end, write end).
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just opened, and are owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A copy of `fd` at `from` or above, close-on-exec; `fd` is closed.
fn above(fd: OwnedFd, from: c_int) -> io::Result<OwnedFd> {
    // SAFETY: a plain fcntl on an open descriptor; the copy is owned here alone.
    unsafe {
        let copy = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, from);
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(copy))
    }
}

/// `fd` set non-blocking (the daemon's end of a pipe; the child's stays blocking).
fn non_blocking(fd: OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: plain fcntl calls on an open descriptor.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

fn empty_sigset() -> libc::sigset_t {
    // SAFETY: sigemptyset initializes the set it is given.
    unsafe {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        set.assume_init()
    }
}

/// Reap `pid` if it has exited, without waiting.
fn try_wait(pid: libc::pid_t) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: a plain system call on our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if reaped == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if reaped == 0 {
            return Ok(None);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Reap `pid`, which has exited already.
fn wait_blocking(pid: libc::pid_t) -> io::Result<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: a plain system call on our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, 0) };
        if reaped == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Reap the dropped children that have exited since.
fn reap_orphans() {
    let mut orphans = ORPHANS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    orphans.retain(|pid| matches!(try_wait(*pid), Ok(None)));
}
