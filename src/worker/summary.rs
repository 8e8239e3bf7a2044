//! The worker's periodic summary: at info level, one line a minute with what its tasks came
//! to (claimed, finished by status, given back, failed attempts queued for a retry, results
//! dropped, results parked at a stop, and the rate), silent while idle, and one last line at the stop. Each task's own lines are at debug level, so that a
//! busy daemon's log grows by a line a minute, not two lines a task (docs/design.md, "Logs").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Worker;
use crate::completer::Action;
use crate::queue::TaskStatus;

/// How often the summary is written while tasks come.
pub const EVERY: Duration = Duration::from_secs(60);

/// What came of this worker's tasks since the last summary line.
#[derive(Debug, Default)]
pub(super) struct Summary {
    claimed: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    canceled: AtomicU64,
    released: AtomicU64,
    retried: AtomicU64,
    dropped: AtomicU64,
    parked: AtomicU64,
}

/// One summary's figures.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Figures {
    pub claimed: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub canceled: u64,
    pub released: u64,
    pub retried: u64,
    pub dropped: u64,
    pub parked: u64,
}

impl Figures {
    fn is_empty(&self) -> bool {
        *self == Figures::default()
    }
}

impl Summary {
    pub(super) fn claimed(&self, n: usize) {
        self.claimed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A claim was settled with `status` written (`None`: its result was dropped); `retried`:
    /// a failed attempt written back QUEUED for a later try, not a release.
    pub(super) fn settled(&self, status: Option<TaskStatus>, retried: bool) {
        let counter = match status {
            Some(TaskStatus::Queued) if retried => &self.retried,
            Some(TaskStatus::Succeeded) => &self.succeeded,
            Some(TaskStatus::Failed) => &self.failed,
            Some(TaskStatus::Canceled) => &self.canceled,
            Some(TaskStatus::Queued) => &self.released,
            // No claim is settled WAITING: its parents had all ended when it was claimed.
            Some(TaskStatus::Waiting | TaskStatus::Running) | None => &self.dropped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A claim counted as dropped was written after all (the stop's last look): counted
    /// with `status` instead.
    pub(super) fn recovered(&self, status: TaskStatus, action: &Action) {
        let _ = self
            .dropped
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        let retried = matches!(action, Action::Finish(outcome) if outcome.may_queue_again());
        self.settled(Some(status), retried);
    }

    /// `n` claims counted as dropped were parked for a rescuer to write (the stop's last
    /// look): counted as parked instead.
    pub(super) fn parked(&self, n: usize) {
        let n = n as u64;
        let _ = self
            .dropped
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                Some(d.saturating_sub(n))
            });
        self.parked.fetch_add(n, Ordering::Relaxed);
    }

    /// The figures since the last call, which start again from zero.
    pub(super) fn take(&self) -> Figures {
        let take = |n: &AtomicU64| n.swap(0, Ordering::Relaxed);
        Figures {
            claimed: take(&self.claimed),
            succeeded: take(&self.succeeded),
            failed: take(&self.failed),
            canceled: take(&self.canceled),
            released: take(&self.released),
            retried: take(&self.retried),
            dropped: take(&self.dropped),
            parked: take(&self.parked),
        }
    }

    /// Log the figures of the lane serving `queues` since the last line, over `since`, unless
    /// there are none.
    pub(super) fn log(&self, queues: &[String], since: Instant, last: bool) {
        let figures = self.take();
        if figures.is_empty() {
            return;
        }
        let seconds = since.elapsed().as_secs_f64().max(0.001);
        let finished = figures.succeeded + figures.failed + figures.canceled;
        let per_second = (finished as f64 / seconds * 10.0).round() / 10.0;
        let Figures {
            claimed,
            succeeded,
            failed,
            canceled,
            released,
            retried,
            dropped,
            parked,
        } = figures;
        let message = if last {
            "tasks since the last summary, at the stop"
        } else {
            "tasks in the last minute"
        };
        tracing::info!(
            queues = %queues.join(","),
            claimed,
            succeeded,
            failed,
            canceled,
            released,
            attempts_failed_to_retry = retried,
            results_dropped = dropped,
            results_parked = parked,
            per_second,
            "{message}"
        );
    }
}

impl Worker {
    /// Write the summary every [`EVERY`] while tasks come, and once more when the last task
    /// of a stop has ended.
    pub(super) async fn summarize(self) {
        let mut since = Instant::now();
        loop {
            tokio::select! {
                _ = self.inner.heartbeat_stop.cancelled() => {
                    self.inner.summary.log(&self.inner.config.queues, since, true);
                    return;
                }
                _ = tokio::time::sleep(EVERY) => {}
            }
            self.inner
                .summary
                .log(&self.inner.config.queues, since, false);
            since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_settled_claim_counts_once_under_its_status_and_a_take_starts_again() {
        let summary = Summary::default();
        summary.claimed(5);
        for (status, retried) in [
            (Some(TaskStatus::Succeeded), false),
            (Some(TaskStatus::Succeeded), false),
            (Some(TaskStatus::Failed), false),
            (Some(TaskStatus::Canceled), false),
            (Some(TaskStatus::Queued), false),
            (Some(TaskStatus::Queued), true),
            (Some(TaskStatus::Queued), true),
            (None, false),
        ] {
            summary.settled(status, retried);
        }
        assert_eq!(
            summary.take(),
            Figures {
                claimed: 5,
                succeeded: 2,
                failed: 1,
                canceled: 1,
                released: 1,
                retried: 2,
                dropped: 1,
                parked: 0,
            }
        );
        assert!(summary.take().is_empty());
    }

    #[test]
    fn a_result_parked_at_the_stop_is_no_longer_counted_as_dropped() {
        let summary = Summary::default();
        summary.settled(None, false);
        summary.settled(None, false);
        summary.parked(1);
        let figures = summary.take();
        assert_eq!((figures.dropped, figures.parked), (1, 1));
    }
}
