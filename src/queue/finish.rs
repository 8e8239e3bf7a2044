//! Finishing a claim: the terminal status and the results in one fenced `UPDATE`
//! ("Results with status" and "Fenced finish" in docs/design.md), and releasing a claim back
//! to QUEUED on shutdown.
//!
//! Both statements match only `status = 'RUNNING'` and the claim's own token (`claim_token`,
//! unique per claim): a claim that was lost (rescued, finished by someone else, released) is
//! never written over. A finish that matches no row changes nothing, and the caller learns whether
//! the task is "not running any more" or "not found" from the same statement.
//!
//! A finish also reads `cancel_requested` in the same `UPDATE`: a task whose cancellation was
//! requested while it ran is committed CANCELED with zero counts, whatever the analyzer said.
//! A failed attempt of a handler may ask for another ([`Outcome::Retry`]): the same statement
//! makes the task QUEUED again with `run_at` pushed back while attempts remain.
//!
//! Both tell the waiters of the tasks they end with `NOTIFY pgtaskd_done` (one per statement,
//! through `pgtaskd.notify_done`), committed with the change (docs/design.md, "Completion
//! notifications").

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::task::{status_column, TaskStatus};
use crate::analyzer::Counts;
use crate::db::DbError;

/// What the work (the analyzer or a handler) made of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The text analyzer's counts to store.
    Succeeded(Counts),
    /// A handler's answer to store as `output` (SUCCEEDED, zero counts). Shared, not
    /// copied, by the batch and the claim's fallback of settling alone: it may be 64 MiB.
    Output(std::sync::Arc<str>),
    /// Why it failed; stored as `error`, with zero counts. The task ends FAILED.
    Failed(String),
    /// A failed attempt worth another: the task is QUEUED again `after` from now, keeping
    /// `error`, while it has attempts left; else it ends FAILED with `error`.
    Retry { error: String, after: Duration },
    /// The handler asked to run later without using an attempt (a snooze): the task is
    /// QUEUED again `after` from now, its attempt not counted, up to [`MAX_SNOOZES`] times;
    /// the next snooze fails it.
    Snooze { after: Duration },
    /// The work stopped for a cancel request; zero counts.
    Canceled,
}

/// The most snoozes of one task (`pgtaskd.finish`, schema 32); the next fails it.
pub const MAX_SNOOZES: i32 = 100;

/// The error of a task failed for snoozing once too often.
const SNOOZED_OUT: &str = "the handler asked to run it later (a snooze) more than 100 times; failed rather than put off again";

impl Outcome {
    /// The error a failed attempt stores, and the one a snooze stores when it fails the task
    /// (the 101st); empty for any other outcome.
    pub fn error(&self) -> &str {
        match self {
            Outcome::Failed(error) | Outcome::Retry { error, .. } => error,
            Outcome::Snooze { .. } => SNOOZED_OUT,
            _ => "",
        }
    }

    /// Whether the finish may put the task back QUEUED rather than end it: a failed attempt
    /// worth another, or a snooze (neither is a finish nor a release for the metrics).
    pub fn may_queue_again(&self) -> bool {
        matches!(self, Outcome::Retry { .. } | Outcome::Snooze { .. })
    }

    /// The status `pgtaskd.finish` is sent: a task status, or `SNOOZED`.
    fn sent_status(&self) -> &'static str {
        match self {
            Outcome::Succeeded(_) | Outcome::Output(_) => TaskStatus::Succeeded.as_str(),
            Outcome::Failed(_) | Outcome::Retry { .. } => TaskStatus::Failed.as_str(),
            Outcome::Snooze { .. } => "SNOOZED",
            Outcome::Canceled => TaskStatus::Canceled.as_str(),
        }
    }
}

