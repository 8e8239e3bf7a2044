//! Running the daemon in tests: in-process (with a test analyzer and a shutdown trigger) or
//! as the real `pgtaskd` binary (with real signals) through [`pgtaskd::process`], the same
//! child-process harness that `pgtaskd bench` uses.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;

use pgtaskd::analyzer::Analyzer;
use pgtaskd::config::Config;
use pgtaskd::daemon::{self, RunOptions};
use pgtaskd::process::{DaemonChild, DaemonCommand};
use pgtaskd::shutdown::Shutdown;
use tokio::task::JoinHandle;

use super::{within, TestDb, WAIT};

/// `pgtaskd run` inside the test process.
pub struct InProcessDaemon {
    pub shutdown: Shutdown,
    handle: Option<JoinHandle<Result<(), pgtaskd::daemon::DaemonError>>>,
}

impl InProcessDaemon {
    /// Start a daemon on `config` with `analyzer`, and wait until it listens (its first
    /// scan follows at once).
    pub async fn start(db: &TestDb, config: Config, analyzer: Arc<dyn Analyzer>) -> Self {
        let shutdown = Shutdown::new();
        let handle = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { daemon::run(&config, analyzer, shutdown, RunOptions::default()).await }
        });
        wait_listening(db, 1).await;
        InProcessDaemon {
            shutdown,
            handle: Some(handle),
        }
    }

    /// Trigger a shutdown (as a signal would) and wait for `run` to return.
    pub async fn stop(mut self) {
        self.shutdown.trigger();
        self.join().await;
    }

    /// Wait for `run` to return after a shutdown was triggered.
    pub async fn join(&mut self) {
        let handle = self.handle.take().expect("joined once");
        within(WAIT, "the daemon to stop", handle)
            .await
            .expect("the daemon task did not panic")
            .expect("the daemon ran without error");
    }

    /// Wait for `run` to return after a shutdown was triggered, and give its result.
    pub async fn join_result(&mut self) -> Result<(), pgtaskd::daemon::DaemonError> {
        let handle = self.handle.take().expect("joined once");
        within(WAIT, "the daemon to stop", handle)
            .await
            .expect("the daemon task did not panic")
    }

    /// Whether `run` has returned.
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.abort();
        }
    }
}

/// Wait until `n` pgtaskd sessions on `db` are listening (their LISTEN was issued).
pub async fn wait_listening(db: &TestDb, n: i64) {
    let client = db.client().await;
    super::eventually(WAIT, "the daemon's listener", || {
        let client = &client;
        async move {
            let row = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database()
                        AND application_name LIKE 'pgtaskd/%'
                        AND query LIKE 'LISTEN%'",
                    &[],
                )
                .await
                .ok()?;
            (row.get::<_, i64>(0) >= n).then_some(())
        }
    })
    .await;
}

/// The path of the `pgtaskd` binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pgtaskd"))
}

