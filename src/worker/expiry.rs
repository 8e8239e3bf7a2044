//! Leases that run out without a heartbeat: a daemon cut off from the database (an outage, a
//! network partition, a session that hangs) cannot extend its leases, and once they expire
//! the rescuer of another daemon, or its own after the outage, claims the tasks again. Their
//! work must not go on beside the new claim's.
//!
//! Each running claim keeps, by this daemon's clock, when its lease runs out at the latest
//! (`registry.rs`: the instant before the claim or the last heartbeat that wrote it, plus
//! `worker.lease`). A loop of its own, apart from the heartbeat (which may hang on a session
//! for up to the pool's deadline), checks every [`tick`] and stops the work of each claim
//! whose lease runs out within [`MARGIN_TICKS`] ticks (and, for an `exec` child, its
//! `kill_after` before that, at most half a lease: [`stop_ahead`]): its cancellation token fires, as for a
//! user's cancel, but the claim is then given back (QUEUED, if the database still has it as
//! this daemon's), never finished CANCELED. An `exec` child gets SIGTERM, then SIGKILL after
//! `kill_after`; a request of an `http` handler is dropped; an analyzer stops at its next
//! check. A claim whose analyzer has returned is left to its write, which its fence decides.
//! The work of a claim whose lease runs out before it starts is never started
//! (`execute.rs`): a daemon paused between a claim and its start (SIGSTOP, a debugger), or a
//! claim answered after its lease, would otherwise run a task another daemon may have taken.

use std::time::{Duration, Instant};

use super::Worker;
use crate::config::HandlerConfig;

/// How many ticks before the lease runs out the work is stopped, so that it has stopped
/// before a rescuer can claim the task again.
const MARGIN_TICKS: u32 = 2;

/// How often the leases are checked: a twentieth of the lease, from 10 ms to a second.
fn tick(lease: Duration) -> Duration {
    (lease / 20).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// How long before its lease runs out a claim's work is stopped, or not started
/// (`execute.rs`): [`MARGIN_TICKS`] ticks.
pub(super) fn margin(lease: Duration) -> Duration {
    tick(lease) * MARGIN_TICKS
}

/// How long before its lease runs out a claim's work is stopped, or not started: the
/// [`margin`], and for an `exec` child its `kill_after` too (at most half the lease), so
/// that its SIGKILL has landed, not just its SIGTERM, before a rescuer can claim the task
/// again. A `kill_after` over half the lease can still overlap by what is over.
pub(super) fn stop_ahead(lease: Duration, kill_after: Option<Duration>) -> Duration {
    margin(lease) + kill_after.map_or(Duration::ZERO, |kill| kill.min(lease / 2))
}

/// How many ids of the claims stopped one WARN line names (the rest are at debug).
const IDS_SAID: usize = 10;

impl Worker {
    /// [`stop_ahead`] for this lane's handler.
    pub(super) fn stop_ahead(&self) -> Duration {
        let kill_after = match self.inner.handler.as_ref().map(|lane| &lane.queue.handler) {
            Some(HandlerConfig::Exec(spec)) => Some(spec.kill_after),
            _ => None,
        };
        stop_ahead(self.inner.config.lease, kill_after)
    }

    /// Stop the work of the claims whose leases run out without a heartbeat, until the
    /// heartbeat stops (after the last task of a shutdown).
    pub(super) async fn expire_leases(self) {
        let tick = tick(self.inner.config.lease);
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // One WARN line a minute at most (an outage stops claims at many ticks): the first,
        // then the ones stopped since, counted.
        let mut warned_at: Option<Instant> = None;
        let mut unsaid = 0usize;
        // The first ids of those, for the line.
        let mut unsaid_ids: Vec<i64> = Vec::new();
        loop {
            tokio::select! {
                _ = self.inner.heartbeat_stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let expired = self
                .inner
                .running
                .expire(Instant::now() + self.stop_ahead());
            let never_started = self.inner.running.take_stopped_before_start();
            if expired.is_empty() && never_started == 0 {
                continue;
            }
            for (id, attempt) in &expired {
                tracing::debug!(
                    id,
                    attempt,
                    "lease runs out without a heartbeat; stopping its work"
                );
            }
            unsaid += expired.len() + never_started;
            let room = IDS_SAID.saturating_sub(unsaid_ids.len());
            unsaid_ids.extend(expired.iter().map(|(id, _)| *id).take(room));
            if warned_at.is_some_and(|at| at.elapsed() < crate::repeats::REMINDER) {
                continue;
            }
            warned_at = Some(Instant::now());
            tracing::warn!(
                tasks = std::mem::take(&mut unsaid),
                ids = ?std::mem::take(&mut unsaid_ids),
                lease = ?self.inner.config.lease,
                "leases ran out without a heartbeat (none reached the database in time: an \
                 outage, a partition, another transaction holding the tasks' rows, a claim \
                 answered late, or this daemon paused): their work is stopped, or never \
                 started, and the tasks are given back, so that it never runs beside a new \
                 claim's"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tick_is_a_twentieth_of_the_lease_from_ten_milliseconds_to_a_second() {
        assert_eq!(tick(Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(tick(Duration::from_secs(2)), Duration::from_millis(100));
        assert_eq!(tick(Duration::from_millis(50)), Duration::from_millis(10));
    }

    #[test]
    fn an_exec_child_is_stopped_its_kill_after_earlier_at_most_half_a_lease() {
        let lease = Duration::from_secs(30);
        assert_eq!(stop_ahead(lease, None), Duration::from_secs(2));
        assert_eq!(
            stop_ahead(lease, Some(Duration::from_secs(10))),
            Duration::from_secs(12)
        );
        assert_eq!(
            stop_ahead(lease, Some(Duration::from_secs(60))),
            Duration::from_secs(17)
        );
    }
}
