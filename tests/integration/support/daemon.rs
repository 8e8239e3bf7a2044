//! Running the daemon in tests: in-process (with a test analyzer and a shutdown trigger) or
//! as the real `pgtaskd` binary (with real signals).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgtaskd::analyzer::Analyzer;
use pgtaskd::config::Config;
use pgtaskd::daemon::{self, RunOptions};
use pgtaskd::shutdown::Shutdown;
use tokio::sync::watch;
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

/// `pgtaskd run` as a process of its own, with its log captured.
pub struct DaemonProcess {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    lines: watch::Receiver<usize>,
    _config: Option<tempfile_path::TempPath>,
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

    /// Start `pgtaskd run ARGS` on the database at `url` with extra environment variables.
    pub fn start_with_env(
        url: &str,
        config_toml: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> DaemonProcess {
        let config = tempfile_path::TempPath::write(config_toml);
        let mut child = Command::new(binary())
            .envs(env.iter().copied())
            .arg("run")
            .args(args)
            .arg("--config")
            .arg(config.path())
            .env("PGTASKD_DATABASE_URL", url)
            .env("RUST_LOG", "pgtaskd=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pgtaskd starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, lines) = watch::channel(0);
        std::thread::spawn({
            let log = Arc::clone(&log);
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut log = log.lock().unwrap();
                    log.push(line);
                    let _ = tx.send(log.len());
                }
            }
        });
        DaemonProcess {
            child,
            log,
            lines,
            _config: Some(config),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Wait until a log line contains `needle`.
    pub async fn wait_for_log(&mut self, needle: &str) {
        let log = Arc::clone(&self.log);
        let found = within(WAIT, &format!("log line {needle:?}"), async {
            loop {
                if log.lock().unwrap().iter().any(|l| l.contains(needle)) {
                    return true;
                }
                if self.lines.changed().await.is_err() {
                    return log.lock().unwrap().iter().any(|l| l.contains(needle));
                }
            }
        })
        .await;
        assert!(
            found,
            "the daemon ended without logging {needle:?}:\n{}",
            self.log_text()
        );
    }

    /// Everything logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Send `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }

    /// Wait for the process to exit.
    pub async fn wait(&mut self) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for pgtaskd") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pgtaskd did not exit within {WAIT:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
