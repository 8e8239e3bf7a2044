//! Soak mode's figures, as `pgtaskd bench --mode soak` reports them: the [`Soak`] in the
//! [`super::Report`], its [`Period`]s, [`Summary`] and [`Hold`], and their text form. Filled
//! by soak mode (`src/bench/soak/`).

use serde::Serialize;

/// A soak's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Soak {
    /// The target insert rate, tasks per second.
    pub rate: f64,
    /// `"given"` or `"half of drain"`.
    pub rate_source: &'static str,
    /// The short drain's tasks per second, when it set the rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_tasks_per_s: Option<f64>,
    /// Tasks inserted per second over the run, as achieved.
    pub inserted_per_s: f64,
    /// The furthest the producer fell behind its schedule, in seconds of inserts.
    pub producer_max_behind_s: f64,
    pub duration_s: f64,
    pub period_s: f64,
    /// The daemon's `retention.finished_after`, seconds.
    pub retention_s: f64,
    pub periods: Vec<Period>,
    pub summary: Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Tasks inserted, tasks read back finished, and of those SUCCEEDED: all three equal.
    pub inserted: u64,
    pub finished: u64,
    pub succeeded: u64,
}

/// One period's figures. Rates and latencies are of the tasks that finished in it; sizes,
/// dead tuples and autovacuum count are sampled at its end, the backlog over it.
#[derive(Debug, Clone, Serialize)]
pub struct Period {
    /// Seconds from the start of the run to the end of the period.
    pub end_s: f64,
    pub tasks_per_s: f64,
    pub inserted_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    /// `pg_table_size`: the heap, its free-space and visibility maps, and TOAST.
    pub table_mib: f64,
    /// The TOAST table and its index, part of `table_mib`.
    pub toast_mib: f64,
    /// `pg_indexes_size`.
    pub index_mib: f64,
    pub total_mib: f64,
    /// `pg_stat_user_tables.n_dead_tup`.
    pub dead_tuples: i64,
    /// Autovacuum runs on the table that ended in the period.
    pub autovacuums: i64,
    /// QUEUED tasks of the run: the mean and the largest of the samples in the period.
    pub backlog: f64,
    pub backlog_max: i64,
    /// A snapshot was held during some of the period.
    pub held: bool,
}

/// Last period against first, and the size after the first retention windows.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub tasks_per_s_last_over_first: Option<f64>,
    pub p99_last_over_first: Option<f64>,
    /// Seconds into the run of the period the growth is measured from: the first ending
    /// two retention windows in (the first rows are pruned after one window, the table is
    /// at its steady population after the second).
    pub steady_from_s: Option<f64>,
    pub total_mib_steady: Option<f64>,
    pub total_mib_end: f64,
    pub growth_mib_per_min: Option<f64>,
}

/// What the held snapshot did.
#[derive(Debug, Clone, Serialize)]
pub struct Hold {
    pub start_s: f64,
    pub end_s: f64,
    /// Over the 10 s before the hold started.
    pub p99_before_ms: Option<f64>,
    pub backlog_before: f64,
    pub dead_tuples_before: i64,
    pub total_mib_before: f64,
    /// The worst of each during the hold and until recovery.
    pub p99_worst_ms: Option<f64>,
    pub backlog_worst: i64,
    pub dead_tuples_worst: i64,
    pub total_mib_worst: f64,
    /// From the end of the hold to the end of the first 10 s window whose
    /// p99 and mean backlog are within 10% of before (the backlog also within one insert
    /// statement's rows); `None`: not by the end of the run.
    pub recovered_after_s: Option<f64>,
}

impl std::fmt::Display for Soak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        match self.drain_tasks_per_s {
            Some(drain) => write!(
                f,
                "  rate                 {:.0} tasks/s (half of a drain at {drain:.0} tasks/s)",
                self.rate
            )?,
            None => write!(f, "  rate                 {:.0} tasks/s (given)", self.rate)?,
        }
        writeln!(
            f,
            "; inserted {:.0}/s, the producer at most {:.2} s behind",
            self.inserted_per_s, self.producer_max_behind_s
        )?;
        writeln!(
            f,
            "  retention            finished_after {:.0} s; periods of {:.0} s over {:.0} s",
            self.retention_s, self.period_s, self.duration_s
        )?;
        writeln!(
            f,
            "  {:>7} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>7} {:>16}",
            "end s",
            "tasks/s",
            "ins/s",
            "p50 ms",
            "p99 ms",
            "table MiB",
            "index MiB",
            "total MiB",
            "dead tup",
            "autovac",
            "backlog (max)"
        )?;
        for p in &self.periods {
            writeln!(
                f,
                "  {:>7.0} {:>8.0} {:>8.0} {:>8} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>10} {:>7} {:>16}{}",
                p.end_s,
                p.tasks_per_s,
                p.inserted_per_s,
                ms(p.p50_ms),
                ms(p.p99_ms),
                p.table_mib,
                p.index_mib,
                p.total_mib,
                p.dead_tuples,
                p.autovacuums,
                format!("{:.0} ({})", p.backlog, p.backlog_max),
                if p.held { "  held" } else { "" }
            )?;
        }
        let s = &self.summary;
        write!(
            f,
            "  last / first         tasks/s {}, p99 {}",
            ratio(s.tasks_per_s_last_over_first),
            ratio(s.p99_last_over_first)
        )?;
        match (s.steady_from_s, s.total_mib_steady, s.growth_mib_per_min) {
            (Some(from), Some(steady), Some(growth)) => writeln!(
                f,
                "; size {steady:.1} MiB at {from:.0} s, {:.1} MiB at the end: {growth:+.1} MiB/min",
                s.total_mib_end
            )?,
            _ => writeln!(
                f,
                "; size {:.1} MiB at the end (no period after two retention windows)",
                s.total_mib_end
            )?,
        }
        if let Some(h) = &self.hold {
            writeln!(
                f,
                "  snapshot held        {:.0}-{:.0} s: p99 {} -> worst {} ms, backlog {:.0} -> {}, dead tuples {} -> {}, size {:.1} -> {:.1} MiB; {}",
                h.start_s,
                h.end_s,
                ms(h.p99_before_ms),
                ms(h.p99_worst_ms),
                h.backlog_before,
                h.backlog_worst,
                h.dead_tuples_before,
                h.dead_tuples_worst,
                h.total_mib_before,
                h.total_mib_worst,
                h.recovered_after_s.map_or_else(
                    || "not recovered by the end".to_string(),
                    |r| format!("recovered {r:.0} s after its end")
                )
            )?;
        }
        writeln!(
            f,
            "  nothing lost         {} inserted, {} finished, {} SUCCEEDED",
            self.inserted, self.finished, self.succeeded
        )
    }
}
