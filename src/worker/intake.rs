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
//! Payload bytes are bounded too (`worker.max_inflight_bytes`): the intake counts the bytes
//! of every task it holds, from the claim until the analyzer let go of the text, and a claim
//! may only take what is left of the budget (at most half of it, so that two claims on their
//! way together stay within it). When the daemon holds nothing and no claim is on its way, a
//! claim takes its first task whatever its size: a payload larger than the budget still runs,
//! alone. So the bytes held stay under the budget plus the largest payload. A claim that
//! brought more than [`ROUND_TRIP_SAMPLE_MAX_BYTES`] of text is not timed: its round trip is
//! mostly the transfer, and it would make the intake claim far ahead of its workers.
//!
//! Callers: the worker's claim path reserves room and measures claims; each claimed task
//! measures its analysis and gives its room back.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

// tokio's clock, which a paused test runtime moves by hand; the system's otherwise.
use tokio::time::Instant;

use tokio::sync::Notify;

/// The most tasks claimed ahead of the free workers: enough for two claims of
/// `MAX_CLAIM_BATCH` on their way at once, so that a drain of short texts claims in large
/// batches (200 held claims to about 75 rows each and twice the statements per task).
pub const MAX_AHEAD: usize = 1000;

/// Claims that brought more payload than this are not timed (their transfer is not the
/// round trip that claiming ahead makes up for).
pub const ROUND_TRIP_SAMPLE_MAX_BYTES: u64 = 1 << 20;

/// A claim may use this share of the byte budget, so that the claims on their way together
/// stay within it.
const CLAIMS_SHARING_THE_BUDGET: u64 = 2;

/// Weight of a new measurement in the moving averages.
const SMOOTHING: f64 = 0.2;

/// The intake of one worker: claimed-but-not-analyzed tasks against the target.
#[derive(Debug)]
pub struct Intake {
    concurrency: usize,
    /// `worker.max_inflight_bytes`.
    max_bytes: u64,
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Tasks claimed (or being claimed) and not yet through the analyzer.
    outstanding: usize,
    /// Payload bytes of the tasks claimed and not yet let go of.
    bytes_held: u64,
    /// Payload bytes reserved by the claims on their way.
    bytes_reserved: u64,
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

/// What one claim may take, as [`Intake::reserve`] granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The most tasks.
    pub tasks: usize,
    /// The most payload bytes.
    pub bytes: u64,
    /// Take the first task whatever its size: nothing else is held or on its way.
    pub take_one: bool,
}

impl Intake {
    /// The intake of `concurrency` workers holding at most `max_bytes` of payload (a single
    /// larger payload aside).
    pub fn new(concurrency: usize, max_bytes: u64) -> Intake {
        Intake {
            concurrency,
            max_bytes: max_bytes.max(1),
            state: Mutex::new(State::default()),
            freed: Notify::new(),
        }
    }

    /// The most tasks this worker keeps claimed and not yet analyzed, now.
    pub fn target(&self) -> usize {
        self.lock().target(self.concurrency)
    }

    /// Reserve room for a claim of at most `most` tasks and at least `need` bytes (the size
    /// of a task a claim left out; 0 for none); `None` when the intake is full, of tasks or of
    /// bytes. A claim that may take one task of any size always has room for it. The
    /// reservation is settled with [`Intake::claimed`] or [`Intake::unreserve`].
    pub fn reserve(&self, most: usize, need: u64) -> Option<Room> {
        let mut state = self.lock();
        let target = state.target(self.concurrency);
        let tasks = target.saturating_sub(state.outstanding).min(most);
        let take_one = state.bytes_held == 0 && state.bytes_reserved == 0;
        let bytes = self
            .max_bytes
            .saturating_sub(state.bytes_held + state.bytes_reserved)
            .min((self.max_bytes / CLAIMS_SHARING_THE_BUDGET).max(1));
        if tasks == 0 || (!take_one && (bytes == 0 || bytes < need)) {
            return None;
        }
        state.outstanding += tasks;
        state.bytes_reserved += bytes;
        Some(Room {
            tasks,
            bytes,
            take_one,
        })
    }

