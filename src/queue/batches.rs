//! Batches (schema 39, docs/dependencies.md, "Batches"): a callback task that runs once,
//! after the batch is sealed and its last member has ended. The SQL is the schema's:
//! `pgtaskd.open_batch` makes the batch and its callback (WAITING), members are tasks
//! inserted with `batch_id` ([`crate::queue::NewTask::batch_id`]), `pgtaskd.seal_batch` closes
//! it; the batch's end is decided by the database in the commit of its last member's end.
//! This file opens, seals and reads batches, and sorts what the database refuses of a member
//! ([`refusal`]). Called by `pgtaskd batch` and `pgtaskd enqueue --batch`, and by the HTTP
//! routes `/batches` and `POST /tasks` with `batch_id`.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::task::{status_column, TaskStatus};
use crate::db::DbError;

/// When a batch's callback runs (`pgtaskd.batches.callback_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CallbackOn {
    /// Only if every member SUCCEEDED; otherwise the callback is CANCELED.
    Success,
    /// Whatever the members did.
    Finish,
}

impl CallbackOn {
    /// The two, as the column holds them.
    pub const NAMES: [&'static str; 2] = ["success", "finish"];

    pub fn as_str(self) -> &'static str {
        match self {
            CallbackOn::Success => "success",
            CallbackOn::Finish => "finish",
        }
    }
}

impl fmt::Display for CallbackOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `callback_on` that is neither `success` nor `finish`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a batch's callback runs on success or on finish: \"on\" must be \"success\" or \"finish\""
)]
pub struct BadCallbackOn;

impl FromStr for CallbackOn {
    type Err = BadCallbackOn;

    /// `success` or `finish`, in lowercase, as the column holds them.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "success" => Ok(CallbackOn::Success),
            "finish" => Ok(CallbackOn::Finish),
            _ => Err(BadCallbackOn),
        }
    }
}

/// A batch just opened: its id (what members are inserted with) and its callback task's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Opened {
    pub id: i64,
    pub callback_id: i64,
}

/// Where a batch is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchState {
    /// Members may still join it.
    Open,
    /// No member can join it; some have not ended.
    Sealed,
    /// Sealed and every member has ended: its callback was released (QUEUED) or CANCELED.
    Ended,
}

impl BatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Open => "open",
            BatchState::Sealed => "sealed",
            BatchState::Ended => "ended",
        }
    }
}

impl fmt::Display for BatchState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A batch as `pgtaskd batch status` and `GET /batches/{id}` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Batch {
    pub id: i64,
    pub state: BatchState,
    /// When the callback runs.
    pub on: CallbackOn,
    pub callback_id: i64,
    /// The callback's status now: WAITING until the batch ends; `None` only if its row is
    /// gone (written by hand).
    pub callback_status: Option<TaskStatus>,
    pub opened_at: DateTime<Utc>,
    pub sealed_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// The members there are now, by status, every status named (0 for none). Retention may
    /// take ended members of an ended batch: the counts written at its end stay.
    pub members: MemberCounts,
    /// The members by outcome, counted at the batch's end; `None` before.
    pub succeeded: Option<i64>,
    pub failed: Option<i64>,
    pub canceled: Option<i64>,
}

/// How many members a batch has in each of the six statuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub struct MemberCounts {
    pub waiting: i64,
    pub queued: i64,
    pub running: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub canceled: i64,
}

impl MemberCounts {
    fn add(&mut self, status: TaskStatus, n: i64) {
        let slot = match status {
            TaskStatus::Waiting => &mut self.waiting,
            TaskStatus::Queued => &mut self.queued,
            TaskStatus::Running => &mut self.running,
            TaskStatus::Succeeded => &mut self.succeeded,
            TaskStatus::Failed => &mut self.failed,
            TaskStatus::Canceled => &mut self.canceled,
        };
        *slot += n;
    }

