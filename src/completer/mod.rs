//! The completer: every write to a claim after its analyzer returned.
//!
//! The rule: **re-read, never re-run.** Once the analyzer has returned, its result stays in
//! memory until the database has answered for it. When a write's outcome is unknown (the
//! connection failed after the statement may have been sent), the row is re-read on a fresh
//! session and the result is accepted, written again, or dropped; the analyzer never runs
//! twice for one claim ("Re-read, never re-run" in docs/design.md).
//!
//! The worker hands over an [`Action`] for a [`Claim`] and gets back one final answer, a
//! `Result<TaskStatus, FinishError>`:
//!
//! - [`Completer::finish`] queues an outcome for the next batch (`batch.rs`): one statement and
//!   one transaction for many tasks, each row still fenced and written atomically. It returns
//!   as soon as the outcome is queued; the [`Pending`] it gives resolves to the answer. When
//!   the batch's statement fails, the claim is settled alone.
//! - [`Completer::write`] settles one claim alone, now: a release (a shutdown gives the claim
//!   back), or a finish that never ran its analyzer.
//!
//! Settling one claim alone retries until the database answers: while it is down, the claims
//! take turns on one shared backoff (`reachable.rs`); after an outcome that is unknown it
//! re-reads before writing again (`resolve.rs` holds that path, `decide.rs` the pure
//! decision it rests on, `tally.rs` what the log says of a burst of it). Claims settled
//! alone never take more than a quarter of the pool at once, and a claim whose row someone
//! else holds locked waits for it on one session at a time (docs/design.md, "No one else's
//! lock delays a batch"): however many claims a failed batch or a producer's open
//! transaction leaves to settle alone, the claims, the heartbeat and the rescuer still get
//! sessions. Only a stopping
//! daemon that has waited long enough for an unreachable database ends that:
//! [`Completer::give_up`] makes every claim still unsettled return, left RUNNING for its
//! lease to expire.
//!
//! Each task a finish ends FAILED gets one INFO line (`events::TASK_FAILED`): the finish
//! statement (`queue::finish`) answers the queue and attempt of those rows and logs it; a
//! re-read that finds a FAILED end landed, its answer lost, logs it too.
//!
//! Callers: [`crate::worker`] starts one completer and hands it every settled claim.

mod batch;
mod decide;
mod reachable;
mod resolve;
mod tally;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::db::{DbError, Pool};
use crate::metrics::Metrics;
use crate::queue::{FinishError, Outcome, TaskStatus};

use batch::{BatchFailed, Completion};
use resolve::Why;

/// What to write to a claim once its analyzer returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Commit the terminal status and the results.
    Finish(Outcome),
    /// Give the claim back (a shutdown stopped the analyzer, or it never started).
    Release,
}

/// One claim that this instance holds: the task, its attempt, and the claim's token, on
/// which every write is fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub id: i64,
    pub attempt: i32,
    pub token: i64,
}

/// The handle workers hand their settled claims to. The batching task ends when the last
/// handle is dropped.
#[derive(Clone)]
pub struct Completer {
    tx: mpsc::Sender<Completion>,
    shared: Arc<Shared>,
}

/// What settling one claim alone needs.
struct Shared {
    pool: Pool,
    metrics: Arc<Metrics>,
    /// Claims being written alone at once: a quarter of the pool, at least one.
    alone: Semaphore,
    /// Claims waiting for a row that someone else holds locked: one at a time.
    lock_wait: Semaphore,
    /// What settling alone came to since the last summary line.
    tally: tally::Tally,
    /// Fired by [`Completer::give_up`]: claims still waiting for the database return.
    give_up: CancellationToken,
    /// The claims that returned unsettled because of it, and what was to be written to them,
    /// for the stop's last look ([`Completer::take_abandoned`]).
    given_up: std::sync::Mutex<Vec<(Claim, Action)>>,
    /// The turns of the claims settled alone while the database refuses them.
    reachable: Arc<reachable::Reachable>,
    /// The turns of the claims settled alone while the server is out of a resource (a full
    /// disk): woken only by a finish that worked (a batch's too), not by the heartbeat's
    /// writes, which may still fit where a finish does not.
    exhausted: Arc<reachable::Reachable>,
    /// This completer's results held for room (the gauge counts every lane's).
    held_for_room: std::sync::atomic::AtomicUsize,
    /// Shared by the lease heartbeat's statements in flight ([`Completer::heartbeat_turn`]);
    /// taken alone by a claim that found its row locked, for one more try that no heartbeat
    /// of this daemon's can hold up: a lock found then is someone else's.
    heartbeat: Arc<tokio::sync::RwLock<()>>,
}

