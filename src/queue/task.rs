//! The task row as clients see it, read straight from the database.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::db::DbError;

/// The six states (docs/design.md, "States").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TaskStatus {
    /// A parent (`depends_on`, schema 37) has not ended: never claimed until it has.
    Waiting,
    Queued,
    Running,
    Succeeded,
    Failed,
    Canceled,
}

impl TaskStatus {
    /// The six, in the order of their life.
    pub const ALL: [TaskStatus; 6] = [
        TaskStatus::Waiting,
        TaskStatus::Queued,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::Canceled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Waiting => "WAITING",
            TaskStatus::Queued => "QUEUED",
            TaskStatus::Running => "RUNNING",
            TaskStatus::Succeeded => "SUCCEEDED",
            TaskStatus::Failed => "FAILED",
            TaskStatus::Canceled => "CANCELED",
        }
    }

    /// Whether no transition leaves this state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Canceled
        )
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that is none of the six.
#[derive(Debug, thiserror::Error)]
#[error("unknown task status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for TaskStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "WAITING" => TaskStatus::Waiting,
            "QUEUED" => TaskStatus::Queued,
            "RUNNING" => TaskStatus::Running,
            "SUCCEEDED" => TaskStatus::Succeeded,
            "FAILED" => TaskStatus::Failed,
            "CANCELED" => TaskStatus::Canceled,
            other => return Err(UnknownStatus(other.to_string())),
        })
    }
}

/// Parse a status column; the table's CHECK constraint keeps it one of the six.
pub(crate) fn status_column(text: &str) -> TaskStatus {
    text.parse()
        .unwrap_or_else(|err| panic!("the tasks table's CHECK constraint was bypassed: {err}"))
}

/// One row of `pgtaskd.task_view`. The payload is a `String`, or a `&str` in the row's own buffer
/// for a large one that is only serialized ([`get_row`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task<P = String> {
    pub id: i64,
    pub queue: String,
    /// Unique per queue where set: a repeated enqueue with it answers this task.
    pub idempotency_key: Option<String>,
    pub payload: P,
    pub status: TaskStatus,
    pub priority: i16,
    pub run_at: DateTime<Utc>,
    pub attempt: i32,
    pub max_attempts: i32,
    pub cancel_requested: bool,
    pub words: i64,
    pub bytes: i64,
    pub runes: i64,
    pub error: Option<String>,
    /// Every failed attempt's error, the last ten, oldest first (`error` is the last).
    pub errors: Vec<FailedAttempt>,
    /// How many times the task's work was started: never goes back.
    pub runs: i32,
    /// How many times its handler asked to run it later without using an attempt.
    pub snoozes: i32,
    /// The key its handler is given: the same for every attempt (docs/handlers.md).
    pub task_key: String,
    /// A handler's answer (SUCCEEDED rows of `exec` and `http` queues only).
    pub output: Option<String>,
    /// The producer's W3C trace context, when set.
    pub traceparent: Option<String>,
    /// What its queue's `max_running_per_key` counts it by (docs/limits.md), when set.
    pub concurrency_key: Option<String>,
    /// The tasks it waits for (schema 37), as the producer wrote them; `None` for none.
    pub depends_on: Option<Vec<i64>>,
    /// What a parent's failure does to it: `cancel`, `run` or `wait`, as the producer wrote
    /// it; `None` is `cancel`.
    pub on_dep_failure: Option<String>,
    /// The batch it is a member of (schema 39, docs/dependencies.md "Batches"); `None` for
    /// none.
    pub batch_id: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Its labels (schema 38), as the producer wrote them; `None` for none. Last, with the
    /// metadata, so that the streamed answer's search for the payload's and the output's
    /// places (`http/streamed.rs`) meets them first.
    pub tags: Option<Vec<String>>,
    /// Its metadata (schema 38), a JSON object as the database prints it; `None` for none.
    pub metadata: Option<JsonText>,
    /// The last progress its handler reported (schema 39), a JSON object as the database
    /// prints it; kept when an attempt fails, for the next; `None` for none.
    pub progress: Option<JsonText>,
    /// When that progress was written, by the database's clock.
    pub progress_at: Option<DateTime<Utc>>,
}

