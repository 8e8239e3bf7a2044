//! `pgtaskd bench`: the text-stats workload of `shared/bench/WORKLOAD.md` against the
//! configured database, with the daemon as a `pgtaskd run` process of its own, so that its
//! CPU seconds and peak RSS are measured apart from the producer.
//!
//! Each run uses a queue of its own (`bench-<pid>`), removes its rows before and after, and
//! refuses to report a run whose table totals differ from the workload's check totals.
//!
//! Latency mode runs the daemon with its worker's debug events as JSON on a pipe: the time
//! of each task's "analyzer run" event, taken by the daemon just before the analyzer starts,
//! ends that task's latency. Before the daemon starts, the same inserts are timed to a
//! `LISTEN` session of the bench's own: the notify floor, the part of the latency that the
//! INSERT's commit and the notification's delivery take, which no daemon woken by `NOTIFY`
//! goes under.

pub mod workload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::{AsyncMessage, Client};

use crate::config::Config;
use crate::db::{listen, migrate, ConnectSettings, DbError};

/// How often the producer looks at the table while it waits.
const POLL: Duration = Duration::from_millis(20);
/// The longest a run may take before it is abandoned.
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// Latency mode: warm-up tasks, measured tasks, and the gap between two inserts.
const WARM_UP: usize = 10;
const LATENCY_TASKS: usize = 200;
/// Latency mode runs exactly its warm-up and measured tasks.
pub const LATENCY_MODE_TASKS: u32 = (WARM_UP + LATENCY_TASKS) as u32;
const LATENCY_GAP: Duration = Duration::from_millis(20);
/// Latency mode: the longest the floor measurement waits for one notification.
const NOTIFY_WAIT: Duration = Duration::from_secs(5);
/// Stream mode: statements, each of `tasks / STREAM_STATEMENTS` rows.
const STREAM_STATEMENTS: usize = 200;
/// How long the idle daemon's CPU use is sampled.
const IDLE_SAMPLE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Drain,
    Stream,
    Latency,
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct BenchOptions {
    pub mode: Mode,
    pub tasks: u32,
    pub concurrency: usize,
}

/// Percentiles of enqueue-to-start latency, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: Mode,
    pub tasks: u32,
    pub concurrency: usize,
    pub seconds: f64,
    pub tasks_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<Latency>,
    /// Latency mode: from just before an INSERT until a bare `LISTEN` session of the bench
    /// receives its notification, with no daemon running: the part of the latency that no
    /// daemon woken by `NOTIFY` can go under on this machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify_floor_ms: Option<Latency>,
    pub daemon_cpu_s: f64,
    pub daemon_cpu_s_per_1000_tasks: f64,
    pub daemon_peak_rss_mib: f64,
    /// CPU seconds per second of the idle daemon, sampled before the load (stream, latency).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_idle_cpu_s_per_s: Option<f64>,
    pub check_totals: (i64, i64, i64),
}

/// Why a run has no result.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Schema(#[from] migrate::SchemaError),
    #[error("cannot start the daemon: {0}")]
    Daemon(String),
    #[error("refusing to report: the table holds {found:?} (words, bytes, runes) and {succeeded} SUCCEEDED rows; the workload's check totals are {expected:?} over {tasks} tasks")]
    Totals {
        found: (i64, i64, i64),
        expected: (i64, i64, i64),
        succeeded: i64,
        tasks: u32,
    },
    #[error("the run did not finish within {0:?}")]
    TooLong(Duration),
    #[error("the bench's own LISTEN session received no notification within {NOTIFY_WAIT:?} of an insert")]
    NoNotification,
    #[error("the daemon logged no analyzer start for task {0}")]
    NoStart(i64),
}

impl From<tokio_postgres::Error> for BenchError {
    fn from(err: tokio_postgres::Error) -> Self {
        BenchError::Db(err.into())
    }
}

/// Run the benchmark.
///
/// # Errors
///
/// Database failures, a daemon that cannot start, a run that does not finish, or totals that
/// differ from the check totals.
pub async fn run(config: &Config, options: BenchOptions) -> Result<Report, BenchError> {
    let settings = ConnectSettings::new(&config.database, "bench")
        .map_err(|err| BenchError::Daemon(err.to_string()))?;
    let client = settings.connect().await?;
    migrate::check(&client).await?;
    let queue = format!("bench-{}", std::process::id());
    delete_rows(&client, &queue).await?;
    let expected = if options.tasks == 20_000 {
        workload::CHECK_TOTALS_20000
    } else {
        workload::check_totals(options.tasks)
    };
    let result = measure(&settings, &client, config, &queue, options).await;
    delete_rows(&client, &queue).await?;
    let (report, found, succeeded) = result?;
    if found != expected || succeeded != i64::from(options.tasks) {
        return Err(BenchError::Totals {
            found,
            expected,
            succeeded,
            tasks: options.tasks,
        });
    }
    Ok(report)
}

