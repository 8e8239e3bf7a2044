//! The running-task registry: the claims this worker holds, from their claim until they are
//! settled, each with the cancellation token that stops its analyzer.
//!
//! The cancel paths find a task's token here (a user's cancel, the heartbeat's read of
//! `cancel_requested` or of a lost lease); the heartbeat extends the leases of a snapshot; the
//! clean-up of an unanswered claim gives back the rows this instance holds that are not here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

/// A task this worker runs, as the cancel paths find it.
#[derive(Debug, Clone)]
pub(super) struct Running {
    pub(super) attempt: i32,
    /// The claim's token (docs/design.md, "One claim, one token").
    pub(super) token: i64,
    /// Stops the analyzer; a child of the worker's abort token.
    pub(super) cancel: CancellationToken,
    /// The analyzer has returned: what is left is the write, which its fence decides.
    pub(super) analyzed: bool,
    /// By this daemon's clock, no later than the database's `lease_expires_at` as last
    /// written: the time before the statement that wrote it was sent, plus the lease.
    pub(super) lease_until: Instant,
    /// The lease ran out without a heartbeat (`expiry.rs`): the work was stopped, and the
    /// claim is given back, not finished CANCELED.
    pub(super) lease_expired: bool,
}

/// The claims this worker holds, by task id.
#[derive(Debug, Default)]
pub(super) struct Registry {
    tasks: Mutex<HashMap<i64, Running>>,
    /// Claims whose lease had run out when their work was to start, since the expiry loop
    /// last said so.
    stopped_before_start: AtomicUsize,
}

impl Registry {
    /// Task `id` was claimed at `attempt` with `token`, its lease good until `lease_until`;
    /// `cancel` stops its analyzer.
    pub(super) fn insert(
        &self,
        id: i64,
        attempt: i32,
        token: i64,
        cancel: CancellationToken,
        lease_until: Instant,
    ) {
        self.lock().insert(
            id,
            Running {
                attempt,
                token,
                cancel,
                analyzed: false,
                lease_until,
                lease_expired: false,
            },
        );
    }

    /// The leases of these `(id, token)` claims were extended until `until`.
    pub(super) fn extended(&self, claims: &[(i64, i64)], until: Instant) {
        let mut tasks = self.lock();
        for (id, token) in claims {
            if let Some(task) = tasks.get_mut(id).filter(|task| task.token == *token) {
                task.lease_until = task.lease_until.max(until);
            }
        }
    }

    /// Stop the work of every claim whose lease runs out before `by` and whose analyzer has
    /// not returned: each is marked [`Running::lease_expired`] and its token cancelled. Their
    /// ids and attempts.
    pub(super) fn expire(&self, by: Instant) -> Vec<(i64, i32)> {
        let mut tasks = self.lock();
        let mut expired = Vec::new();
        for (id, task) in tasks.iter_mut() {
            if !task.analyzed && !task.lease_expired && task.lease_until <= by {
                task.lease_expired = true;
                task.cancel.cancel();
                expired.push((*id, task.attempt));
            }
        }
        expired
    }