/// JSON text as the database printed it, written as it is into a task's JSON (a `jsonb`
/// column read as text: numbers are never rounded through a float).
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct JsonText(Box<serde_json::value::RawValue>);

impl JsonText {
    /// The text of a `jsonb` column; `None` for a null, or (never from the database) text
    /// that is not JSON.
    fn read(text: Option<String>) -> Option<JsonText> {
        serde_json::value::RawValue::from_string(text?)
            .ok()
            .map(JsonText)
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

/// One failed attempt of a task, as `pgtaskd.task_view.errors` keeps it: a failure its
/// handler answered or a lost lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FailedAttempt {
    pub attempt: i32,
    /// The run it was (`runs` when it failed).
    pub run: i32,
    /// When it was recorded, by the database's clock.
    pub at: DateTime<Utc>,
    /// Its error, at most 2,000 characters.
    pub error: String,
}

/// The `errors` column, read as text: a history that does not parse (written by hand) reads
/// as none rather than failing the read of the task.
fn failed_attempts(text: Option<&str>) -> Vec<FailedAttempt> {
    text.and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// `run_at` as it can be shown: a producer may insert `infinity`, `-infinity` or a time past
/// the last year the program's clock type holds (262142), which would fail the read of the
/// whole row; those show as the first day of year 262142 and 4713 BC.
macro_rules! shown_run_at {
    () => {
        "least(greatest(run_at, '4713-01-01 00:00:00+00 BC'::timestamptz), \
               '262142-01-01 00:00:00+00'::timestamptz) AS run_at"
    };
}
pub(crate) use shown_run_at;

/// The columns of a [`Task`], with `$payload` for the payload.
macro_rules! columns {
    ($payload:literal, $output:literal) => {
        concat!(
            "id, queue, idempotency_key, ",
            $payload,
            ", status, priority, ",
            shown_run_at!(),
            ", attempt, max_attempts, \
            cancel_requested, words, bytes, runes, error, ",
            $output,
            ", traceparent, concurrency_key, depends_on, on_dep_failure, batch_id, lease_owner, \
            lease_expires_at, \
            created_at, started_at, finished_at, task_key, runs, snoozes, errors::text AS errors, \
            tags, metadata::text AS metadata, progress::text AS progress, progress_at"
        )
    };
}

const COLUMNS: &str = columns!("payload", "output");

impl<'a, P: FromSql<'a>> Task<P> {
    /// The task of a row of [`COLUMNS`].
    pub(crate) fn from_row(row: &'a Row) -> Task<P> {
        Task {
            id: row.get("id"),
            queue: row.get("queue"),
            idempotency_key: row.get("idempotency_key"),
            payload: row.get("payload"),
            status: status_column(row.get("status")),
            priority: row.get("priority"),
            run_at: row.get("run_at"),
            attempt: row.get("attempt"),
            max_attempts: row.get("max_attempts"),
            cancel_requested: row.get("cancel_requested"),
            words: row.get("words"),
            bytes: row.get("bytes"),
            runes: row.get("runes"),
            error: row.get("error"),
            errors: failed_attempts(row.get("errors")),
            runs: row.get("runs"),
            snoozes: row.get("snoozes"),
            task_key: row.get::<_, Option<String>>("task_key").unwrap_or_default(),
            output: row.get("output"),
            traceparent: row.get("traceparent"),
            concurrency_key: row.get("concurrency_key"),
            depends_on: row.get("depends_on"),
            on_dep_failure: row.get("on_dep_failure"),
            batch_id: row.get("batch_id"),
            lease_owner: row.get("lease_owner"),
            lease_expires_at: row.get("lease_expires_at"),
            created_at: row.get("created_at"),
            started_at: row.get("started_at"),
            finished_at: row.get("finished_at"),
            tags: row.get("tags"),
            metadata: JsonText::read(row.get("metadata")),
            progress: JsonText::read(row.get("progress")),
            progress_at: row.get("progress_at"),
        }
    }
}

/// Read one task; `None` when there is no such task.
///
/// # Errors
///
/// [`DbError::Unavailable`] when the database cannot be asked: never `None` for that.
pub async fn get(client: &Client, id: i64) -> Result<Option<Task>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM pgtaskd.task_view WHERE id = $1");
    let row = client.query_typed_opt(&sql, &[(&id, Type::INT8)]).await?;
    Ok(row.as_ref().map(Task::from_row))
}

/// Read many tasks, in the order of `ids`; ids with no row are left out.
///
/// # Errors
///
/// [`DbError::Unavailable`] when the database cannot be asked.
pub async fn get_many(client: &Client, ids: &[i64]) -> Result<Vec<Task>, DbError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM unnest($1::bigint[]) WITH ORDINALITY AS w(id, n) \
           JOIN pgtaskd.task_view USING (id) ORDER BY w.n"
    );
    let rows = client
        .query_typed(&sql, &[(&ids, Type::INT8_ARRAY)])
        .await?;
    Ok(rows.iter().map(Task::from_row).collect())
}