/// Why a finish or release changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// The task exists but is not RUNNING under this claim any more; `status` is what the
    /// finish saw.
    #[error("task is not running under this claim any more (status {status})")]
    NotRunning { status: TaskStatus },
    /// There is no such task.
    #[error("no such task")]
    NotFound,
    /// Someone else held the row's lock, and a batched finish does not wait for it: nothing
    /// was written; finish it alone ([`finish`] waits for the row).
    #[error("the task's row was locked by another transaction")]
    Locked,
    /// The database failed. When it is [`DbError::Unavailable`], the outcome of the
    /// statement is unknown: re-read the row, never re-run the analyzer ("Re-read, never
    /// re-run" in docs/design.md).
    #[error(transparent)]
    Db(#[from] DbError),
}

impl crate::db::Outage for FinishError {
    fn is_outage(&self) -> bool {
        matches!(self, FinishError::Db(err) if err.is_unavailable())
    }
}

impl From<tokio_postgres::Error> for FinishError {
    fn from(err: tokio_postgres::Error) -> Self {
        FinishError::Db(err.into())
    }
}

/// The statement lives in `pgtaskd.finish` (in sql/schema.sql), planned once per
/// session; it also sends `NOTIFY pgtaskd_done` with the ids it ended, in the same transaction.
/// The queue and attempt of each task it wrote FAILED come with its answer, for the line
/// that says so (`events::TASK_FAILED`): read only for those rows (the lateral read is
/// skipped for every other row), from the row as the statement began (neither changes).
/// `OFFSET 0` keeps that read a lookup by primary key for each row of the answer: flattened
/// into a join, the planner, which takes a function to answer 1,000 rows, hashed the whole
/// state table at every finish of a table under about a million rows.
const FINISH_MANY: &str = "SELECT f.task_id, f.written, f.current, f.skipped, t.queue, t.attempt \
     FROM pgtaskd.finish($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) AS f \
     LEFT JOIN LATERAL (SELECT s.queue, s.attempt FROM pgtaskd.task_state AS s \
                         WHERE f.written = 'FAILED' AND s.id = f.task_id OFFSET 0) AS t ON true";

/// One claim's outcome, for [`finish_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub id: i64,
    /// The claim's token: the row is written only while it holds this claim.
    pub token: i64,
    pub outcome: Outcome,
}

/// Commit the outcome of the claim `token` of task `id`; with `wait`, waiting for the row if
/// someone else holds its lock (else [`FinishError::Locked`]). Returns the status written,
/// which is CANCELED when a cancel was requested meanwhile.
///
/// # Errors
///
/// [`FinishError::NotRunning`] or [`FinishError::NotFound`] when nothing matched (nothing
/// changed); [`FinishError::Locked`] without `wait`; [`FinishError::Db`] when the database
/// failed.
pub async fn finish(
    client: &Client,
    token: i64,
    id: i64,
    outcome: &Outcome,
    wait: bool,
) -> Result<TaskStatus, FinishError> {
    let one = Finish {
        id,
        token,
        outcome: outcome.clone(),
    };
    finish_rows(client, std::slice::from_ref(&one), wait)
        .await?
        .pop()
        .expect("one result per finish")
}

/// Commit many claims' outcomes in one statement (one transaction). Each row is still
/// fenced on its own (`status = 'RUNNING'` and its claim's token) and gets its status and
/// counts atomically; the result for each input, in input order, is what [`finish`] would
/// have said of it alone, except for a row that someone else held locked: it is not waited
/// for, not written, and answered [`FinishError::Locked`] (docs/design.md, "No one else's
/// lock delays a batch").
///
/// # Errors
///
/// [`FinishError::Db`] when the statement failed: then nothing was written, or (an outage)
/// the outcome of every row is unknown.
pub async fn finish_many(
    client: &Client,
    finishes: &[Finish],
) -> Result<Vec<Result<TaskStatus, FinishError>>, FinishError> {
    finish_rows(client, finishes, false).await
}