impl Shared {
    /// A claim given up on: counted, kept with its action for the stop's last look, and
    /// answered as an outage.
    fn abandon(&self, claim: Claim, action: &Action) -> Result<TaskStatus, FinishError> {
        self.given_up().push((claim, action.clone()));
        Err(FinishError::Db(DbError::unavailable(
            "the stop's bound passed before the database took it",
        )))
    }

    fn given_up(&self) -> std::sync::MutexGuard<'_, Vec<(Claim, Action)>> {
        self.given_up
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Completer {
    /// Start the batching task, with room for `capacity` outcomes waiting to be committed.
    pub fn start(pool: Pool, capacity: usize, metrics: Arc<Metrics>) -> Completer {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let reachable = Arc::new(reachable::Reachable::default());
        let exhausted = Arc::new(reachable::Reachable::default());
        tokio::spawn(batch::run(
            pool.clone(),
            rx,
            Arc::clone(&reachable),
            Arc::clone(&exhausted),
        ));
        let alone = Semaphore::new((pool.max_size() / 4).max(1));
        Completer {
            tx,
            shared: Arc::new(Shared {
                pool,
                metrics,
                alone,
                lock_wait: Semaphore::new(1),
                tally: tally::Tally::default(),
                give_up: CancellationToken::new(),
                given_up: std::sync::Mutex::new(Vec::new()),
                reachable,
                exhausted,
                held_for_room: std::sync::atomic::AtomicUsize::new(0),
                heartbeat: Arc::new(tokio::sync::RwLock::new(())),
            }),
        }
    }

    /// Stop waiting for the database: every claim still retrying its write, or waiting for
    /// its batch, returns at once, unsettled. Its row stays RUNNING under this daemon's lease,
    /// which expires; then a daemon runs the task again. Only for a stop that has waited long
    /// enough.
    pub fn give_up(&self) {
        self.shared.give_up.cancel();
    }

    /// Whether [`Completer::give_up`] was called.
    pub fn gave_up(&self) -> bool {
        self.shared.give_up.is_cancelled()
    }

    /// How many claims [`Completer::give_up`] left unsettled (until they are taken).
    pub fn abandoned(&self) -> usize {
        self.shared.given_up().len()
    }

    /// The claims [`Completer::give_up`] left unsettled, each with what was to be written
    /// to it: the stop's last look writes them once more (fenced on their tokens, so a
    /// write that landed meanwhile is not written twice) before giving back the rest.
    pub fn take_abandoned(&self) -> Vec<(Claim, Action)> {
        std::mem::take(&mut *self.shared.given_up())
    }

    /// How many of this completer's results are held because the database refused their
    /// finish for want of room.
    pub fn held_for_room(&self) -> usize {
        self.shared
            .held_for_room
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The database took a write of the daemon's (the lease heartbeat): a claim waiting its
    /// turn to be settled alone tries again now.
    pub fn database_answered(&self) {
        self.shared.reachable.worked();
    }

    /// Held by the lease heartbeat while its statement, which locks the rows it extends for
    /// a moment, is in flight: a claim settled alone that found its row locked tries again
    /// once none is, before it takes the lock for someone else's and parks its result. Take
    /// it with a session in hand, as the claims do, and for one statement only.
    pub async fn heartbeat_turn(&self) -> tokio::sync::OwnedRwLockReadGuard<()> {
        Arc::clone(&self.shared.heartbeat).read_owned().await
    }

    /// The daemon is stopping: claims waiting their turn to be settled alone try again now,
    /// and at least every 200 ms from now on, so that the stop's bound is not spent asleep.
    pub fn hurry(&self) {
        self.shared.reachable.hurry();
        self.shared.exhausted.hurry();
    }

    /// Queue `outcome` of `claim` for the next batch, waiting for room in the queue. Returns
    /// once it is queued; the [`Pending`] resolves to the final answer.
    pub async fn finish(&self, claim: Claim, outcome: Outcome) -> Pending {
        let action = Action::Finish(outcome.clone());
        let answer = queue_finish(&self.tx, claim, outcome).await;
        Pending {
            shared: Arc::clone(&self.shared),
            tx: self.tx.clone(),
            claim,
            action,
            answer,
        }
    }

    /// Apply `action` to `claim` alone, retrying until the database answers.
    ///
    /// # Errors
    ///
    /// [`FinishError::NotRunning`] when the claim was lost, [`FinishError::NotFound`] when the
    /// task was deleted: the result is dropped. Database failures are retried, and returned
    /// only after [`Completer::give_up`].
    pub async fn write(&self, claim: Claim, action: &Action) -> Result<TaskStatus, FinishError> {
        // Boxed, here and in `Pending::answer`: settling alone is the rare path, and its large
        // future would otherwise be part of every claim's task, copied at each spawn.
        Box::pin(resolve::write_alone(
            &self.shared,
            claim,
            action,
            Why::Alone,
        ))
        .await
    }
}

/// How many more batches a finish whose row was locked goes into before it is written alone:
/// the lock is most often this daemon's own heartbeat, held for a moment.
const LOCKED_BATCHES: usize = 3;

/// Queue `outcome` of `claim` for a batch; the receiver gets the batch's answer.
async fn queue_finish(
    tx: &mpsc::Sender<Completion>,
    claim: Claim,
    outcome: Outcome,
) -> Result<oneshot::Receiver<batch::Answer>, BatchFailed> {
    let (reply, answer) = oneshot::channel();
    let finish = crate::queue::Finish {
        id: claim.id,
        token: claim.token,
        outcome,
    };
    match tx.send(Completion { finish, reply }).await {
        Ok(()) => Ok(answer),
        Err(_) => Err(BatchFailed::Stopped),
    }
}

/// A finish queued for a batch; [`Pending::answer`] waits for its final answer.
#[must_use = "the claim is settled only once its answer is awaited"]
pub struct Pending {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Completion>,
    claim: Claim,
    action: Action,
    answer: Result<oneshot::Receiver<batch::Answer>, BatchFailed>,
}

impl Pending {
    /// The final answer for the claim: the batch's, or, when the batch failed, that of
    /// settling the claim alone.
    ///
    /// # Errors
    ///
    /// As [`Completer::write`].
    pub async fn answer(mut self) -> Result<TaskStatus, FinishError> {
        let Claim { id, attempt, .. } = self.claim;
        let mut batches_left = LOCKED_BATCHES;
        let failed = loop {
            let receiver = match self.answer {
                Ok(receiver) => receiver,
                Err(failed) => break failed,
            };
            match tokio::select! {
                biased;
                answer = receiver => answer,
                _ = self.shared.give_up.cancelled() => return self.shared.abandon(self.claim, &self.action),
            } {
                // Someone else held the row for a moment (often this daemon's heartbeat):
                // into the next batch, a few times.
                Ok(Ok(Err(FinishError::Locked))) if batches_left > 0 => {
                    if let Action::Finish(outcome) = &self.action {
                        batches_left -= 1;
                        self.answer = queue_finish(&self.tx, self.claim, outcome.clone()).await;
                        continue;
                    }
                    batches_left = 0;
                    self.answer = Err(BatchFailed::Stopped);
                    continue;
                }
                // Still held: the batch did not wait; this claim alone does.
                Ok(Ok(Err(FinishError::Locked))) => {
                    tracing::debug!(
                        id,
                        attempt,
                        "row locked by another transaction; finishing the task alone"
                    );
                    return Box::pin(resolve::write_alone(
                        &self.shared,
                        self.claim,
                        &self.action,
                        Why::Locked,
                    ))
                    .await;
                }
                Ok(Ok(result)) => return result,
                Ok(Err(failed)) => break failed,
                // The batching task dropped the finish unanswered: it may have been sent.
                Err(_) => {
                    return Box::pin(resolve::write_alone(
                        &self.shared,
                        self.claim,
                        &self.action,
                        Why::OutcomeUnknown,
                    ))
                    .await
                }
            }
        };
        let outcome_unknown = failed.outcome_unknown();
        // The batch said so once for all its claims.
        tracing::debug!(
            id,
            attempt,
            outcome_unknown,
            error = failed.to_string(),
            "batched finish failed; settling the task alone"
        );
        let why = match outcome_unknown {
            true => Why::OutcomeUnknown,
            false => Why::BatchRefused,
        };
        Box::pin(resolve::write_alone(
            &self.shared,
            self.claim,
            &self.action,
            why,
        ))
        .await
    }
}
