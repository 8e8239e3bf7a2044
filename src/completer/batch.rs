//! The batching task: commits queued finishes many at a time, one statement and one
//! transaction for many tasks, while each row is still fenced and gets its status and counts
//! atomically (`queue::finish_many`).
//!
//! Batches form by themselves: while [`BATCHES_IN_FLIGHT`] batches are being committed, the
//! next accumulates in the channel, so an idle daemon commits at once and a busy one commits
//! many rows per round trip. Two at once, not one: the server works on one finish while the
//! other's commit waits for its WAL flush (a drain went from 84-86% of `bench --mode ceiling`
//! to 93-99% in the same runs: docs/performance.md). Batches are independent: each claim is
//! in one, and each batch answers for its own claims. When a batch's statement fails, every
//! claim in it learns why, and whether the outcome is unknown (an outage: re-read, never
//! re-run) or known to be nothing (the server refused: write again);
//! [`super::Pending::answer`] then settles each claim alone.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinSet;

use crate::db::{DbError, Pool, Session};
use crate::queue::{self, Finish, FinishError, TaskStatus};
use crate::repeats::{log_failure, log_recovery, Repeats};

use super::reachable::Reachable;

/// The most rows one finish statement commits.
const MAX_BATCH: usize = 512;
/// Finish statements that may be on their way at once.
const BATCHES_IN_FLIGHT: usize = 2;

/// What a queued finish learns from its batch.
pub(super) type Answer = Result<Result<TaskStatus, FinishError>, BatchFailed>;

/// The batch did not answer for the claim; it must be settled alone.
#[derive(Debug, Clone)]
pub(super) enum BatchFailed {
    /// The batch's statement failed, for every claim in it.
    Statement(Arc<FinishError>),
    /// The batching task has stopped: the finish was never sent.
    Stopped,
}

impl BatchFailed {
    /// Whether the statement may have committed: the connection failed after it may have
    /// been sent.
    pub(super) fn outcome_unknown(&self) -> bool {
        match self {
            BatchFailed::Statement(err) => {
                matches!(&**err, FinishError::Db(db) if db.is_unavailable())
            }
            BatchFailed::Stopped => false,
        }
    }
}

impl fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchFailed::Statement(err) => err.fmt(f),
            BatchFailed::Stopped => f.write_str("the completer has stopped"),
        }
    }
}

/// A queued finish and where its answer goes.
pub(super) struct Completion {
    pub(super) finish: Finish,
    pub(super) reply: oneshot::Sender<Answer>,
}

/// Commit batches until the last sender is dropped, up to [`BATCHES_IN_FLIGHT`] at once.
pub(super) async fn run(
    pool: Pool,
    mut rx: mpsc::Receiver<Completion>,
    reachable: Arc<Reachable>,
    exhausted: Arc<Reachable>,
) {
    let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    // Every batch fails while the database is away: said once, not once a batch.
    let failures = Arc::new(Repeats::new());
    let mut commits = JoinSet::new();
    let mut carried = None;
    loop {
        // A batch forms only once it can be sent: while every slot is busy, it accumulates.
        let slot = Arc::clone(&slots)
            .acquire_owned()
            .await
            .expect("never closed");
        let first = match carried.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => break,
            },
        };
        let batch = gather(first, &mut rx, &mut carried);
        let pool = pool.clone();
        let failures = Arc::clone(&failures);
        let reachable = Arc::clone(&reachable);
        let exhausted = Arc::clone(&exhausted);
        commits.spawn(async move {
            commit(&pool, &failures, [&reachable, &exhausted], batch).await;
            drop(slot);
        });
        while let Some(done) = commits.try_join_next() {
            said_if_panicked(done);
        }
    }
    while let Some(done) = commits.join_next().await {
        said_if_panicked(done);
    }
}

/// A batch: `first` and what else is queued, up to [`MAX_BATCH`], ending before a second
/// finish of a task already in it, which is left in `carried` to start the next batch. One
/// daemon may hold two claims of one task (its lease expired while its analyzer ran, and it
/// claimed the task again): `pgtaskd.finish` answers per task id, so in one statement the
/// stale claim would be told the new claim's write, and the new one nothing.
fn gather(
    first: Completion,
    rx: &mut mpsc::Receiver<Completion>,
    carried: &mut Option<Completion>,
) -> Vec<Completion> {
    let mut ids = HashSet::from([first.finish.id]);
    let mut batch = Vec::with_capacity(MAX_BATCH);
    batch.push(first);
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(completion) if ids.insert(completion.finish.id) => batch.push(completion),
            Ok(again) => {
                *carried = Some(again);
                break;
            }
            Err(_) => break,
        }
    }
    batch
}

