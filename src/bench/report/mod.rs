//! The figures of one bench run: the [`Report`] that `pgtaskd bench` prints as text or as
//! one JSON object, the [`Latency`] percentiles in it, producers mode's [`Producers`], and
//! soak mode's [`Soak`] (`soak.rs`). Filled by [`super::run`] and the modes; depends on no
//! mode.

mod soak;

use serde::Serialize;

use super::Mode;

pub use soak::{Hold, Period, Soak, Summary};

/// Percentiles of enqueue-to-start latency, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// One half of producers mode: single-row INSERT commits over its duration.
#[derive(Debug, Clone, Serialize)]
pub struct Enqueue {
    pub commits: u64,
    pub seconds: f64,
    pub commits_per_s: f64,
    /// `pgtaskd_tasks` notifications a `LISTEN` session of the bench received from the
    /// half's commits: the commits that took the cluster-wide notify lock.
    pub notified: u64,
}

/// Producers mode's figures: the same producers with the NOTIFY trigger as shipped, then
/// with it disabled, while the daemon runs; and the idle daemon's latency before and after.
#[derive(Debug, Clone, Serialize)]
pub struct Producers {
    pub producers: usize,
    pub seconds_each: f64,
    pub with_trigger: Enqueue,
    pub without_trigger: Enqueue,
    /// `with_trigger.commits_per_s / without_trigger.commits_per_s`.
    pub with_over_without: f64,
    /// Latency mode's measurement on the same daemon before the producers start.
    pub idle_latency_before_ms: Latency,
    /// The same, once the producers stopped and the daemon drained their tasks.
    pub idle_latency_after_ms: Latency,
}

/// The figures of one run. Without a daemon (ceiling mode) there are no daemon figures, but
/// the drain that follows the ceiling in the same run is nested in `drain`; in producers mode
/// `tasks` is what the producers committed, both halves together, and `seconds` and
/// `tasks_per_s` cover the whole run, the waits for the daemon included.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: Mode,
    pub tasks: u32,
    /// The daemon's worker.concurrency; in ceiling mode, the bench's claiming sessions.
    pub concurrency: usize,
    /// Ceiling mode: the most tasks one claim takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// The queue's `max_running`, when the run limited it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
    pub seconds: f64,
    pub tasks_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<Latency>,
    /// Latency and producers modes: from just before an INSERT until a bare `LISTEN` session of the bench
    /// receives its notification, with no daemon running: the part of the latency that no
    /// daemon woken by `NOTIFY` can go under on this machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify_floor_ms: Option<Latency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub producers: Option<Producers>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<Soak>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_cpu_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_cpu_s_per_1000_tasks: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_peak_rss_mib: Option<f64>,
    /// CPU seconds per second of the idle daemon, sampled before the load (stream, latency).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_idle_cpu_s_per_s: Option<f64>,
    /// Drain and ceiling modes, with the server on this machine: CPU seconds of the server
    /// backends of the run's sessions (the daemon's, from its start; the ceiling's, from its
    /// first claim), read from `/proc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_s_per_1000_tasks: Option<f64>,
    /// Drain and ceiling modes: WAL bytes the server wrote during the run (`pg_current_wal_lsn()`
    /// before and after; the whole cluster's, so other databases' writes are in it), per task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wal_bytes_per_task: Option<f64>,
    /// Drain and ceiling modes: WAL bytes per second the cluster wrote just before the run,
    /// with no run going on: how much of `wal_bytes_per_task` may be others'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wal_background_bytes_per_s: Option<f64>,
    /// Drain mode: WAL bytes the producer's INSERTs of the backlog wrote, per task, in the
    /// same run (measured the same way): what `wal_bytes_per_task` is judged against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insert_wal_bytes_per_task: Option<f64>,
    pub check_totals: (i64, i64, i64),
    /// Drain mode with `--handler`: the same backlog drained by that handler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler: Option<super::HandlerRun>,
    /// Ceiling mode: `drain.tasks_per_s / tasks_per_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_over_ceiling: Option<f64>,
    /// Ceiling mode: the drain of the same backlog by the daemon, measured after the ceiling
    /// in the same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<Box<Report>>,
}

impl Latency {
    /// The percentiles of `millis` (nearest rank).
    pub(super) fn of(mut millis: Vec<f64>) -> Latency {
        millis.sort_by(f64::total_cmp);
        let at = |q: f64| nearest_rank(&millis, q).expect("latencies were measured");
        Latency {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: *millis.last().unwrap_or(&0.0),
        }
    }
}