async fn delete_rows(client: &Client, queue: &str) -> Result<(), BenchError> {
    client
        .execute("DELETE FROM pgtaskd.tasks WHERE queue = $1", &[&queue])
        .await?;
    Ok(())
}

/// Run one mode; returns the report, the table's totals and the SUCCEEDED count.
async fn measure(
    settings: &ConnectSettings,
    client: &Client,
    config: &Config,
    queue: &str,
    options: BenchOptions,
) -> Result<(Report, (i64, i64, i64), i64), BenchError> {
    let n = options.tasks as usize;
    let texts: Vec<String> = (0..options.tasks).map(workload::gen_text).collect();
    let mut latency = None;
    let mut floor = None;
    let mut idle_cpu = None;
    let (daemon, started) = match options.mode {
        Mode::Drain => {
            insert(client, queue, &texts).await?;
            let started = chrono::Utc::now();
            let daemon = Daemon::start(config, queue, options.concurrency, false)?;
            wait_done(client, queue, n).await?;
            (daemon, started)
        }
        Mode::Stream => {
            let daemon = Daemon::start(config, queue, options.concurrency, false)?;
            daemon.wait_listening(client).await?;
            idle_cpu = Some(daemon.idle_cpu().await);
            let started = chrono::Utc::now();
            let per_statement = n.div_ceil(STREAM_STATEMENTS).max(1);
            for chunk in texts.chunks(per_statement) {
                insert(client, queue, chunk).await?;
            }
            wait_done(client, queue, n).await?;
            (daemon, started)
        }
        Mode::Latency => {
            floor = Some(notify_floor(settings, client, queue, &texts).await?);
            let daemon = Daemon::start(config, queue, options.concurrency, true)?;
            daemon.wait_listening(client).await?;
            idle_cpu = Some(daemon.idle_cpu().await);
            let started = chrono::Utc::now();
            // Returns once every task is done.
            latency = Some(latencies(client, queue, &texts, &daemon).await?);
            (daemon, started)
        }
    };
    let seconds = seconds_since(client, queue, started).await?;
    let (cpu, rss) = daemon.usage();
    daemon.stop().await;
    let row = client
        .query_one(
            "SELECT coalesce(sum(words), 0)::int8, coalesce(sum(bytes), 0)::int8,
                    coalesce(sum(runes), 0)::int8, count(*) FILTER (WHERE status = 'SUCCEEDED')
               FROM pgtaskd.tasks WHERE queue = $1",
            &[&queue],
        )
        .await?;
    let found = (row.get(0), row.get(1), row.get(2));
    let succeeded: i64 = row.get(3);
    let report = Report {
        mode: options.mode,
        tasks: options.tasks,
        concurrency: options.concurrency,
        seconds,
        tasks_per_s: n as f64 / seconds,
        latency_ms: latency,
        notify_floor_ms: floor,
        daemon_cpu_s: cpu,
        daemon_cpu_s_per_1000_tasks: cpu / n as f64 * 1000.0,
        daemon_peak_rss_mib: rss,
        daemon_idle_cpu_s_per_s: idle_cpu,
        check_totals: found,
    };
    Ok((report, found, succeeded))
}

async fn insert(client: &Client, queue: &str, texts: &[String]) -> Result<(), BenchError> {
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT $1, unnest($2::text[])",
            &[&queue, &texts],
        )
        .await?;
    Ok(())
}

