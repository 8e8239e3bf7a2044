//! The progress reports' metrics: the reports taken into memory, the lines dropped by reason,
//! the flush statements and the rows they wrote. `writes` over time against `reports` shows the
//! flusher's "at most one write a second per task". Updated by `src/progress/`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

pub(super) struct ProgressMetrics {
    reports: Counter,
    dropped: Family<ReasonLabel, Counter>,
    flushes: Counter,
    writes: Counter,
}

impl ProgressMetrics {
    pub(super) fn register(registry: &mut Registry) -> ProgressMetrics {
        let reports = Counter::default();
        registry.register(
            "progress_reports",
            "Progress reports of running handlers taken into memory (exec lines and HTTP posts)",
            reports.clone(),
        );
        let dropped = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "progress_dropped",
            "Progress reports dropped, by reason (too_long, not_json, not_object, percent, nul, full, refused)",
            dropped.clone(),
        );
        let flushes = Counter::default();
        registry.register(
            "progress_flushes",
            "Statements that wrote progress reports to the database (one per flush, for every task)",
            flushes.clone(),
        );
        let writes = Counter::default();
        registry.register(
            "progress_writes",
            "Task rows whose progress a flush wrote",
            writes.clone(),
        );
        ProgressMetrics {
            reports,
            dropped,
            flushes,
            writes,
        }
    }

    pub(super) fn reported(&self) {
        self.reports.inc();
    }

    pub(super) fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub(super) fn writes(&self) -> u64 {
        self.writes.get()
    }

    pub(super) fn flushed(&self, rows: usize) {
        self.flushes.inc();
        self.writes.inc_by(rows as u64);
    }
}
