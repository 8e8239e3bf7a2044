//! The daemon under test: `pgtaskd run` as a child process of the bench (through
//! [`crate::process`]), configured for one run's queue and concurrency. Owns what the bench
//! asks of it: when its listener is in place, its CPU and memory use, the analyzer start of a
//! task as its log tells it (latency mode), and the clean stop. Called by [`super::run`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::proc::{self, Usage};
use super::sql;
use super::{BenchError, IDLE_SAMPLE, POLL, RUN_LIMIT};
use crate::config::Config;
use crate::events;
use crate::process::{DaemonChild, DaemonCommand};

/// The longest the bench waits for the log line of one task's analyzer start.
const START_WAIT: Duration = Duration::from_secs(5);
/// The longest a stopping daemon is given to exit cleanly.
const STOP_WAIT: Duration = Duration::from_secs(60);

pub(super) struct Daemon {
    child: DaemonChild,
}

/// The daemon's [`events::ANALYZER_RUN`] event, as its JSON log line carries it.
#[derive(serde::Deserialize)]
struct LogLine {
    timestamp: chrono::DateTime<chrono::Utc>,
    fields: LogFields,
}

#[derive(serde::Deserialize)]
struct LogFields {
    message: String,
    id: Option<i64>,
}

impl Daemon {
    /// Start the daemon on `queue`; with `trace_starts`, it logs the analyzer start of every
    /// task, as JSON, for [`AnalyzerStarts`].
    pub(super) fn start(
        config: &Config,
        queue: &str,
        concurrency: usize,
        trace_starts: bool,
    ) -> Result<Daemon, BenchError> {
        Daemon::start_with(config, queue, concurrency, trace_starts, "")
    }

    /// [`Daemon::start`], with `extra_toml` (whole sections) added to its configuration.
    pub(super) fn start_with(
        config: &Config,
        queue: &str,
        concurrency: usize,
        trace_starts: bool,
        extra_toml: &str,
    ) -> Result<Daemon, BenchError> {
        let mut toml = String::new();
        if let Some(url) = &config.database.url {
            toml.push_str(&format!("[database]\nurl = {}\n", toml_string(url)));
        }
        let log = if trace_starts {
            "level = \"warn,pgtaskd::worker::execute=debug\"\nformat = \"json\""
        } else {
            "level = \"warn\""
        };
        toml.push_str(&format!(
            "[worker]\nconcurrency = {concurrency}\nqueues = [{}]\n[log]\n{log}\n",
            toml_string(queue)
        ));
        toml.push_str(extra_toml);
        let exe = std::env::current_exe().map_err(|err| BenchError::Daemon(err.to_string()))?;
        // The daemon's log is captured, never shown: it would interleave with the report.
        let mut command =
            DaemonCommand::new(exe, &toml).map_err(|err| BenchError::Daemon(err.to_string()))?;
        command.env_remove("RUST_LOG");
        // The file above is the daemon's whole configuration: a PGTASKD_<SECTION>_<KEY> of
        // the bench's environment would win over it (the concurrency, the queue, the log).
        for key in crate::config::KEYS {
            command.env_remove(key.env_name());
        }
        let child = command
            .spawn()
            .map_err(|err| BenchError::Daemon(err.to_string()))?;
        Ok(Daemon { child })
    }

    /// Wait until this daemon's listener session is in place.
    pub(super) async fn wait_listening(&self, client: &Client) -> Result<(), BenchError> {
        let pattern = format!("pgtaskd/%:{}:%", self.child.pid());
        let deadline = Instant::now() + RUN_LIMIT;
        loop {
            let n: i64 = client
                .query_one(sql::DAEMON_LISTENING, &[&pattern])
                .await?
                .get(0);
            if n > 0 {
                // The first scan follows the LISTEN at once; give it its moment.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::TooLong(RUN_LIMIT));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// CPU seconds per second used while idle, over [`IDLE_SAMPLE`].
    pub(super) async fn idle_cpu(&self) -> f64 {
        let before = self.usage().cpu_s;
        tokio::time::sleep(IDLE_SAMPLE).await;
        (self.usage().cpu_s - before) / IDLE_SAMPLE.as_secs_f64()
    }

    /// CPU seconds used so far by the server backends of its sessions (those open now), when
    /// the server runs on this machine.
    pub(super) async fn server_cpu_s(&self, client: &Client) -> Result<Option<f64>, BenchError> {
        let pattern = format!("pgtaskd/%:{}:%", self.child.pid());
        let backends: Vec<i32> = client
            .query(sql::DAEMON_BACKENDS, &[&pattern])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        Ok(proc::backends_cpu_s(&backends))
    }

    /// Its CPU seconds and peak RSS so far.
    pub(super) fn usage(&self) -> Usage {
        Usage::of(self.child.pid())
    }

    /// SIGTERM, then wait for the clean exit.
    pub(super) async fn stop(mut self) {
        self.child.signal(libc::SIGTERM);
        let _ = self.child.wait_timeout(STOP_WAIT).await;
    }
}

/// The analyzer start of each task, read from a tracing daemon's log as its lines arrive.
#[derive(Default)]
pub(super) struct AnalyzerStarts {
    /// Log lines already read.
    read: usize,
    starts: HashMap<i64, chrono::DateTime<chrono::Utc>>,
}

impl AnalyzerStarts {
    /// When the analyzer started on task `id`, once the daemon's log line for it arrived.
    pub(super) async fn of(
        &mut self,
        daemon: &Daemon,
        id: i64,
    ) -> Result<chrono::DateTime<chrono::Utc>, BenchError> {
        let found = daemon.child.wait_for_log(|lines| {
            for line in &lines[self.read..] {
                if let Ok(LogLine { timestamp, fields }) = serde_json::from_str(line) {
                    if let (Some(id), events::ANALYZER_RUN) = (fields.id, fields.message.as_str()) {
                        self.starts.insert(id, timestamp);
                    }
                }
            }
            self.read = lines.len();
            self.starts.get(&id).copied()
        });
        tokio::time::timeout(START_WAIT, found)
            .await
            .ok()
            .flatten()
            .ok_or(BenchError::NoStart(id))
    }
}

fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}