    /// The count of `status`.
    pub fn of(&self, status: TaskStatus) -> i64 {
        match status {
            TaskStatus::Waiting => self.waiting,
            TaskStatus::Queued => self.queued,
            TaskStatus::Running => self.running,
            TaskStatus::Succeeded => self.succeeded,
            TaskStatus::Failed => self.failed,
            TaskStatus::Canceled => self.canceled,
        }
    }

    /// Every member counted.
    pub fn total(&self) -> i64 {
        TaskStatus::ALL.iter().map(|status| self.of(*status)).sum()
    }
}

/// Open a batch (`pgtaskd.open_batch`) whose callback, a task of `callback_queue` with
/// `payload`, runs `on` success or finish; then read its callback's id. The open commits on
/// its own: an outage between the two statements leaves an open batch that no one knows of,
/// as an enqueue whose answer was lost leaves a task.
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on the function.
pub async fn open(
    client: &Client,
    callback_queue: &str,
    on: CallbackOn,
    payload: &str,
) -> Result<Opened, DbError> {
    let row = client
        .query_one(
            "SELECT pgtaskd.open_batch($1::text, $2::text, $3::text)",
            &[&callback_queue, &on.as_str(), &payload],
        )
        .await?;
    let id: i64 = row.get(0);
    // A statement of its own: rows the function wrote are not seen by the statement that
    // called it.
    let row = client
        .query_one(
            "SELECT b.callback FROM pgtaskd.batches AS b WHERE b.id = $1",
            &[&id],
        )
        .await?;
    Ok(Opened {
        id,
        callback_id: row.get(0),
    })
}

/// What a seal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// The batch's state after the seal: sealed, or ended (every member had ended already).
    Now(BatchState),
    /// There is no such batch.
    NotFound,
}

/// Seal batch `id` (`pgtaskd.seal_batch`): no member can join it any more, and it ends once
/// its last member has ended, at once if they all have. Sealing a sealed batch changes
/// nothing. The statement is a transaction of its own, at the session's default isolation:
/// the function refuses any but READ COMMITTED (0A000).
///
/// # Errors
///
/// Database failures but "no such batch" (P0002), which is [`Sealed::NotFound`].
pub async fn seal(client: &Client, id: i64) -> Result<Sealed, DbError> {
    let answer = client
        .query_typed("SELECT pgtaskd.seal_batch($1)", &[(&id, Type::INT8)])
        .await;
    match answer {
        // The function answers one row: 'sealed' or 'ended'.
        Ok(rows) => Ok(Sealed::Now(
            match rows.first().map(|row| row.get::<_, &str>(0)) {
                Some("ended") => BatchState::Ended,
                _ => BatchState::Sealed,
            },
        )),
        Err(err) => {
            let err = DbError::from(err);
            if err.code() == Some(&SqlState::NO_DATA_FOUND) {
                Ok(Sealed::NotFound)
            } else {
                Err(err)
            }
        }
    }
}

/// The batch and its callback, with its members counted by status through
/// `tasks_batch_idx`.
const READ: &str = "
SELECT b.id, b.callback, b.callback_on, b.opened_at, b.sealed_at, b.ended_at,
       b.succeeded, b.failed, b.canceled, s.status,
       ARRAY(SELECT m.status || '=' || m.n
               FROM (SELECT k.status, count(*) AS n
                       FROM pgtaskd.task_state AS k
                      WHERE k.batch_id = b.id AND k.status IS NOT NULL
                      GROUP BY k.status) AS m)
  FROM pgtaskd.batches AS b
  LEFT JOIN pgtaskd.task_state AS s ON s.id = b.callback
 WHERE b.id = $1";

