//! How many tasks the worker claims next: its intake.
//!
//! The worker keeps at most a *target* number of tasks claimed and not yet analyzed. The
//! target is `worker.concurrency`, plus the tasks the workers are expected to get through
//! while one claim is on its way to the database and back:
//!
//! ```text
//! target = concurrency + min(MAX_AHEAD, concurrency * claim_round_trip / time_per_task)
//! ```
//!
//! Both durations are moving averages of what this worker measured; the time per task is
//! also at least the age of the oldest analysis still running, so that a turn to slow tasks
//! stops the claiming ahead at once rather than after they finished. For tasks that take a
//! second, a claim round trip of a millisecond adds nothing: each claim takes only as many
//! tasks as there are free workers, and no daemon holds tasks that another could start. For
//! tasks that take microseconds (a short text), the workers would otherwise sit idle waiting
//! for the next claim, and claims of a few rows would each cost a statement and a commit; the
//! target then grows up to `MAX_AHEAD`, and the tasks claimed ahead wait in the daemon, for
//! about one claim's round trip, RUNNING under a lease that the heartbeat keeps. At most
//! `concurrency` of them are analyzed at once.
//!
//! Callers: the worker's claim path reserves room and measures claims; each claimed task
//! measures its analysis and gives its room back.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The most tasks claimed ahead of the free workers.
pub const MAX_AHEAD: usize = 200;

/// Weight of a new measurement in the moving averages.
const SMOOTHING: f64 = 0.2;

/// The intake of one worker: claimed-but-not-analyzed tasks against the target.
#[derive(Debug)]
pub struct Intake {
    concurrency: usize,
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Tasks claimed (or being claimed) and not yet through the analyzer.
    outstanding: usize,
    /// Seconds a worker spends on one task; `None` until one was measured.
    per_task: Option<f64>,
    /// Seconds from sending a claim to having its tasks; `None` until one was measured.
    round_trip: Option<f64>,
    /// When each analysis still running started, by ticket number (oldest first).
    analyzing: BTreeMap<u64, Instant>,
    next_ticket: u64,
}

impl State {
    fn target(&self, concurrency: usize) -> usize {
        let oldest = self
            .analyzing
            .values()
            .next()
            .map(|since| since.elapsed().as_secs_f64());
        let per_task = match (self.per_task, oldest) {
            (Some(average), Some(oldest)) => Some(average.max(oldest)),
            (average, _) => average,
        };
        concurrency + ahead(concurrency, per_task, self.round_trip)
    }
}

/// One analysis in progress; its time is measured when it is dropped.
#[must_use = "the analysis is measured when this is dropped"]
pub struct Analysis<'a> {
    intake: &'a Intake,
    ticket: u64,
}

impl Drop for Analysis<'_> {
    fn drop(&mut self) {
        let mut state = self.intake.lock();
        if let Some(since) = state.analyzing.remove(&self.ticket) {
            fold(&mut state.per_task, since.elapsed().as_secs_f64());
        }
    }
}

impl Intake {
    pub fn new(concurrency: usize) -> Intake {
        Intake {
            concurrency,
            state: Mutex::new(State::default()),
            freed: Notify::new(),
        }
    }

    /// The most tasks this worker keeps claimed and not yet analyzed, now.
    pub fn target(&self) -> usize {
        self.lock().target(self.concurrency)
    }

    /// Reserve room for a claim of at most `most` tasks; returns how many were reserved
    /// (0 when the intake is full). Each reserved task is given back with [`Intake::done`].
    pub fn reserve(&self, most: usize) -> usize {
        let mut state = self.lock();
        let target = state.target(self.concurrency);
        let room = target.saturating_sub(state.outstanding).min(most);
        state.outstanding += room;
        room
    }

    /// Wait until [`Intake::reserve`] may find room again (some was given back).
    pub async fn freed(&self) {
        self.freed.notified().await;
    }

