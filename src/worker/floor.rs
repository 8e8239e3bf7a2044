//! Where a claim starts. Claims start from the front of the queue, except while those
//! claims are slow: a held xmin horizon leaves the entries of every task claimed since at the
//! front of the claim index, and each claim from the start walks them all. After a claim from
//! the start that was slow for what it took ([`Floor::record`]), the next claims start after
//! the last task claimed ([`Floor`]), for a hundred times its duration and at most half a
//! poll interval; then one claims from the start again, and while it is on its way the others
//! still claim after the position: while there is a position, claims from the start that walk
//! a held horizon's entries do not take both claim slots. The position stays while the queue
//! is drained (a claim that found less than it had room for, or nothing, keeps it): new tasks
//! come after it, and a queue kept just drained under a held horizon claims from the start
//! once a window, not at every wake-up. What such a claim cannot see (a task of a higher
//! priority inserted since, one given back or retried, a late commit of a lower id) waits at
//! most until the next claim from the start has come back: one and a half poll intervals plus
//! that claim's own duration (docs/design.md, "Claims after a position"). Only a worker of one queue does
//! this.

use std::time::{Duration, Instant};

use crate::queue::Position;

/// A claim from the start at least this much slower than a claim usually takes
/// ([`Usual`]: the round trip included), plus [`SLOW_PER_TASK`] for each task it
/// took, makes the next claims start after a position. A claim of one task takes about a
/// millisecond over a local socket and one of 500 short texts a few; one that walks the index
/// entries left by a held horizon takes tens to thousands.
const SLOW_CLAIM: Duration = Duration::from_millis(5);

/// What each task a claim took adds to [`SLOW_CLAIM`]: a claim of 500 is slow from 15 ms
/// over the usual.
const SLOW_PER_TASK: Duration = Duration::from_micros(20);

/// How many times a slow claim from the start's duration the claims after a position go on.
/// The scan of a drained queue is one claim at a time, and the tasks that arrive while a slow
/// claim from the start is on its way wait for it: one in a hundred claims' time, not one in
/// ten, keeps that wait out of the 99th percentile of a held horizon's soak.
const AFTER_SLOW_CLAIM: u32 = 100;

/// The latest claim from the start.
#[derive(Debug, Clone, Copy)]
struct FromStart {
    ended: Instant,
    took: Duration,
    /// Slow for what it took.
    slow: bool,
}

/// Where the next claim may start, and what the last claim from the start cost.
#[derive(Debug, Default)]
pub(super) struct Floor {
    /// The last task claimed, in claim order, since the latest claim from the start that took
    /// any.
    at: Option<Position>,
    from_start: Option<FromStart>,
    /// Claims from the start on their way.
    starting: usize,
    /// What a claim costs with nothing to walk: the round trip to the server and the
    /// statement's own work.
    usual: Option<Usual>,
}

/// How long the fastest claim is remembered: [`Usual`] is the fastest of the last one to two
/// of these.
const USUAL_OVER: Duration = Duration::from_secs(60);

/// What a claim usually takes: the fastest claim sent in the last one to two minutes. The
/// fastest, so that a held horizon's walk, which grows with every claim from the start while
/// there is no position yet, never becomes the usual (and once there is one, the claims after
/// it are the fastest); of the last minutes only, so that a server further away (after a
/// failover) is learned within two.
#[derive(Debug, Clone, Copy)]
struct Usual {
    since: Instant,
    fastest: Duration,
    /// The fastest of the minute before `since`.
    before: Option<Duration>,
}

impl Usual {
    fn get(&self) -> Duration {
        self.before
            .map_or(self.fastest, |before| before.min(self.fastest))
    }

    fn learn(&mut self, took: Duration, now: Instant) {
        if now.saturating_duration_since(self.since) >= USUAL_OVER {
            self.before = Some(self.fastest);
            self.since = now;
            self.fastest = took;
        } else {
            self.fastest = self.fastest.min(took);
        }
    }
}

impl Floor {
    /// Where the claim about to be sent at `now` starts: after [`Floor::at`] while the latest
    /// claim from the start was slow and either ended less than a hundred times its duration
    /// ago (at most half of `poll`) or has a successor on its way; `None`: from the start, and
    /// then that claim is the one on its way until [`Floor::record`] or [`Floor::abandon`] is
    /// called for it. Half a poll interval: a scan within it may put the worker's next one
    /// off, but that one comes at most a poll interval later and claims from the start, so a
    /// task before the position waits at most one and a half poll intervals and that claim.
    pub(super) fn next(&mut self, now: Instant, poll: Duration) -> Option<Position> {
        let after = self.at.zip(self.from_start).and_then(|(at, start)| {
            let window = (start.took * AFTER_SLOW_CLAIM).min(poll / 2);
            let recent = now.saturating_duration_since(start.ended) < window;
            (start.slow && (recent || self.starting > 0)).then_some(at)
        });
        if after.is_none() {
            self.starting += 1;
        }
        after
    }

    /// A claim that started `after` (or from the start) failed: nothing is learned from it.
    pub(super) fn abandon(&mut self, after: Option<Position>) {
        if after.is_none() {
            self.starting = self.starting.saturating_sub(1);
        }
    }

    /// Record a claim that started `after` (or from the start), took `took`, ended at `now`
    /// and claimed `claimed` tasks, `last` the last of them in claim order; `left_out`: the
    /// byte budget left out the next due task.
    pub(super) fn record(
        &mut self,
        after: Option<Position>,
        took: Duration,
        now: Instant,
        claimed: usize,
        last: Option<Position>,
        left_out: bool,
    ) {
        let usual = self.usual.map_or(Duration::ZERO, |usual| usual.get());
        // A claim that was never sent (nothing to claim from, no room) took no time to learn.
        if !took.is_zero() {
            match &mut self.usual {
                Some(usual) => usual.learn(took, now),
                None => {
                    self.usual = Some(Usual {
                        since: now,
                        fastest: took,
                        before: None,
                    })
                }
            }
        }
        if after.is_none() {
            let per_task = SLOW_PER_TASK.saturating_mul(u32::try_from(claimed).unwrap_or(u32::MAX));
            self.from_start = Some(FromStart {
                ended: now,
                took,
                slow: took >= usual + SLOW_CLAIM.saturating_add(per_task),
            });
            self.starting = self.starting.saturating_sub(1);
            // What it took replaces the positions before it (it may have found a task of a
            // higher priority, before them in claim order). One that found nothing saw no
            // QUEUED task before them: they stay, unless the byte budget left out the first
            // task it found, which may be before them: the next claim starts from the start
            // again, and the one that waits for that task's room takes it.
            if last.is_some() {
                self.at = last;
            } else if left_out {
                self.at = None;
            }
        } else if let Some(last) = last {
            // A claim after a position was sent while there was one: none now means a claim
            // from the start cleared it since, for a task left out before it. It stays cleared.
            self.at = self.at.map(|at| at.max(last));
        }
    }
}

/// A claim the [`Floor`] chose a start for and has not been told about yet: dropped before
/// [`Floor::record`] (the claim failed, panicked or was dropped), it abandons the claim, so
/// that a claim from the start never stays counted as on its way.
pub(super) struct Pending<'a> {
    pub(super) floor: &'a std::sync::Mutex<Floor>,
    pub(super) after: Option<Position>,
    pub(super) recorded: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            if let Ok(mut floor) = self.floor.lock() {
                floor.abandon(self.after);
            }
        }
    }
}

#[cfg(test)]
mod tests;