/// A task as [`read`] found it.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    /// The whole row.
    Whole(Task),
    /// The row without its payload (empty) and its output (null), whose bytes together are
    /// more than asked for.
    WithoutPayload {
        task: Task,
        payload_bytes: i64,
        output_bytes: i64,
    },
}

impl Read {
    pub fn status(&self) -> TaskStatus {
        match self {
            Read::Whole(task) | Read::WithoutPayload { task, .. } => task.status,
        }
    }
}

/// Read one task, leaving out its payload and its output when together they are longer than
/// `max_payload` bytes (their lengths are read from the row or their TOAST pointers, without
/// loading the text); `None` when there is no such task. What the HTTP API reads before it decides whether a payload fits its budget, and
/// all it needs to know a task's status.
///
/// # Errors
///
/// [`DbError::Unavailable`] when the database cannot be asked.
pub async fn read(client: &Client, id: i64, max_payload: i64) -> Result<Option<Read>, DbError> {
    const SQL: &str = concat!(
        "SELECT ",
        columns!(
            "CASE WHEN small THEN payload ELSE '' END AS payload",
            "CASE WHEN small THEN output END AS output"
        ),
        ", payload_bytes, output_bytes \
         FROM pgtaskd.task_view, \
         LATERAL (SELECT octet_length(payload)::bigint AS payload_bytes, \
                         coalesce(octet_length(output), 0)::bigint AS output_bytes) AS sizes, \
         LATERAL (SELECT payload_bytes + output_bytes <= $2::bigint AS small) AS fits \
         WHERE id = $1"
    );
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&id, Type::INT8), (&max_payload, Type::INT8)];
    let Some(row) = client.query_typed_opt(SQL, &params).await? else {
        return Ok(None);
    };
    let task = Task::from_row(&row);
    let payload_bytes: i64 = row.get("payload_bytes");
    let output_bytes: i64 = row.get("output_bytes");
    Ok(Some(
        if payload_bytes.saturating_add(output_bytes) > max_payload {
            Read::WithoutPayload {
                task,
                payload_bytes,
                output_bytes,
            }
        } else {
            Read::Whole(task)
        },
    ))
}

/// The row of one task, for `Task::from_row` to borrow a large payload from instead of
/// copying it; `None` when there is no such task.
///
/// # Errors
///
/// [`DbError::Unavailable`] when the database cannot be asked.
pub async fn get_row(client: &Client, id: i64) -> Result<Option<Row>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM pgtaskd.task_view WHERE id = $1");
    Ok(client.query_typed_opt(&sql, &[(&id, Type::INT8)]).await?)
}