    /// Whether [`Intake::reserve`] would find room for a claim of one task of no size now.
    pub fn has_room(&self) -> bool {
        let state = self.lock();
        let tasks = state
            .target(self.concurrency)
            .saturating_sub(state.outstanding);
        let take_one = state.bytes_held == 0 && state.bytes_reserved == 0;
        let bytes = self
            .max_bytes
            .saturating_sub(state.bytes_held + state.bytes_reserved);
        tasks > 0 && (take_one || bytes > 0)
    }

    /// A claim for `room` took `tasks` tasks holding `bytes` of payload, in `took`: the room
    /// it did not use is free again.
    pub fn claimed(&self, room: Room, tasks: usize, bytes: u64, took: Duration) {
        {
            let mut state = self.lock();
            state.outstanding = state
                .outstanding
                .saturating_sub(room.tasks - tasks.min(room.tasks));
            state.bytes_reserved = state.bytes_reserved.saturating_sub(room.bytes);
            state.bytes_held += bytes;
            if bytes <= ROUND_TRIP_SAMPLE_MAX_BYTES {
                fold(&mut state.round_trip, took.as_secs_f64());
            }
        }
        self.freed.notify_one();
    }

    /// A claim for `room` took nothing (it failed).
    pub fn unreserve(&self, room: Room) {
        self.claimed(room, 0, 0, Duration::ZERO);
    }

    /// Payload bytes held now, by claimed tasks and claims on their way.
    pub fn bytes(&self) -> (u64, u64) {
        let state = self.lock();
        (state.bytes_held, state.bytes_reserved)
    }

    /// Wait until [`Intake::reserve`] may find room again (some was given back).
    pub async fn freed(&self) {
        self.freed.notified().await;
    }

    /// One claimed task left the intake (analyzed, or given up) and let go of its payload
    /// of `bytes`.
    pub fn done(&self, bytes: u64) {
        {
            let mut state = self.lock();
            state.outstanding = state.outstanding.saturating_sub(1);
            state.bytes_held = state.bytes_held.saturating_sub(bytes);
        }
        self.freed.notify_one();
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
    fn claim_took(&self, took: Duration) {
        fold(&mut self.lock().round_trip, took.as_secs_f64());
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

    const MIB: u64 = 1 << 20;

    /// The tasks a reservation granted, 0 for none.
    fn tasks(room: Option<Room>) -> usize {
        room.map_or(0, |room| room.tasks)
    }

    /// Reserve `most` tasks and settle the reservation as a claim of all of them, with no
    /// payload bytes.
    fn claim_all(intake: &Intake, most: usize) -> usize {
        let Some(room) = intake.reserve(most, 0) else {
            return 0;
        };
        intake.claimed(room, room.tasks, 0, Duration::from_millis(1));
        room.tasks
    }

    #[test]
    fn claims_only_for_free_workers_until_measured() {
        let intake = Intake::new(8, MIB);
        assert_eq!(intake.target(), 8);
        assert_eq!(tasks(intake.reserve(100, 0)), 8);
        assert_eq!(tasks(intake.reserve(100, 0)), 0);
    }

    #[test]
    fn a_claim_gives_back_the_room_it_did_not_use() {
        let intake = Intake::new(8, MIB);
        let room = intake.reserve(100, 0).unwrap();
        intake.claimed(room, 5, 0, Duration::from_secs(1));
        assert_eq!(tasks(intake.reserve(100, 0)), 3);
        for _ in 0..3 {
            intake.done(0);
        }
        assert_eq!(tasks(intake.reserve(100, 0)), 3);
    }

    #[test]
    fn slow_tasks_add_nothing_ahead() {
        let intake = Intake::new(8, MIB);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_secs(1));
        assert_eq!(intake.target(), 8);
    }

    #[test]
    fn fast_tasks_claim_what_the_workers_get_through_in_a_round_trip() {
        let intake = Intake::new(4, MIB);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_micros(100));
        // 4 workers * 1 ms / 0.1 ms = 40 tasks ahead.
        assert_eq!(intake.target(), 4 + 40);

        let intake = Intake::new(4, MIB);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_nanos(10));
        assert_eq!(intake.target(), 4 + MAX_AHEAD);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_running_analysis_stops_the_claiming_ahead_before_it_ends() {
        let intake = Intake::new(4, MIB);
        intake.claim_took(Duration::from_millis(1));
        intake.task_took(Duration::from_nanos(10));
        assert_eq!(intake.target(), 4 + MAX_AHEAD);
        let slow = intake.analysis();
        // 4 workers * 1 ms / 50 ms rounds down to nothing ahead.
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(intake.target(), 4);
        drop(slow);
        // Finished, its 50 ms weigh in the average: still nothing ahead.
        assert_eq!(intake.target(), 4);
    }