/// The nearest-rank percentile `q` (0 to 1) of `sorted`, which is in ascending order; `None`
/// when it is empty.
pub(super) fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pgtaskd bench: mode={:?} tasks={} concurrency={}",
            self.mode, self.tasks, self.concurrency
        )?;
        if let Some(most) = self.max_running {
            write!(f, " max_running={most}")?;
        }
        match self.batch {
            Some(batch) => writeln!(f, " batch={batch} (no daemon, no analyzer)")?,
            None => writeln!(f)?,
        }
        self.figures(f)?;
        let (w, b, r) = self.check_totals;
        write!(
            f,
            "  check totals         {w} words, {b} bytes, {r} runes: match the workload"
        )?;
        if let (Some(drain), Some(fraction)) = (&self.drain, self.drain_over_ceiling) {
            writeln!(
                f,
                "\nthen the same backlog drained by the daemon: mode={:?} tasks={} concurrency={}",
                drain.mode, drain.tasks, drain.concurrency
            )?;
            drain.figures(f)?;
            write!(f, "  drain / ceiling      {:.1}%", fraction * 100.0)?;
        }
        if let Some(run) = &self.handler {
            writeln!(
                f,
                "\nthen the same backlog drained by the {:?} handler: tasks={}",
                run.handler, run.tasks
            )?;
            writeln!(f, "  seconds              {:.3}", run.seconds)?;
            writeln!(f, "  tasks/s              {:.0}", run.tasks_per_s)?;
            writeln!(
                f,
                "  daemon CPU           {:.3} s per 1000 tasks",
                run.daemon_cpu_s_per_1000_tasks
            )?;
            writeln!(
                f,
                "  daemon peak RSS      {:.1} MiB",
                run.daemon_peak_rss_mib
            )?;
            if let Some(floor) = run.spawn_floor_tasks_per_s {
                writeln!(
                    f,
                    "  spawn floor          {floor:.0} tasks/s (the same spawns, no pgtaskd)"
                )?;
            }
            write!(
                f,
                "  analyzer / handler   {:.1}x",
                run.analyzer_over_handler
            )?;
        }
        Ok(())
    }
}

impl Report {
    /// The measured lines of the text form, each ending in a newline.
    fn figures(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
        if let Some(p) = &self.producers {
            for (name, half) in [
                ("with trigger", &p.with_trigger),
                ("without trigger", &p.without_trigger),
            ] {
                writeln!(
                    f,
                    "  {name:<20} {:.0} commits/s ({} commits by {} producers in {:.1} s, {} notified)",
                    half.commits_per_s, half.commits, p.producers, half.seconds, half.notified
                )?;
            }
            writeln!(
                f,
                "  with / without       {:.1}%",
                p.with_over_without * 100.0
            )?;
            for (name, l) in [
                ("idle latency before", &p.idle_latency_before_ms),
                ("idle latency after", &p.idle_latency_after_ms),
            ] {
                writeln!(
                    f,
                    "  {name:<20} p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2} ms (INSERT to analyzer start)",
                    l.p50, l.p90, l.p99, l.max
                )?;
            }
        }
        if let Some(soak) = &self.soak {
            write!(f, "{soak}")?;
        }
        if let (Some(cpu), Some(per_1000)) = (self.daemon_cpu_s, self.daemon_cpu_s_per_1000_tasks) {
            writeln!(
                f,
                "  daemon CPU           {cpu:.3} s ({per_1000:.4} s per 1,000 tasks)"
            )?;
        }
        if let Some(rss) = self.daemon_peak_rss_mib {
            writeln!(f, "  daemon peak RSS      {rss:.1} MiB")?;
        }
        if let Some(idle) = self.daemon_idle_cpu_s_per_s {
            writeln!(f, "  daemon idle CPU      {idle:.5} s per s")?;
        }
        if let (Some(cpu), Some(per_1000)) = (self.server_cpu_s, self.server_cpu_s_per_1000_tasks) {
            writeln!(
                f,
                "  server CPU           {cpu:.3} s ({per_1000:.4} s per 1,000 tasks; the backends of the run's sessions)"
            )?;
        }
        if let (Some(wal), Some(background)) =
            (self.wal_bytes_per_task, self.wal_background_bytes_per_s)
        {
            writeln!(
                f,
                "  WAL per task         {wal:.0} bytes (whole cluster; {background:.0} bytes/s written before the run)"
            )?;
        }
        if let (Some(insert), Some(wal)) = (self.insert_wal_bytes_per_task, self.wal_bytes_per_task)
        {
            writeln!(
                f,
                "  WAL of the INSERTs   {insert:.0} bytes per task (the run's over the INSERTs': {:.2}x)",
                (insert + wal) / insert
            )?;
        }
        Ok(())
    }
}