/// [`finish_many`], waiting for locked rows when `wait` is set.
async fn finish_rows(
    client: &Client,
    finishes: &[Finish],
    wait: bool,
) -> Result<Vec<Result<TaskStatus, FinishError>>, FinishError> {
    let columns = Columns::of(finishes);
    let mut params = columns.params();
    params.push((&wait, Type::BOOL));
    let rows = client.query_typed(FINISH_MANY, &params).await?;
    // The statement committed (it runs in a transaction of its own): each task it ended
    // FAILED gets its line.
    let mut failed = rows
        .iter()
        .filter_map(|row| {
            Some((
                row.get::<_, i64>(0),
                row.get::<_, Option<&str>>(4)?,
                row.get(5),
            ))
        })
        .peekable();
    if failed.peek().is_some() {
        let errors: std::collections::HashMap<i64, &str> = finishes
            .iter()
            .map(|finish| (finish.id, finish.outcome.error()))
            .collect();
        for (id, queue, attempt) in failed {
            let error = errors.get(&id).copied().unwrap_or_default();
            crate::events::task_failed(id, queue, attempt, error);
        }
    }
    let mut by_id: std::collections::HashMap<i64, Result<TaskStatus, FinishError>> = rows
        .iter()
        .map(|row| {
            let answer = if row.get::<_, Option<bool>>(3) == Some(true) {
                Err(FinishError::Locked)
            } else {
                matched(row.get(1), row.get(2))
            };
            (row.get::<_, i64>(0), answer)
        })
        .collect();
    Ok(columns
        .ids
        .iter()
        .map(|id| by_id.remove(id).unwrap_or(Err(FinishError::NotFound)))
        .collect())
}

/// Outcomes as the arrays `pgtaskd.finish` and `pgtaskd.park` take, one element per claim.
pub(super) struct Columns<'a> {
    tokens: Vec<i64>,
    pub(super) ids: Vec<i64>,
    statuses: Vec<&'static str>,
    words: Vec<i64>,
    bytes: Vec<i64>,
    runes: Vec<i64>,
    errors: Vec<Option<&'a str>>,
    outputs: Vec<Option<&'a str>>,
    retry_in: Vec<Option<f64>>,
}

impl<'a> Columns<'a> {
    pub(super) fn of(finishes: &'a [Finish]) -> Columns<'a> {
        let n = finishes.len();
        let mut columns = Columns {
            tokens: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            statuses: Vec::with_capacity(n),
            words: Vec::with_capacity(n),
            bytes: Vec::with_capacity(n),
            runes: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            outputs: Vec::with_capacity(n),
            retry_in: Vec::with_capacity(n),
        };
        for finish in finishes {
            let counts = match &finish.outcome {
                Outcome::Succeeded(counts) => *counts,
                _ => Counts::default(),
            };
            columns.tokens.push(finish.token);
            columns.ids.push(finish.id);
            columns.statuses.push(finish.outcome.sent_status());
            columns.words.push(counts.words);
            columns.bytes.push(counts.bytes);
            columns.runes.push(counts.runes);
            columns.errors.push(match &finish.outcome {
                Outcome::Failed(_) | Outcome::Retry { .. } | Outcome::Snooze { .. } => {
                    Some(finish.outcome.error())
                }
                _ => None,
            });
            columns.outputs.push(match &finish.outcome {
                Outcome::Output(output) => Some(output.as_ref()),
                _ => None,
            });
            columns.retry_in.push(match &finish.outcome {
                Outcome::Retry { after, .. } | Outcome::Snooze { after } => {
                    Some(after.as_secs_f64())
                }
                _ => None,
            });
        }
        columns
    }

    /// The nine arrays, in the functions' order: tokens, ids, statuses, words, bytes, runes,
    /// errors, outputs, retry_in.
    pub(super) fn params(&self) -> Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> {
        vec![
            (&self.tokens, Type::INT8_ARRAY),
            (&self.ids, Type::INT8_ARRAY),
            (&self.statuses, Type::TEXT_ARRAY),
            (&self.words, Type::INT8_ARRAY),
            (&self.bytes, Type::INT8_ARRAY),
            (&self.runes, Type::INT8_ARRAY),
            (&self.errors, Type::TEXT_ARRAY),
            (&self.outputs, Type::TEXT_ARRAY),
            (&self.retry_in, Type::FLOAT8_ARRAY),
        ]
    }
}

/// `pgtaskd.release` (sql/0026_state_functions.sql). `$3`: wait for the row's lock; without
/// it, a row someone else holds fails the statement with lock_not_available (55P03), which
/// [`release`] answers as [`FinishError::Locked`].
const RELEASE: &str = "SELECT written, current FROM pgtaskd.release($1, $2, $3)";

/// Give the claim `token` of task `id` back without a result, as a shutdown does: the task becomes
/// QUEUED for any daemon to take at once, and the claim does not count as an attempt, so
/// shutdowns alone never exhaust `max_attempts`. A task whose cancellation was requested
/// becomes CANCELED instead. Returns the status written.
///
/// # Errors
///
/// As [`finish`].
pub async fn release(
    client: &Client,
    token: i64,
    id: i64,
    wait: bool,
) -> Result<TaskStatus, FinishError> {
    let row = client
        .query_typed(
            RELEASE,
            &[(&id, Type::INT8), (&token, Type::INT8), (&wait, Type::BOOL)],
        )
        .await
        .map_err(locked)?;
    matched(row[0].get(0), row[0].get(1))
}

/// A statement refused because it would have waited for a row lock (55P03) is
/// [`FinishError::Locked`].
fn locked(err: tokio_postgres::Error) -> FinishError {
    if err.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        FinishError::Locked
    } else {
        FinishError::from(err)
    }
}

