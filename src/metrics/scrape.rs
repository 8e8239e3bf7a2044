//! The gauges the `GET /metrics` handler (`src/http/ops.rs`) sets at each scrape from what it
//! reads then: the tasks WAITING, QUEUED and RUNNING in the whole table (the sums of the per-queue
//! figures, counted from partial indexes) and the pool's worker sessions.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::StatusLabel;
use crate::queue::TaskStatus;

pub(super) struct ScrapeMetrics {
    tasks: Family<StatusLabel, Gauge>,
    pool_in_use: Gauge,
    pool_open: Gauge,
}

impl ScrapeMetrics {
    pub(super) fn register(registry: &mut Registry) -> ScrapeMetrics {
        let tasks = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "tasks",
            "Tasks in the table by status (WAITING, QUEUED and RUNNING only: counted from partial indexes)",
            tasks.clone(),
        );
        let pool_in_use = Gauge::default();
        registry.register(
            "pool_connections_in_use",
            "Worker sessions handed out by the pool",
            pool_in_use.clone(),
        );
        let pool_open = Gauge::default();
        registry.register(
            "pool_connections_open",
            "Worker sessions open in the pool",
            pool_open.clone(),
        );
        ScrapeMetrics {
            tasks,
            pool_in_use,
            pool_open,
        }
    }

    /// `tasks` is (WAITING, QUEUED, RUNNING); `pool` is (open, in use).
    pub(super) fn observe(&self, tasks: (i64, i64, i64), pool: (usize, usize)) {
        let (waiting, queued, running) = tasks;
        for (status, n) in [
            (TaskStatus::Waiting, waiting),
            (TaskStatus::Queued, queued),
            (TaskStatus::Running, running),
        ] {
            self.tasks
                .get_or_create(&StatusLabel {
                    status: status.as_str(),
                })
                .set(n);
        }
        self.pool_open.set(pool.0 as i64);
        self.pool_in_use.set(pool.1 as i64);
    }
}
