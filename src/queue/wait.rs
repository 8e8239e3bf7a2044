//! Waiting for tasks to end: the rule every waiter follows, whatever tells it to look.
//!
//! `NOTIFY pgtaskd_done` carries the ids of the tasks a commit ended (docs/design.md,
//! "Completion notifications"). It is a hint, never the truth: a waiter LISTENs first, then
//! reads the rows, then reads them again on each notification that names one of them and on
//! a poll tick of its own, so that a lost notification only delays it. [`until_terminal`] is
//! that loop for one session that LISTENs itself (the `wait` and `enqueue --wait` commands);
//! the daemon's HTTP waiters share its one LISTEN session instead (`crate::http`).

use std::collections::HashSet;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client};

use super::task::{get_many, Task};
/// The payload parser belongs to the listener (db sits below queue); waiters use it too.
pub use crate::db::listen::done_ids;
use crate::db::listen::DONE_CHANNEL;
use crate::db::DbError;

/// Where the waited-for tasks stand when [`until_terminal`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Waited {
    /// The rows found, in the order of the ids asked for.
    pub tasks: Vec<Task>,
    /// The ids with no row.
    pub missing: Vec<i64>,
    /// Whether the deadline came before every task ended.
    pub timed_out: bool,
}

/// Wait until every task of `ids` is terminal, one of them does not exist, or `deadline`
/// passes. `client` must already LISTEN on [`DONE_CHANNEL`], with its notifications arriving
/// in `messages`; the rows are read after that, again on each notification naming a task
/// still waited for, and again every `poll` (jittered) whatever arrived.
///
/// # Errors
///
/// Database failures, and [`DbError::Unavailable`] when the session closes.
pub async fn until_terminal(
    client: &Client,
    messages: &mut mpsc::Receiver<AsyncMessage>,
    ids: &[i64],
    poll: Duration,
    deadline: Option<Instant>,
) -> Result<Waited, DbError> {
    loop {
        let tasks = get_many(client, ids).await?;
        let found: HashSet<i64> = tasks.iter().map(|task| task.id).collect();
        let missing: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| !found.contains(id))
            .collect();
        let pending: HashSet<i64> = tasks
            .iter()
            .filter(|task| !task.status.is_terminal())
            .map(|task| task.id)
            .collect();
        let timed_out = deadline.is_some_and(|at| Instant::now() >= at);
        if !missing.is_empty() || pending.is_empty() || timed_out {
            return Ok(Waited {
                tasks,
                missing,
                timed_out: timed_out && !pending.is_empty(),
            });
        }
        let tick = tokio::time::sleep(crate::backoff::jitter(poll));
        tokio::pin!(tick);
        let until = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(until);
        // Until something says one of ours may have ended, or the tick or the deadline comes.
        loop {
            tokio::select! {
                message = messages.recv() => match message {
                    Some(AsyncMessage::Notification(n)) if n.channel() == DONE_CHANNEL => {
                        if done_ids(n.payload()).any(|id| pending.contains(&id)) {
                            break;
                        }
                    }
                    Some(_) => {}
                    None => return Err(DbError::unavailable("the waiting session was closed")),
                },
                _ = &mut tick => break,
                _ = &mut until => break,
            }
        }
    }
}
