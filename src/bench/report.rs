//! The figures of one bench run: the [`Report`] that `pgtaskd bench` prints as text or as
//! one JSON object, and the [`Latency`] percentiles in it. Filled by [`super::run`].

use serde::Serialize;

use super::Mode;

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

impl Latency {
    /// The percentiles of `millis` (nearest rank).
    pub(super) fn of(mut millis: Vec<f64>) -> Latency {
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