/// Run `pgtaskd ARGS` to completion against `url`, returning (status, stdout, stderr).
pub async fn pgtaskd(url: Option<&str>, args: &[&str]) -> (ExitStatus, String, String) {
    let mut command = tokio::process::Command::new(binary());
    command.args(args).env_remove("PGTASKD_CONFIG");
    if let Some(url) = url {
        command.env("PGTASKD_DATABASE_URL", url);
    }
    let output = within(WAIT, &format!("pgtaskd {args:?}"), command.output())
        .await
        .expect("pgtaskd runs");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `pgtaskd run` as a process of its own, with its log captured: [`DaemonChild`] with the
/// tests' deadlines, failing the test with the daemon's log when one passes.
pub struct DaemonProcess {
    child: DaemonChild,
}

impl DaemonProcess {
    /// Start `pgtaskd run ARGS` on `db` with `config_toml` as its configuration file.
    pub fn start(db: &TestDb, config_toml: &str, args: &[&str]) -> DaemonProcess {
        DaemonProcess::start_url(&db.url, config_toml, args)
    }

    /// Start `pgtaskd run ARGS` on the database at `url`.
    pub fn start_url(url: &str, config_toml: &str, args: &[&str]) -> DaemonProcess {
        DaemonProcess::start_with_env(url, config_toml, args, &[])
    }

    /// The command [`DaemonProcess::start_url`] runs, for a test to change (its user, the
    /// descriptors it inherits) before [`DaemonProcess::spawn`].
    pub fn command(url: &str, config_toml: &str) -> DaemonCommand {
        let mut command =
            DaemonCommand::new(binary(), config_toml).expect("write the daemon's configuration");
        command
            .env("PGTASKD_DATABASE_URL", url)
            .env("RUST_LOG", "pgtaskd=debug");
        command
    }

    /// Start `command`.
    pub fn spawn(command: DaemonCommand) -> DaemonProcess {
        DaemonProcess {
            child: command.spawn().expect("pgtaskd starts"),
        }
    }

    /// Start `pgtaskd run ARGS` on the database at `url` with extra environment variables.
    pub fn start_with_env(
        url: &str,
        config_toml: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> DaemonProcess {
        let mut command =
            DaemonCommand::new(binary(), config_toml).expect("write the daemon's configuration");
        command
            .args(args)
            .env("PGTASKD_DATABASE_URL", url)
            .env("RUST_LOG", "pgtaskd=debug");
        // After the defaults: a test's own `RUST_LOG` wins.
        for (key, value) in env {
            command.env(key, value);
        }
        DaemonProcess {
            child: command.spawn().expect("pgtaskd starts"),
        }
    }

    /// Start `pgtaskd run ARGS` on the database at `url` without a configuration file: every
    /// setting from `env` (`PGTASKD_<SECTION>_<KEY>`) and the flags in `args`.
    pub fn start_without_file(url: &str, args: &[&str], env: &[(&str, &str)]) -> DaemonProcess {
        let mut command = DaemonCommand::without_file(binary());
        command
            .args(args)
            .env_remove("PGTASKD_CONFIG")
            .env("PGTASKD_DATABASE_URL", url)
            .env("RUST_LOG", "pgtaskd=debug");
        for (key, value) in env {
            command.env(key, value);
        }
        DaemonProcess {
            child: command.spawn().expect("pgtaskd starts"),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.pid() as i32
    }

    /// Wait until a log line contains `needle`.
    pub async fn wait_for_log(&mut self, needle: &str) {
        let found = within(
            WAIT,
            &format!("log line {needle:?}"),
            self.child
                .wait_for_log(|lines| lines.iter().any(|l| l.contains(needle)).then_some(())),
        )
        .await;
        assert!(
            found.is_some(),
            "the daemon ended without logging {needle:?}:\n{}",
            self.log_text()
        );
    }

    /// The address the HTTP server bound (`http.listen` may name port 0), once it logged it.
    pub async fn http_addr(&mut self) -> String {
        self.wait_for_log("HTTP server listening").await;
        let log = self.log_text();
        log.lines()
            .find(|l| l.contains("HTTP server listening"))
            .and_then(|l| l.split("addr=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no addr= in the listening line:\n{log}"))
            .to_string()
    }

    /// Everything logged so far.
    pub fn log_text(&self) -> String {
        self.child.log_lines().join("\n")
    }

    /// Send `signal` to the process.
    pub fn signal(&self, signal: i32) {
        self.child.signal(signal);
    }

    /// Wait for the process to exit.
    pub async fn wait(&mut self) -> ExitStatus {
        let status = self
            .child
            .wait_timeout(WAIT)
            .await
            .expect("wait for pgtaskd");
        status
            .unwrap_or_else(|| panic!("pgtaskd did not exit within {WAIT:?}:\n{}", self.log_text()))
    }

    /// Stop the daemon with SIGTERM, and check that it exits 0 (its log otherwise).
    pub async fn stop_cleanly(&mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait().await;
        assert_eq!(status.code(), Some(0), "{}", self.log_text());
    }
}

/// A file that is removed when dropped.
pub mod tempfile_path {
    use std::path::{Path, PathBuf};

    pub struct TempPath(PathBuf);

    impl TempPath {
        pub fn write(contents: &str) -> TempPath {
            let path = std::env::temp_dir().join(format!(
                "pgtaskd-test-config-{}-{}.toml",
                std::process::id(),
                fastrand::u64(..)
            ));
            std::fs::write(&path, contents).expect("write a temporary file");
            TempPath(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