/// Interpret the `(written, current)` pair that the finish and release statements return.
fn matched(written: Option<&str>, current: Option<&str>) -> Result<TaskStatus, FinishError> {
    match (written, current) {
        (Some(written), _) => Ok(status_column(written)),
        (None, Some(current)) => Err(FinishError::NotRunning {
            status: status_column(current),
        }),
        (None, None) => Err(FinishError::NotFound),
    }
}

/// Log the line of task `id` that a finish whose answer was lost ended FAILED with `error`
/// (`events::TASK_FAILED`), its queue and attempt read now. A read that fails leaves the
/// line out: the task's row says it all.
pub async fn log_failed_end(client: &Client, id: i64, error: &str) {
    let read = client
        .query_typed(
            "SELECT queue, attempt FROM pgtaskd.task_state WHERE id = $1",
            &[(&id, Type::INT8)],
        )
        .await;
    match read.as_deref() {
        Ok([row]) => crate::events::task_failed(id, row.get(0), row.get(1), error),
        Ok(_) => {}
        Err(err) => tracing::debug!(id, error = %err, "cannot read the queue of a failed task"),
    }
}

/// Where a claim stands, as a re-read after an unknown commit outcome finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimState {
    pub status: TaskStatus,
    pub attempt: i32,
    /// The token of the claim that holds or last held the row.
    pub token: Option<i64>,
}

/// Re-read claim-relevant columns of task `id`, after any transaction that still holds the
/// row, such as the one whose commit outcome is unknown (`FOR SHARE`): with `wait`, waiting
/// for it, else answering [`FinishError::Locked`] at once. `None` when there is no such task.
///
/// # Errors
///
/// Database failures, and [`FinishError::Locked`].
pub async fn reread(
    client: &Client,
    id: i64,
    wait: bool,
) -> Result<Option<ClaimState>, FinishError> {
    let row = client
        .query_typed(
            "SELECT task_status, task_attempt, task_claim FROM pgtaskd.claim_state($1, $2)",
            &[(&id, Type::INT8), (&wait, Type::BOOL)],
        )
        .await
        .map_err(locked)?;
    Ok(row.first().map(|row| ClaimState {
        status: status_column(row.get(0)),
        attempt: row.get(1),
        token: row.get(2),
    }))
}