    /// Whether claim `token` of task `id` still holds its lease at `by`, as its work is about
    /// to start. A claim whose lease runs out before then (its answer came late, or the daemon
    /// was paused between the claim and the start) is marked as [`Registry::expire`] marks
    /// one, and counted for the expiry loop to say ([`Registry::take_stopped_before_start`]).
    pub(super) fn leased_at(&self, id: i64, token: i64, by: Instant) -> bool {
        let mut tasks = self.lock();
        let Some(task) = tasks.get_mut(&id).filter(|task| task.token == token) else {
            return false;
        };
        if task.lease_expired {
            return false;
        }
        if task.lease_until > by {
            return true;
        }
        task.lease_expired = true;
        task.cancel.cancel();
        self.stopped_before_start.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// How many claims [`Registry::leased_at`] stopped since the last call.
    pub(super) fn take_stopped_before_start(&self) -> usize {
        self.stopped_before_start.swap(0, Ordering::Relaxed)
    }

    /// Whether claim `token` of task `id` was stopped because its lease ran out.
    pub(super) fn lease_expired(&self, id: i64, token: i64) -> bool {
        self.lock()
            .get(&id)
            .is_some_and(|task| task.token == token && task.lease_expired)
    }

    /// Task `id`'s analyzer has returned, for its claim `token`.
    pub(super) fn analyzed(&self, id: i64, token: i64) {
        if let Some(task) = self.lock().get_mut(&id) {
            if task.token == token {
                task.analyzed = true;
            }
        }
    }

    /// Task `id`'s claim `token` is settled. A later claim of the same task, which replaced
    /// it, stays.
    pub(super) fn remove(&self, id: i64, token: i64) {
        let mut tasks = self.lock();
        if tasks.get(&id).is_some_and(|task| task.token == token) {
            tasks.remove(&id);
        }
    }

    /// Task `id`'s attempt and cancellation token, if this worker runs it.
    pub(super) fn get(&self, id: i64) -> Option<Running> {
        self.lock().get(&id).cloned()
    }

    /// Whether this worker runs task `id`.
    pub(super) fn contains(&self, id: i64) -> bool {
        self.lock().contains_key(&id)
    }

    /// How many tasks this worker runs.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Every claim held now, as `(id, token)`.
    pub(super) fn snapshot(&self) -> Vec<(i64, i64)> {
        self.lock()
            .iter()
            .map(|(id, task)| (*id, task.token))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i64, Running>> {
        self.tasks.lock().expect("running-task registry poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_found_until_it_is_removed() {
        let registry = Registry::default();
        let token = CancellationToken::new();
        registry.insert(7, 2, 20, token.clone(), Instant::now());
        assert!(registry.contains(7));
        assert_eq!(registry.len(), 1);
        let running = registry.get(7).expect("registered");
        assert_eq!(running.attempt, 2);
        running.cancel.cancel();
        assert!(token.is_cancelled(), "the token found is the task's own");

        registry.remove(7, 20);
        assert!(!registry.contains(7));
        assert!(registry.get(7).is_none());
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn a_claim_is_marked_analyzed_once_its_analyzer_returned() {
        let registry = Registry::default();
        registry.insert(4, 1, 10, CancellationToken::new(), Instant::now());
        assert!(!registry.get(4).unwrap().analyzed);
        registry.analyzed(4, 10);
        assert!(registry.get(4).unwrap().analyzed);
        registry.analyzed(5, 10);
        assert!(registry.get(5).is_none());
    }

    #[test]
    fn removing_an_unknown_task_changes_nothing() {
        let registry = Registry::default();
        registry.insert(1, 1, 10, CancellationToken::new(), Instant::now());
        registry.remove(2, 10);
        assert_eq!(registry.snapshot(), vec![(1, 10)]);
    }

    #[test]
    fn a_snapshot_lists_every_claim_with_its_token() {
        let registry = Registry::default();
        registry.insert(1, 1, 10, CancellationToken::new(), Instant::now());
        registry.insert(2, 5, 50, CancellationToken::new(), Instant::now());
        registry.insert(3, 2, 20, CancellationToken::new(), Instant::now());
        let mut snapshot = registry.snapshot();
        snapshot.sort();
        assert_eq!(snapshot, vec![(1, 10), (2, 50), (3, 20)]);
    }

    #[test]
    fn a_new_claim_on_the_same_task_replaces_the_old_one() {
        let registry = Registry::default();
        registry.insert(1, 1, 10, CancellationToken::new(), Instant::now());
        registry.insert(1, 2, 20, CancellationToken::new(), Instant::now());
        assert_eq!(registry.snapshot(), vec![(1, 20)]);
    }

    #[test]
    fn the_old_claim_settling_leaves_the_new_claim_of_the_same_task() {
        let registry = Registry::default();
        registry.insert(1, 1, 10, CancellationToken::new(), Instant::now());
        registry.insert(1, 2, 20, CancellationToken::new(), Instant::now());
        registry.analyzed(1, 10);
        registry.remove(1, 10);
        let running = registry.get(1).expect("the new claim stays");
        assert_eq!(running.attempt, 2);
        assert!(
            !running.analyzed,
            "the old claim's analyzer is not the new one's"
        );
        registry.remove(1, 20);
        assert!(!registry.contains(1));
    }

    #[test]
    fn a_lease_run_out_without_a_heartbeat_stops_the_work_once() {
        let registry = Registry::default();
        let start = Instant::now();
        let second = std::time::Duration::from_secs(1);
        let (a, b, c) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        registry.insert(1, 1, 10, a.clone(), start + second);
        registry.insert(2, 3, 20, b.clone(), start + second);
        registry.insert(3, 1, 30, c.clone(), start + second);
        // 2 was extended; 3's analyzer returned (its write decides).
        registry.extended(&[(2, 20), (1, 99)], start + 3 * second);
        registry.analyzed(3, 30);
        assert!(registry.expire(start).is_empty());
        assert_eq!(registry.expire(start + second), vec![(1, 1)]);
        assert!(a.is_cancelled() && !b.is_cancelled() && !c.is_cancelled());
        assert!(registry.lease_expired(1, 10) && !registry.lease_expired(1, 11));
        assert!(!registry.lease_expired(2, 20));
        assert!(registry.expire(start + second).is_empty(), "once");
        assert_eq!(registry.expire(start + 3 * second), vec![(2, 3)]);
    }
}
