//! `pgtaskd run` as a child process, for the code that measures or tests the real binary:
//! `pgtaskd bench` runs the daemon under test through it, and the integration tests'
//! `DaemonProcess` wraps it.
//!
//! A [`DaemonCommand`] writes the configuration to a file of its own (removed with the
//! child) and starts `EXE run ARGS --config FILE` (or `EXE run ARGS`, with no file, the
//! settings from the environment and the flags); the [`DaemonChild`] it returns holds the
//! process, every line the daemon wrote to its standard error, and its exit status once it
//! has exited. Dropping the child kills it, and the child is sent SIGTERM by the kernel when
//! the thread that started it ends (`PR_SET_PDEATHSIG`), so a killed bench or test process
//! leaves no daemon running.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
#[cfg(any(target_os = "linux", target_os = "android"))]
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// How often [`DaemonChild::wait_timeout`] looks at the process.
const POLL: Duration = Duration::from_millis(20);

/// How to start `pgtaskd run`.
pub struct DaemonCommand {
    command: Command,
    args: Vec<std::ffi::OsString>,
    /// `None`: no `--config`, the settings come from the environment and the flags.
    config: Option<ConfigFile>,
    /// Descriptors handed to the daemon, not close-on-exec: (a copy held here, its number in
    /// the daemon).
    inherited: Vec<(OwnedFd, RawFd)>,
}

impl DaemonCommand {
    /// `exe run --config FILE`, where FILE holds `config_toml`.
    ///
    /// # Errors
    ///
    /// The configuration file cannot be written.
    pub fn new(exe: impl AsRef<OsStr>, config_toml: &str) -> std::io::Result<DaemonCommand> {
        Ok(DaemonCommand {
            command: Command::new(exe),
            args: Vec::new(),
            config: Some(ConfigFile::write(config_toml)?),
            inherited: Vec::new(),
        })
    }

    /// `exe run` without `--config`: the settings come from the environment (which should
    /// not name a file in `PGTASKD_CONFIG`) and the flags.
    pub fn without_file(exe: impl AsRef<OsStr>) -> DaemonCommand {
        DaemonCommand {
            command: Command::new(exe),
            args: Vec::new(),
            config: None,
            inherited: Vec::new(),
        }
    }

    /// Arguments for `run`, before `--config` when there is one.
    pub fn args<I, S>(&mut self, args: I) -> &mut DaemonCommand
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Set an environment variable of the child.
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut DaemonCommand {
        self.command.env(key, value);
        self
    }

    /// Run the daemon as `uid` and `gid`, with no supplementary group (from a root process).
    pub fn user(&mut self, uid: u32, gid: u32) -> &mut DaemonCommand {
        self.command.uid(uid).gid(gid);
        self
    }

    /// Hand the daemon `fd` as its descriptor `number`, not close-on-exec: what a starting
    /// shell or socket activation leaves a process.
    ///
    /// # Errors
    ///
    /// `fd` cannot be copied.
    pub fn inherit(&mut self, fd: impl AsFd, number: RawFd) -> std::io::Result<&mut DaemonCommand> {
        // A copy above every number a test names, so that no copy is overwritten by the
        // placing of another.
        // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor, owned here alone.
        let copy = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 1000) };
        if copy < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: just opened, owned by nobody else.
        self.inherited
            .push((unsafe { OwnedFd::from_raw_fd(copy) }, number));
        Ok(self)
    }

    /// Remove an environment variable the child would inherit.
    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut DaemonCommand {
        self.command.env_remove(key);
        self
    }

    /// Start the daemon, with its standard error read line by line into its log.
    ///
    /// # Errors
    ///
    /// The process cannot be started.
    pub fn spawn(mut self) -> std::io::Result<DaemonChild> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            let parent = std::process::id() as libc::pid_t;
            let inherited: Vec<(RawFd, RawFd)> = self
                .inherited
                .iter()
                .map(|(fd, number)| (fd.as_raw_fd(), *number))
                .collect();
            self.command.pre_exec(move || {
                // dup2 leaves the new descriptor open across the exec.
                for (fd, number) in &inherited {
                    if libc::dup2(*fd, *number) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // The daemon is told to stop (SIGTERM: a graceful drain) when the thread that
                // started it ends, so that a bench or test killed without its clean-up leaves
                // no daemon behind. Callers start it from a thread that lives as long as they
                // need it (a runtime's worker, a test's thread), never from a blocking-pool
                // thread, which may end while idle.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                // The parent died before the request took effect: nobody would signal.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        self.command.arg("run").args(&self.args);
        if let Some(config) = &self.config {
            self.command.arg("--config").arg(config.path());
        }
        let mut child = self
            .command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, lines) = watch::channel(0);
        std::thread::spawn({
            let log = Arc::clone(&log);
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut log = log.lock().expect("daemon log poisoned");
                    log.push(line);
                    let _ = tx.send(log.len());
                }
            }
        });
        Ok(DaemonChild {
            child,
            log,
            lines,
            _config: self.config,
        })
    }
}

/// A running (or exited) `pgtaskd run`.
pub struct DaemonChild {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    /// How many lines the log holds; closed once the daemon's standard error is.
    lines: watch::Receiver<usize>,
    _config: Option<ConfigFile>,
}

impl DaemonChild {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child; kill has no memory effects.
        unsafe {
            libc::kill(self.pid() as i32, signal);
        }
    }

    /// Everything logged so far, one line each.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().expect("daemon log poisoned").clone()
    }

    /// Call `found` on the whole log now and after every new line, until it returns
    /// something; `None` if the daemon's standard error closed first. No deadline of its
    /// own: callers put one around it.
    pub async fn wait_for_log<T>(
        &self,
        mut found: impl FnMut(&[String]) -> Option<T>,
    ) -> Option<T> {
        let mut lines = self.lines.clone();
        loop {
            if let Some(value) = found(&self.log.lock().expect("daemon log poisoned")) {
                return Some(value);
            }
            if lines.changed().await.is_err() {
                return found(&self.log.lock().expect("daemon log poisoned"));
            }
        }
    }

    /// The exit status, if the process has exited.
    ///
    /// # Errors
    ///
    /// The status cannot be read.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Wait up to `limit` for the process to exit; `None` if it still runs.
    ///
    /// # Errors
    ///
    /// The status cannot be read.
    pub async fn wait_timeout(&mut self, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for DaemonChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon's configuration file, removed when dropped.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn write(contents: &str) -> std::io::Result<ConfigFile> {
        let path = std::env::temp_dir().join(format!(
            "pgtaskd-run-{}-{:016x}.toml",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::write(&path, contents)?;
        Ok(ConfigFile(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
