//! The completer: commits finished claims in batches, one statement and one transaction for
//! many tasks, while each row is still fenced and gets its status and counts atomically
//! (`queue::finish_many`).
//!
//! Workers hand their outcome over and wait for the answer. Batches form by themselves:
//! while one batch is being committed, the next accumulates in the channel, so an idle
//! daemon commits at once and a busy one commits many rows per round trip. When a batch's
//! statement fails, each worker learns whether the outcome is unknown (an outage: re-read,
//! invariant 4) or known to be nothing (the server refused: retry), and resolves its own
//! task.

use tokio::sync::{mpsc, oneshot};

use crate::db::Pool;
use crate::queue::{self, Finish, FinishError, TaskStatus};

/// The most rows one finish statement commits.
const MAX_BATCH: usize = 512;

/// What a worker learns of its finish.
pub type Answer = Result<Result<TaskStatus, FinishError>, BatchFailed>;

/// The whole batch failed; the worker must settle its task itself.
#[derive(Debug, Clone)]
pub struct BatchFailed {
    /// The connection failed after the statement may have been sent.
    pub outcome_unknown: bool,
    pub message: String,
}

struct Completion {
    finish: Finish,
    reply: oneshot::Sender<Answer>,
}

/// The handle workers send their outcomes to. The batching task ends when the last handle
/// is dropped.
#[derive(Clone)]
pub struct Completer {
    tx: mpsc::Sender<Completion>,
}

impl Completer {
    /// Start the batching task for instance `owner`, with room for `capacity` outcomes
    /// waiting to be committed.
    pub fn start(pool: Pool, owner: String, capacity: usize) -> Completer {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        tokio::spawn(run(pool, owner, rx));
        Completer { tx }
    }

    /// Queue `finish` for the next batch, waiting for room; the receiver gets the answer.
    pub async fn submit(&self, finish: Finish) -> oneshot::Receiver<Answer> {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(completion)) =
            self.tx.send(Completion { finish, reply }).await
        {
            let _ = completion.reply.send(Err(BatchFailed {
                outcome_unknown: false,
                message: "the completer has stopped".into(),
            }));
        }
        answer
    }
}

async fn run(pool: Pool, owner: String, mut rx: mpsc::Receiver<Completion>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(completion) => batch.push(completion),
                Err(_) => break,
            }
        }
        let finishes: Vec<Finish> = batch.iter().map(|c| c.finish.clone()).collect();
        let result = match pool.get().await {
            Ok(session) => {
                session
                    .bounded(queue::finish_many(&session, &owner, &finishes))
                    .await
            }
            Err(err) => Err(FinishError::Db(err)),
        };
        match result {
            Ok(answers) => {
                for (completion, answer) in batch.drain(..).zip(answers) {
                    let _ = completion.reply.send(Ok(answer));
                }
            }
            Err(err) => {
                let outcome_unknown = matches!(&err, FinishError::Db(db) if db.is_unavailable());
                let message = match &err {
                    FinishError::Db(db) => crate::db::describe(db),
                    other => other.to_string(),
                };
                tracing::warn!(
                    tasks = batch.len(),
                    outcome_unknown,
                    error = message,
                    "finish batch failed"
                );
                for completion in batch.drain(..) {
                    let _ = completion.reply.send(Err(BatchFailed {
                        outcome_unknown,
                        message: message.clone(),
                    }));
                }
            }
        }
    }
}
