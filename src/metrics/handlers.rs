//! The handlers' metrics, per queue: how long each run of an `exec` or `http` handler took,
//! the failed attempts by kind (exit, signal, timeout, status_4xx, status_5xx, unreachable,
//! output, panic), and the attempts put back for a retry. Updated by the worker's lanes
//! (`src/worker/handle.rs`) as each run returns.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    queue: String,
    kind: &'static str,
}

type Durations = Family<QueueLabel, Histogram, fn() -> Histogram>;

pub(super) struct HandlerMetrics {
    durations: Durations,
    failures: Family<FailureLabel, Counter>,
    retries: Family<QueueLabel, Counter>,
    snoozes: Family<QueueLabel, Counter>,
}

fn duration_histogram() -> Histogram {
    // 1 ms to about 9 minutes.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

impl HandlerMetrics {
    pub(super) fn register(registry: &mut Registry) -> HandlerMetrics {
        let durations: Durations = Family::new_with_constructor(duration_histogram);
        registry.register(
            "handler_duration_seconds",
            "Time one run of a queue's exec or http handler took, by queue",
            durations.clone(),
        );
        let failures = Family::<FailureLabel, Counter>::default();
        registry.register(
            "handler_failures",
            "Failed attempts of a queue's handler, by queue and kind",
            failures.clone(),
        );
        let retries = Family::<QueueLabel, Counter>::default();
        registry.register(
            "handler_retries",
            "Failed attempts given another try later, by queue",
            retries.clone(),
        );
        let snoozes = Family::<QueueLabel, Counter>::default();
        registry.register(
            "handler_snoozes",
            "Runs put off at the handler's request without using an attempt (exec exit 75, http 202 with Retry-After), by queue",
            snoozes.clone(),
        );
        HandlerMetrics {
            durations,
            failures,
            retries,
            snoozes,
        }
    }

    pub(super) fn ran(&self, queue: &str, seconds: f64, failure: Option<&'static str>) {
        let label = QueueLabel {
            queue: queue.to_string(),
        };
        self.durations.get_or_create(&label).observe(seconds);
        if let Some(kind) = failure {
            self.failures
                .get_or_create(&FailureLabel {
                    queue: queue.to_string(),
                    kind,
                })
                .inc();
        }
    }

    pub(super) fn snoozed(&self, queue: &str) {
        self.snoozes
            .get_or_create(&QueueLabel {
                queue: queue.to_string(),
            })
            .inc();
    }

    pub(super) fn retried(&self, queue: &str) {
        self.retries
            .get_or_create(&QueueLabel {
                queue: queue.to_string(),
            })
            .inc();
    }
}