/// Read batch `id`, or `None` when there is none.
///
/// # Errors
///
/// Database failures.
pub async fn get(client: &Client, id: i64) -> Result<Option<Batch>, DbError> {
    let rows = client.query_typed(READ, &[(&id, Type::INT8)]).await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let sealed_at: Option<DateTime<Utc>> = row.get(4);
    let ended_at: Option<DateTime<Utc>> = row.get(5);
    let state = match (sealed_at, ended_at) {
        (_, Some(_)) => BatchState::Ended,
        (Some(_), None) => BatchState::Sealed,
        (None, None) => BatchState::Open,
    };
    let on: String = row.get(2);
    let mut members = MemberCounts::default();
    for pair in row.get::<_, Vec<String>>(10) {
        // STATUS=N, as the statement writes it.
        if let Some((status, n)) = pair.split_once('=') {
            members.add(status_column(status), n.parse().unwrap_or(0));
        }
    }
    Ok(Some(Batch {
        id: row.get(0),
        state,
        // The table's check keeps it one of the two.
        on: on.parse().unwrap_or(CallbackOn::Finish),
        callback_id: row.get(1),
        callback_status: row.get::<_, Option<&str>>(9).map(status_column),
        opened_at: row.get(3),
        sealed_at,
        ended_at,
        members,
        succeeded: row.get(6),
        failed: row.get(7),
        canceled: row.get(8),
    }))
}

/// Why the database refused a task as a member of a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchRefusal {
    /// The batch does not exist (`batch 7 does not exist`, 23503): what an unknown id is
    /// everywhere, the CLI's exit 3, the HTTP API's 422.
    #[error("{0}")]
    Unknown(String),
    /// The batch is sealed (`batch 7 is sealed: no task can join it`, 55000): refused for the
    /// batch's state, the CLI's exit 4, the HTTP API's 422.
    #[error("{0}; open another batch")]
    Sealed(String),
}

/// What an enqueue's failure `err` says of the task's batch, if it is about it. The batch's
/// trigger (`pgtaskd.tasks_batch_check`) raises both: 55000 nothing else of an insert raises;
/// 23503 a parent that does not exist raises too, so the trigger's own words, which no
/// `lc_messages` translates, tell the batch's.
pub fn refusal(err: &DbError) -> Option<BatchRefusal> {
    let code = err.code()?;
    let message = err.message();
    if *code == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE {
        Some(BatchRefusal::Sealed(message.to_string()))
    } else if *code == SqlState::FOREIGN_KEY_VIOLATION
        && message.starts_with("batch ")
        && message.ends_with(" does not exist")
    {
        Some(BatchRefusal::Unknown(message.to_string()))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callback_runs_on_success_or_on_finish_in_lowercase() {
        for name in CallbackOn::NAMES {
            assert_eq!(name.parse::<CallbackOn>().unwrap().as_str(), name);
        }
        for bad in ["", "Success", "failure", "finish "] {
            assert_eq!(bad.parse::<CallbackOn>(), Err(BadCallbackOn), "{bad:?}");
        }
    }

    #[test]
    fn the_batchs_refusals_are_told_from_a_parents() {
        let unknown = DbError::answered("batch 7 does not exist", SqlState::FOREIGN_KEY_VIOLATION);
        assert_eq!(
            refusal(&unknown),
            Some(BatchRefusal::Unknown("batch 7 does not exist".into()))
        );
        let sealed = DbError::answered(
            "batch 7 is sealed: no task can join it",
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        );
        assert_eq!(
            refusal(&sealed).map(|refused| refused.to_string()),
            Some("batch 7 is sealed: no task can join it; open another batch".into())
        );
        let parent = DbError::answered(
            "task depends on task 99, which does not exist",
            SqlState::FOREIGN_KEY_VIOLATION,
        );
        assert_eq!(refusal(&parent), None);
        assert_eq!(refusal(&DbError::unavailable("connection refused")), None);
    }

    #[test]
    fn members_are_counted_under_every_status_by_name() {
        let mut members = MemberCounts::default();
        members.add(TaskStatus::Queued, 2);
        members.add(TaskStatus::Succeeded, 1);
        assert_eq!(members.total(), 3);
        assert_eq!(
            serde_json::to_value(members).unwrap(),
            serde_json::json!({"WAITING": 0, "QUEUED": 2, "RUNNING": 0, "SUCCEEDED": 1,
                               "FAILED": 0, "CANCELED": 0})
        );
    }
}