    /// `n` reserved tasks left the intake: not claimed after all, analyzed, or given up.
    pub fn done(&self, n: usize) {
        if n == 0 {
            return;
        }
        {
            let mut state = self.lock();
            state.outstanding = state.outstanding.saturating_sub(n);
        }
        self.freed.notify_one();
    }

    /// A claim statement took `took`.
    pub fn claim_took(&self, took: Duration) {
        fold(&mut self.lock().round_trip, took.as_secs_f64());
    }

    /// A worker starts on one task: the time until the returned guard is dropped is that
    /// task's time.
    pub fn analysis(&self) -> Analysis<'_> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.analyzing.insert(ticket, Instant::now());
        Analysis {
            intake: self,
            ticket,
        }
    }

    #[cfg(test)]
    fn task_took(&self, took: Duration) {
        fold(&mut self.lock().per_task, took.as_secs_f64());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("intake state poisoned")
    }
}

/// Tasks to claim ahead of the free workers: what `concurrency` workers get through in one
/// claim round trip, capped; none before both were measured.
fn ahead(concurrency: usize, per_task: Option<f64>, round_trip: Option<f64>) -> usize {
    let (Some(per_task), Some(round_trip)) = (per_task, round_trip) else {
        return 0;
    };
    let through = concurrency as f64 * round_trip / per_task.max(1e-9);
    if through.is_finite() {
        (through as usize).min(MAX_AHEAD)
    } else {
        MAX_AHEAD
    }
}

/// Fold `sample` into the moving `average` (the first sample starts it).
fn fold(average: &mut Option<f64>, sample: f64) {
    *average = Some(match *average {
        Some(previous) => previous + SMOOTHING * (sample - previous),
        None => sample,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_only_for_free_workers_until_measured() {
        let intake = Intake::new(8);
        assert_eq!(intake.target(), 8);
        assert_eq!(intake.reserve(100), 8);
        assert_eq!(intake.reserve(100), 0);
        intake.done(3);
        assert_eq!(intake.reserve(100), 3);
    }

    #[test]
    fn slow_tasks_add_nothing_ahead() {
        let intake = Intake::new(8);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_secs(1));
        assert_eq!(intake.target(), 8);
    }

    #[test]
    fn fast_tasks_claim_what_the_workers_get_through_in_a_round_trip() {
        let intake = Intake::new(4);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_micros(100));
        // 4 workers * 1 ms / 0.1 ms = 40 tasks ahead.
        assert_eq!(intake.target(), 4 + 40);

        let intake = Intake::new(4);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_nanos(10));
        assert_eq!(intake.target(), 4 + MAX_AHEAD);
    }

    #[test]
    fn a_long_running_analysis_stops_the_claiming_ahead_before_it_ends() {
        let intake = Intake::new(4);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_nanos(10));
        assert_eq!(intake.target(), 4 + MAX_AHEAD);
        let slow = intake.analysis();
        // 4 workers * 1 ms / 50 ms rounds down to nothing ahead.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(intake.target(), 4);
        drop(slow);
        // Finished, its 50 ms weigh in the average: still nothing ahead.
        assert_eq!(intake.target(), 4);
    }

    #[test]
    fn reserve_never_exceeds_the_asked_for_batch() {
        let intake = Intake::new(8);
        assert_eq!(intake.reserve(5), 5);
        assert_eq!(intake.reserve(5), 3);
    }

    #[tokio::test]
    async fn done_wakes_a_waiting_claimer() {
        let intake = std::sync::Arc::new(Intake::new(1));
        assert_eq!(intake.reserve(1), 1);
        let waiter = {
            let intake = std::sync::Arc::clone(&intake);
            tokio::spawn(async move {
                intake.freed().await;
                intake.reserve(1)
            })
        };
        intake.done(1);
        let reserved = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken within 5 s")
            .expect("waiter did not panic");
        assert_eq!(reserved, 1);
    }
}