    #[test]
    fn a_claim_that_brought_much_text_is_not_timed() {
        let intake = Intake::new(4, 1 << 40);
        intake.task_took(Duration::from_micros(100));
        let room = intake.reserve(4, 0).unwrap();
        // A second for 200 MiB: the transfer, not the round trip.
        intake.claimed(room, 1, 200 * MIB, Duration::from_secs(1));
        assert_eq!(intake.target(), 4);
        let room = intake.reserve(1, 0).unwrap();
        intake.claimed(room, 1, 1000, Duration::from_millis(1));
        assert_eq!(intake.target(), 4 + 40);
    }

    #[test]
    fn reserve_never_exceeds_the_asked_for_batch() {
        let intake = Intake::new(8, MIB);
        assert_eq!(tasks(intake.reserve(5, 0)), 5);
        assert_eq!(tasks(intake.reserve(5, 0)), 3);
    }

    #[test]
    fn a_claim_may_use_half_the_byte_budget_and_take_one_only_when_nothing_is_held() {
        let intake = Intake::new(8, 100 * MIB);
        let first = intake.reserve(1, 0).unwrap();
        assert_eq!(first.bytes, 50 * MIB);
        assert!(first.take_one);
        // A second claim on its way at once: the other half, and no task of any size.
        let second = intake.reserve(1, 0).unwrap();
        assert_eq!(second.bytes, 50 * MIB);
        assert!(!second.take_one);
        assert_eq!(intake.reserve(1, 0), None, "the budget is reserved");
        // The first took one payload of 200 MiB, larger than the whole budget.
        intake.claimed(first, 1, 200 * MIB, Duration::from_millis(1));
        intake.unreserve(second);
        assert_eq!(intake.bytes(), (200 * MIB, 0));
        assert_eq!(
            intake.reserve(1, 0),
            None,
            "over budget: nothing more is claimed"
        );
        intake.done(200 * MIB);
        assert_eq!(intake.bytes(), (0, 0));
        assert!(intake.reserve(1, 0).unwrap().take_one);
    }

    #[test]
    fn no_room_is_reserved_for_a_task_larger_than_the_bytes_left() {
        let intake = Intake::new(8, 100 * MIB);
        let room = intake.reserve(1, 0).unwrap();
        intake.claimed(room, 1, 80 * MIB, Duration::from_millis(1));
        // 20 MiB are left: a claim for a task of 30 MiB would find nothing to take.
        assert_eq!(intake.reserve(1, 30 * MIB), None);
        assert_eq!(intake.bytes(), (80 * MIB, 0), "nothing stays reserved");
        assert_eq!(intake.reserve(1, 20 * MIB).unwrap().bytes, 20 * MIB);
    }

    #[test]
    fn bytes_held_leave_only_the_rest_of_the_budget() {
        let intake = Intake::new(8, 100 * MIB);
        let room = intake.reserve(1, 0).unwrap();
        intake.claimed(room, 1, 80 * MIB, Duration::from_millis(1));
        let room = intake.reserve(1, 0).unwrap();
        assert_eq!(room.bytes, 20 * MIB);
        assert!(!room.take_one);
    }

    #[tokio::test]
    async fn done_wakes_a_waiting_claimer() {
        let intake = std::sync::Arc::new(Intake::new(1, MIB));
        assert_eq!(claim_all(&intake, 1), 1);
        let waiter = {
            let intake = std::sync::Arc::clone(&intake);
            tokio::spawn(async move {
                intake.freed().await;
                tasks(intake.reserve(1, 0))
            })
        };
        intake.done(0);
        let reserved = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken within 5 s")
            .expect("waiter did not panic");
        assert_eq!(reserved, 1);
    }
}