/// Return once the server has rolled back the transaction of a statement it refused on
/// `session`, and so let go of the rows it locked. The server sends the error first and rolls
/// back after: a claim settled alone at once, on another session, could otherwise find its
/// row still locked by this very batch, take it for someone else's lock, and park its result
/// (`resolve.rs`) on a busy machine. The session answers its next statement only after the
/// rollback; a failure here is the next user's to meet.
async fn rolled_back(session: &Session) {
    let _ = session
        .bounded(async { session.batch_execute("").await.map_err(DbError::from) })
        .await;
}

/// A commit that panicked dropped its claims' reply channels: each of them is settled alone
/// (a re-read first). Say so, rather than leave it to stderr.
fn said_if_panicked(done: Result<(), tokio::task::JoinError>) {
    if let Err(err) = done {
        tracing::error!(error = %err, "a finish batch's commit panicked; its claims are settled one by one");
    }
}

/// Commit one batch and answer every claim in it; once it worked, the claims waiting a turn
/// (`woken`: for the database, and for room) try again.
async fn commit(
    pool: &Pool,
    failures: &Repeats,
    woken: [&Reachable; 2],
    mut batch: Vec<Completion>,
) {
    let finishes: Vec<Finish> = batch.iter().map(|c| c.finish.clone()).collect();
    let began = Instant::now();
    let result = match pool.get().await {
        Ok(session) => {
            let result = session
                .bounded(queue::finish_many(&session, &finishes))
                .await;
            if matches!(&result, Err(FinishError::Db(err)) if !err.is_unavailable()) {
                rolled_back(&session).await;
            }
            result
        }
        Err(err) => Err(FinishError::Db(err)),
    };
    match result {
        Ok(answers) => {
            log_recovery!(failures, began = began, "finish batches working again");
            // Claims waiting their turn, for the database or for room, try now.
            woken.iter().for_each(|turns| turns.worked());
            for (completion, answer) in batch.drain(..).zip(answers) {
                let _ = completion.reply.send(Ok(answer));
            }
        }
        Err(err) => {
            let failed = BatchFailed::Statement(Arc::new(err));
            let tasks = batch.len();
            let outcome_unknown = failed.outcome_unknown();
            log_failure!(
                failures,
                failed,
                "finish batch failed, its claims are settled one by one",
                tasks,
                outcome_unknown
            );
            for completion in batch.drain(..) {
                let _ = completion.reply.send(Err(failed.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyzer::Counts;
    use crate::queue::Outcome;

    fn completion(id: i64, token: i64) -> Completion {
        let (reply, _) = oneshot::channel();
        Completion {
            finish: Finish {
                id,
                token,
                outcome: Outcome::Succeeded(Counts::default()),
            },
            reply,
        }
    }

    fn ids(batch: &[Completion]) -> Vec<(i64, i64)> {
        batch
            .iter()
            .map(|c| (c.finish.id, c.finish.token))
            .collect()
    }

    #[test]
    fn a_batch_takes_what_is_queued_up_to_its_limit() {
        let (tx, mut rx) = mpsc::channel(MAX_BATCH + 10);
        for id in 1..=(MAX_BATCH as i64 + 5) {
            tx.try_send(completion(id, 1)).unwrap();
        }
        let mut carried = None;
        let first = rx.try_recv().unwrap();
        let batch = gather(first, &mut rx, &mut carried);
        assert_eq!(batch.len(), MAX_BATCH);
        assert!(carried.is_none());
        assert_eq!(rx.try_recv().unwrap().finish.id, MAX_BATCH as i64 + 1);
    }

    #[test]
    fn a_second_finish_of_one_task_starts_the_next_batch() {
        let (tx, mut rx) = mpsc::channel(10);
        for (id, token) in [(7, 1), (8, 1), (7, 2), (9, 1)] {
            tx.try_send(completion(id, token)).unwrap();
        }
        let mut carried = None;
        let first = rx.try_recv().unwrap();
        let batch = gather(first, &mut rx, &mut carried);
        assert_eq!(ids(&batch), [(7, 1), (8, 1)]);
        let next = carried.take().expect("carried to the next batch");
        let batch = gather(next, &mut rx, &mut carried);
        assert_eq!(ids(&batch), [(7, 2), (9, 1)]);
        assert!(carried.is_none());
    }
}
