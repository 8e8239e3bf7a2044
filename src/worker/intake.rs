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
//! alone. With several lanes, one lane at a time may take such a task, and a lane claims no
//! more tasks than the permits they share could start, and none ahead (`shared.rs`). So the
//! bytes held stay under the budget plus the largest payload. A claim that
//! brought more than [`ROUND_TRIP_SAMPLE_MAX_BYTES`] of text is not timed: its round trip is
//! mostly the transfer, and it would make the intake claim far ahead of its workers.
//!
//! Callers: the worker's claim path reserves room and measures claims; each claimed task
//! measures its analysis and gives its room back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock, which a paused test runtime moves by hand; the system's otherwise.
use tokio::time::Instant;

use tokio::sync::Notify;

use super::shared::{Lanes, Shared};

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
    /// What the daemon's lanes share, when it has several (`shared.rs`).
    shared: Option<Arc<Shared>>,
    /// This lane's number among them.
    lane: usize,
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
        self.intake.publish_now(&state);
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
        Intake::sharing(concurrency, max_bytes, None)
    }

    /// The intake of one lane of a daemon, claiming also against what the lanes `shared`.
    pub fn sharing(concurrency: usize, max_bytes: u64, shared: Option<Arc<Shared>>) -> Intake {
        let lane = shared.as_ref().map_or(0, |shared| shared.join());
        Intake {
            concurrency,
            max_bytes: max_bytes.max(1),
            state: Mutex::new(State::default()),
            freed: Notify::new(),
            shared,
            lane,
        }
    }

    /// The most tasks a claim may take now of the `tasks` this lane's own target leaves: with
    /// shared permits, no more than those free now could start, less the tasks every lane has
    /// claimed and not started.
    fn startable(&self, lanes: Option<&Lanes>, tasks: usize) -> usize {
        match (&self.shared, lanes) {
            (Some(shared), Some(lanes)) => {
                tasks.min(shared.free_permits().saturating_sub(lanes.waiting()))
            }
            _ => tasks,
        }
    }

    /// Whether a claim may take a task of any size: this lane holds nothing, and no other
    /// lane holds or claims such a task.
    fn may_take_one(&self, state: &State, lanes: Option<&Lanes>) -> bool {
        state.bytes_held == 0
            && state.bytes_reserved == 0
            && lanes.is_none_or(|lanes| lanes.oversize.is_none_or(|lane| lane == self.lane))
    }

    /// Write this lane's tasks claimed and not started where the other lanes see them, and
    /// let go of the task of any size once this lane holds nothing.
    fn publish(&self, state: &State, lanes: &mut Lanes) {
        lanes.waiting[self.lane] = state.outstanding.saturating_sub(state.analyzing.len());
        if lanes.oversize == Some(self.lane) && state.bytes_held == 0 && state.bytes_reserved == 0 {
            lanes.oversize = None;
        }
    }

    /// [`Intake::publish`], taking the shared lock, when there are lanes to tell.
    fn publish_now(&self, state: &State) {
        if let Some(shared) = &self.shared {
            self.publish(state, &mut shared.lanes());
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
        let mut lanes = self.shared.as_ref().map(|shared| shared.lanes());
        let target = state.target(self.concurrency);
        let tasks = target.saturating_sub(state.outstanding).min(most);
        let tasks = self.startable(lanes.as_deref(), tasks);
        let take_one = self.may_take_one(&state, lanes.as_deref());
        let bytes = self
            .max_bytes
            .saturating_sub(state.bytes_held + state.bytes_reserved)
            .min((self.max_bytes / CLAIMS_SHARING_THE_BUDGET).max(1));
        if tasks == 0 || (!take_one && (bytes == 0 || bytes < need)) {
            return None;
        }
        state.outstanding += tasks;
        state.bytes_reserved += bytes;
        if let Some(lanes) = lanes.as_deref_mut() {
            if take_one {
                lanes.oversize = Some(self.lane);
            }
            self.publish(&state, lanes);
        }
        Some(Room {
            tasks,
            bytes,
            take_one,
        })
    }

    /// Whether [`Intake::reserve`] would find room for a claim of one task of no size now.
    pub fn has_room(&self) -> bool {
        let state = self.lock();
        let lanes = self.shared.as_ref().map(|shared| shared.lanes());
        let target = state.target(self.concurrency);
        let tasks = self.startable(lanes.as_deref(), target.saturating_sub(state.outstanding));
        let take_one = self.may_take_one(&state, lanes.as_deref());
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
            if let Some(shared) = &self.shared {
                let mut lanes = shared.lanes();
                // A claim that may take a task of any size took none over its room: the
                // exception is free for the other lanes again.
                if room.take_one && bytes <= room.bytes && lanes.oversize == Some(self.lane) {
                    lanes.oversize = None;
                }
                self.publish(&state, &mut lanes);
            }
        }
        self.freed.notify_one();
        self.wake_lanes();
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
        match &self.shared {
            None => self.freed.notified().await,
            Some(shared) => {
                tokio::select! {
                    _ = self.freed.notified() => {}
                    _ = shared.freed() => {}
                }
            }
        }
    }

    /// Every lane of the daemon looks for room again (bytes were given back).
    fn wake_lanes(&self) {
        if let Some(shared) = &self.shared {
            shared.wake();
        }
    }

    /// One claimed task left the intake (analyzed, or given up) and let go of its payload
    /// of `bytes`.
    pub fn done(&self, bytes: u64) {
        {
            let mut state = self.lock();
            state.outstanding = state.outstanding.saturating_sub(1);
            state.bytes_held = state.bytes_held.saturating_sub(bytes);
            self.publish_now(&state);
        }
        self.freed.notify_one();
        self.wake_lanes();
    }

    /// A worker starts on one task: the time until the returned guard is dropped is that
    /// task's time.
    pub fn analysis(&self) -> Analysis<'_> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.analyzing.insert(ticket, Instant::now());
        self.publish_now(&state);
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
mod tests;