/// Wait until no task of `queue` is QUEUED or RUNNING and `n` are SUCCEEDED. The check is an
/// `EXISTS` on the partial indexes, cheap enough not to slow the run it watches.
async fn wait_done(client: &Client, queue: &str, n: usize) -> Result<(), BenchError> {
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let busy: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'QUEUED')
                     OR EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'RUNNING')",
                &[&queue],
            )
            .await?
            .get(0);
        if !busy {
            let done: i64 = client
                .query_one(
                    "SELECT count(*) FROM pgtaskd.tasks WHERE queue = $1 AND status = 'SUCCEEDED'",
                    &[&queue],
                )
                .await?
                .get(0);
            if done as usize >= n {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(BenchError::TooLong(RUN_LIMIT));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Seconds from `started` (this process's clock) to the last `finished_at` of `queue` (the
/// database's clock: the same machine's).
async fn seconds_since(
    client: &Client,
    queue: &str,
    started: chrono::DateTime<chrono::Utc>,
) -> Result<f64, BenchError> {
    let last: chrono::DateTime<chrono::Utc> = client
        .query_one(
            "SELECT max(finished_at) FROM pgtaskd.tasks WHERE queue = $1",
            &[&queue],
        )
        .await?
        .get(0);
    Ok((last - started).num_microseconds().unwrap_or(0) as f64 / 1e6)
}

/// Latency mode: warm-up, then one task at a time, 20 ms apart; the latency of a task is
/// from just before its INSERT to the daemon's "analyzer run" event for it.
async fn latencies(
    client: &Client,
    queue: &str,
    texts: &[String],
    daemon: &Daemon,
) -> Result<Latency, BenchError> {
    let insert = client
        .prepare("INSERT INTO pgtaskd.tasks (queue, payload) VALUES ($1, $2) RETURNING id")
        .await?;
    let count = texts.len();
    let mut sent = Vec::with_capacity(count);
    for (i, text) in texts.iter().take(count).enumerate() {
        let before = chrono::Utc::now();
        let id: i64 = client.query_one(&insert, &[&queue, text]).await?.get(0);
        if i >= WARM_UP {
            sent.push((id, before));
        }
        tokio::time::sleep(LATENCY_GAP).await;
    }
    wait_done(client, queue, count).await?;
    let mut millis = Vec::with_capacity(sent.len());
    for (id, before) in sent {
        let started = daemon.analyzer_start(id).await?;
        millis.push((started - before).num_microseconds().unwrap_or(0) as f64 / 1000.0);
    }
    Ok(Latency::of(millis))
}

impl Latency {
    fn of(mut millis: Vec<f64>) -> Latency {
        millis.sort_by(f64::total_cmp);
        let at =
            |q: f64| millis[((millis.len() as f64 * q).ceil() as usize).clamp(1, millis.len()) - 1];
        Latency {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: *millis.last().unwrap_or(&0.0),
        }
    }
}

/// The floor under the latency: the same inserts, one at a time and as far apart, with no
/// daemon running and a `LISTEN` session of the bench's own timing each notification's
/// arrival. Its rows go to a queue of their own, removed afterwards.
async fn notify_floor(
    settings: &ConnectSettings,
    client: &Client,
    queue: &str,
    texts: &[String],
) -> Result<Latency, BenchError> {
    let (listener, connection) = settings
        .config()
        .connect(settings.tls())
        .await
        .map_err(DbError::from)?;
    // Through the same forwarding as the daemon's listener.
    let (mut messages, _pump) = listen::forward_messages(connection);
    listener
        .batch_execute(&format!("LISTEN {}", listen::TASKS_CHANNEL))
        .await?;
    let queue = format!("{queue}-floor");
    let insert = client
        .prepare("INSERT INTO pgtaskd.tasks (queue, payload) VALUES ($1, $2)")
        .await?;
    let timed = async {
        let mut millis = Vec::with_capacity(LATENCY_TASKS);
        for (i, text) in texts.iter().enumerate() {
            let before = Instant::now();
            client.execute(&insert, &[&queue, text]).await?;
            let notified = async {
                loop {
                    match messages.recv().await {
                        Some(AsyncMessage::Notification(_)) => return Some(Instant::now()),
                        Some(_) => {}
                        None => return None,
                    }
                }
            };
            let arrived = tokio::time::timeout(NOTIFY_WAIT, notified)
                .await
                .ok()
                .flatten()
                .ok_or(BenchError::NoNotification)?;
            if i >= WARM_UP {
                millis.push((arrived - before).as_micros() as f64 / 1000.0);
            }
            tokio::time::sleep(LATENCY_GAP).await;
        }
        Ok::<_, BenchError>(millis)
    }
    .await;
    delete_rows(client, &queue).await?;
    Ok(Latency::of(timed?))
}

/// The daemon under test: `pgtaskd run` as a child process.
struct Daemon {
    child: tokio::process::Child,
    _config: TempConfig,
    /// When the analyzer started, by task id, as the daemon logged it (latency mode).
    starts: Arc<Mutex<HashMap<i64, chrono::DateTime<chrono::Utc>>>>,
}

/// The daemon's [`crate::events::ANALYZER_RUN`] event, as its JSON log line carries it.
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
    /// Start the daemon; with `trace_starts`, read the analyzer start of every task from its
    /// log.
    fn start(
        config: &Config,
        queue: &str,
        concurrency: usize,
        trace_starts: bool,
    ) -> Result<Daemon, BenchError> {
        let mut toml = String::new();
        if let Some(url) = &config.database.url {
            toml.push_str(&format!("[database]\nurl = {}\n", toml_string(url)));
        }
        let log = if trace_starts {
            "level = \"warn,pgtaskd::worker=debug\"\nformat = \"json\""
        } else {
            "level = \"warn\""
        };
        toml.push_str(&format!(
            "[worker]\nconcurrency = {concurrency}\nqueues = [{}]\n[log]\n{log}\n",
            toml_string(queue)
        ));
        let file = TempConfig::write(&toml).map_err(|err| BenchError::Daemon(err.to_string()))?;
        let exe = std::env::current_exe().map_err(|err| BenchError::Daemon(err.to_string()))?;
        let child = tokio::process::Command::new(exe)
            .arg("run")
            .arg("--config")
            .arg(&file.0)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Warnings would interleave with the report: the daemon's log is not shown.
            .stderr(if trace_starts {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| BenchError::Daemon(err.to_string()))?;
        let mut daemon = Daemon {
            child,
            _config: file,
            starts: Arc::default(),
        };
        if let Some(stderr) = daemon.child.stderr.take() {
            let starts = Arc::clone(&daemon.starts);
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(LogLine { timestamp, fields }) = serde_json::from_str(&line) {
                        if let (Some(id), crate::events::ANALYZER_RUN) =
                            (fields.id, fields.message.as_str())
                        {
                            starts
                                .lock()
                                .expect("start times poisoned")
                                .insert(id, timestamp);
                        }
                    }
                }
            });
        }
        Ok(daemon)
    }

    /// When the analyzer started on task `id`, once the daemon's log line arrived.
    async fn analyzer_start(&self, id: i64) -> Result<chrono::DateTime<chrono::Utc>, BenchError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(at) = self.starts.lock().expect("start times poisoned").get(&id) {
                return Ok(*at);
            }
            if Instant::now() > deadline {
                return Err(BenchError::NoStart(id));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Wait until this daemon's listener session is in place.
    async fn wait_listening(&self, client: &Client) -> Result<(), BenchError> {
        let pattern = format!("pgtaskd/%:{}:%", self.pid());
        let deadline = Instant::now() + RUN_LIMIT;
        loop {
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE application_name LIKE $1 AND query LIKE 'LISTEN%'",
                    &[&pattern],
                )
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
    async fn idle_cpu(&self) -> f64 {
        let before = self.usage().0;
        tokio::time::sleep(IDLE_SAMPLE).await;
        (self.usage().0 - before) / IDLE_SAMPLE.as_secs_f64()
    }

    /// CPU seconds (user + system, all threads) and peak RSS in MiB, from /proc.
    fn usage(&self) -> (f64, f64) {
        let pid = self.pid();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let cpu = (ticks(11) + ticks(12)) / per_second;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let peak_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        (cpu, peak_kib / 1024.0)
    }

    /// SIGTERM, then wait for the clean exit.
    async fn stop(mut self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid() as i32, libc::SIGTERM);
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }
}

fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// The daemon's configuration file, removed when dropped.
struct TempConfig(PathBuf);

impl TempConfig {
    fn write(contents: &str) -> std::io::Result<TempConfig> {
        let path = std::env::temp_dir().join(format!(
            "pgtaskd-bench-{}-{:08x}.toml",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::write(&path, contents)?;
        Ok(TempConfig(path))
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "pgtaskd bench: mode={:?} tasks={} concurrency={}",
            self.mode, self.tasks, self.concurrency
        )?;
        writeln!(f, "  seconds              {:.3}", self.seconds)?;
        writeln!(f, "  tasks/s              {:.0}", self.tasks_per_s)?;
        if let Some(l) = &self.latency_ms {
            writeln!(
                f,
                "  latency ms           p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
                l.p50, l.p90, l.p99, l.max
            )?;
        }
        if let Some(l) = &self.notify_floor_ms {
            writeln!(
                f,
                "  notify floor ms      p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}  (INSERT to a bare LISTEN session, no daemon)",
                l.p50, l.p90, l.p99, l.max
            )?;
        }
        writeln!(
            f,
            "  daemon CPU           {:.3} s ({:.4} s per 1,000 tasks)",
            self.daemon_cpu_s, self.daemon_cpu_s_per_1000_tasks
        )?;
        writeln!(
            f,
            "  daemon peak RSS      {:.1} MiB",
            self.daemon_peak_rss_mib
        )?;
        if let Some(idle) = self.daemon_idle_cpu_s_per_s {
            writeln!(f, "  daemon idle CPU      {idle:.5} s per s")?;
        }
        let (w, b, r) = self.check_totals;
        write!(
            f,
            "  check totals         {w} words, {b} bytes, {r} runes: match the workload"
        )
    }
}
