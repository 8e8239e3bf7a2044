//! Inserting a task, as the CLI and the HTTP API do. Producers may equally `INSERT` directly,
//! or call `pgtaskd.enqueue`.
//!
//! With an idempotency key the insert is `ON CONFLICT DO NOTHING` on the key's partial unique
//! index (`tasks_idempotency_key_idx`, unique per queue): a producer that does not know whether
//! its first enqueue committed (its connection dropped) sends it again with the same key and
//! gets the same task, never a second one (docs/design.md, "Idempotent enqueue").
//!
//! It also owns what a task's fields may be, checked before any statement by the CLI, the
//! HTTP API and the configuration alike ([`check_queue_name`], [`check_payload`],
//! [`check_idempotency_key`], [`NewTask::check`]), so that each refuses the same input with
//! the same words; the tables' constraints (`tasks_queue_name`, `paused_queues_queue_name` in
//! sql/schema.sql) hold the queue-name rule for every other writer. A task's parents have a
//! file of their own (`enqueue/parents.rs`): what the database alone can refuse of them is
//! sorted there too; so have its tags and metadata (`enqueue/tags.rs`, schema 38).

mod parents;
mod tags;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

pub use parents::{
    check_depends_on, parse_depends_on, refusal, OnDepFailure, ParentRefusal, MAX_PARENTS,
};
pub use tags::{
    check_tag, check_tags, jsonb_text, parse_meta_term, parse_tags, tags_from_json, tags_refusal,
    Metadata, MAX_METADATA_BYTES, MAX_TAGS, MAX_TAG_LEN,
};

/// The longest queue name, in bytes of UTF-8. A pause and a resume NOTIFY the name (a
/// NOTIFY payload must be shorter than 8,000 bytes), the idempotency index holds it beside the
/// key (an index entry must fit a third of a page), and `list` and `stats` show it in a
/// column; the table refuses longer ones too (`tasks_queue_name`, schema 16).
pub const MAX_QUEUE_NAME: usize = 128;

/// The longest idempotency key, in bytes (visible ASCII only).
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The longest concurrency key, in bytes of UTF-8 (the table's `tasks_concurrency_key_length`,
/// schema 33).
pub const MAX_CONCURRENCY_KEY: usize = 256;

/// Why a task's field cannot be used; the same words for the CLI (exit 2), the HTTP API
/// (400) and the configuration (78).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadInput {
    #[error("the queue name is empty")]
    QueueEmpty,
    #[error("the queue name is {0} bytes long; the limit is {MAX_QUEUE_NAME}")]
    QueueTooLong(usize),
    #[error("the queue name contains a NUL character")]
    QueueNul,
    #[error("the payload contains a NUL character, which PostgreSQL text cannot hold")]
    PayloadNul,
    #[error("the idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters")]
    Key,
    #[error("idempotency keys starting with \"schedule:\" are kept for the fires of schedules")]
    KeyKept,
    #[error("the concurrency key is {0} bytes long; the limit is {MAX_CONCURRENCY_KEY}")]
    ConcurrencyKeyTooLong(usize),
    #[error("the concurrency key contains a NUL character")]
    ConcurrencyKeyNul,
    #[error("concurrency_key must be a string of at most {MAX_CONCURRENCY_KEY} bytes")]
    ConcurrencyKeyType,
    #[error("priority must be an integer from {} to {}", i16::MIN, i16::MAX)]
    Priority,
    #[error("max_attempts must be an integer from 1 to {}", i32::MAX)]
    MaxAttempts,
    #[error("run_at {0:?} is neither an RFC 3339 time (\"2026-12-01T08:00:00Z\") nor a delay such as \"10m\" (at most 100 years)")]
    RunAt(String),
    #[error("depends_on must be a list of task ids (integers)")]
    DependsOn,
    #[error("depends_on names {0} tasks; the limit is {MAX_PARENTS}")]
    TooManyParents(usize),
    #[error("on_dep_failure must be cancel, run or wait")]
    OnDepFailure,
    #[error("batch_id must be the id of a batch (an integer)")]
    BatchId,
    #[error(
        "tag {0:?} is not a letter or digit followed by at most 62 letters, digits and _ . : -"
    )]
    Tag(String),
    #[error("{0} tags; the limit is {MAX_TAGS}")]
    TooManyTags(usize),
    #[error("tags must be a list of strings")]
    TagsType,
    #[error("metadata must be a JSON object")]
    MetadataType,
    #[error("metadata holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot hold")]
    MetadataNul,
    #[error("metadata is {0} bytes as the database prints it (metadata::text); the limit is {MAX_METADATA_BYTES}")]
    MetadataTooLarge(usize),
    #[error("metadata nests objects and arrays deeper than 128 levels")]
    MetadataDepth,
    #[error("meta {term:?} is not KEY{separator}VALUE with a KEY")]
    MetaTerm { term: String, separator: char },
    #[error("metadata key {0:?} is given twice")]
    MetaKeyTwice(String),
}

impl BadInput {
    /// Whether it is about a task's tags or metadata, which the HTTP API refuses with 422
    /// (a body it could read, with values the table would refuse).
    pub fn is_tags_or_metadata(&self) -> bool {
        matches!(
            self,
            BadInput::Tag(_)
                | BadInput::TooManyTags(_)
                | BadInput::TagsType
                | BadInput::MetadataType
                | BadInput::MetadataNul
                | BadInput::MetadataTooLarge(_)
                | BadInput::MetadataDepth
                | BadInput::MetaTerm { .. }
                | BadInput::MetaKeyTwice(_)
        )
    }
}

/// A queue name: not empty nor only white space, at most [`MAX_QUEUE_NAME`] bytes, no NUL.
///
/// # Errors
///
/// The first rule it breaks.
pub fn check_queue_name(name: &str) -> Result<(), BadInput> {
    if name.trim().is_empty() {
        Err(BadInput::QueueEmpty)
    } else if name.len() > MAX_QUEUE_NAME {
        Err(BadInput::QueueTooLong(name.len()))
    } else if name.contains('\0') {
        Err(BadInput::QueueNul)
    } else {
        Ok(())
    }
}

/// A payload: any UTF-8 text without NUL (PostgreSQL text cannot hold it).
///
/// # Errors
///
/// [`BadInput::PayloadNul`].
pub fn check_payload(payload: &str) -> Result<(), BadInput> {
    if payload.contains('\0') {
        Err(BadInput::PayloadNul)
    } else {
        Ok(())
    }
}

/// An idempotency key: 1 to [`MAX_IDEMPOTENCY_KEY`] visible ASCII characters (what an HTTP
/// header carries unmangled).
///
/// # Errors
///
/// [`BadInput::Key`]; [`BadInput::KeyKept`] for a key of a schedule's fire.
pub fn check_idempotency_key(key: &str) -> Result<(), BadInput> {
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        Err(BadInput::Key)
    } else if key.starts_with("schedule:") {
        // The table refuses them too (`tasks_schedule_keys`, schema 31).
        Err(BadInput::KeyKept)
    } else {
        Ok(())
    }
}

/// A concurrency key (the task's tenant for its queue's `max_running_per_key`,
/// docs/limits.md): at most [`MAX_CONCURRENCY_KEY`] bytes, no NUL (PostgreSQL text cannot
/// hold it).
///
/// # Errors
///
/// The rule it breaks.
pub fn check_concurrency_key(key: &str) -> Result<(), BadInput> {
    if key.len() > MAX_CONCURRENCY_KEY {
        Err(BadInput::ConcurrencyKeyTooLong(key.len()))
    } else if key.contains('\0') {
        Err(BadInput::ConcurrencyKeyNul)
    } else {
        Ok(())
    }
}

/// A priority: a smallint, as the column holds it (higher is claimed first).
///
/// # Errors
///
/// [`BadInput::Priority`] outside `i16`.
pub fn check_priority(priority: i64) -> Result<i16, BadInput> {
    i16::try_from(priority).map_err(|_| BadInput::Priority)
}

/// A number of attempts: at least 1, as the column's `tasks_max_attempts_check` requires.
///
/// # Errors
///
/// [`BadInput::MaxAttempts`] below 1 or past `i32`.
pub fn check_max_attempts(max_attempts: i64) -> Result<i32, BadInput> {
    i32::try_from(max_attempts)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or(BadInput::MaxAttempts)
}

/// The longest `run_at` delay: a later time than the table can hold fails the insert.
pub const MAX_RUN_AT_DELAY: std::time::Duration =
    std::time::Duration::from_secs(100 * 365 * 24 * 3600);

/// A `run_at`: an RFC 3339 time, or a delay such as "10m" counted from the database's clock,
/// at most [`MAX_RUN_AT_DELAY`].
///
/// # Errors
///
/// [`BadInput::RunAt`] for anything else.
pub fn parse_run_at(text: &str) -> Result<RunAt, BadInput> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(RunAt::At(at.with_timezone(&Utc)));
    }
    humantime::parse_duration(text)
        .ok()
        .filter(|delay| *delay <= MAX_RUN_AT_DELAY)
        .map(RunAt::After)
        .ok_or_else(|| BadInput::RunAt(text.to_string()))
}

/// When a task may first be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAt {
    /// At once (the column's default, the database's `now()`).
    Now,
    /// At this instant.
    At(DateTime<Utc>),
    /// This long after the database's `now()`.
    After(std::time::Duration),
}

/// A task to insert. [`NewTask::new`] leaves everything but the payload and queue to the
/// table's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    pub queue: String,
    pub payload: String,
    /// Higher is claimed first; `None` is the column's default, 0.
    pub priority: Option<i16>,
    pub run_at: RunAt,
    /// `None`: the queue's `max_attempts` setting (docs/limits.md), else 3.
    pub max_attempts: Option<i32>,
    /// Unique per queue: a second enqueue with it answers the first task.
    pub idempotency_key: Option<String>,
    /// What the queue's `max_running_per_key` counts by (docs/limits.md).
    pub concurrency_key: Option<String>,
    /// The tasks it waits for, each enqueued before it (schema 37): it is WAITING until they
    /// have ended. Empty for none; a duplicate is ignored by the database.
    pub depends_on: Vec<i64>,
    /// What a parent's failure does to it; `None` is the column's meaning when unset,
    /// [`OnDepFailure::Cancel`].
    pub on_dep_failure: Option<OnDepFailure>,
    /// Labels to find it by (schema 38), at most [`MAX_TAGS`]; empty for none (a null).
    pub tags: Vec<String>,
    /// A JSON object to find it by (schema 38), checked when it was made.
    pub metadata: Option<Metadata>,
    /// The batch it is a member of (schema 39, [`super::batches`]): it must exist and not be
    /// sealed, which only the insert can tell ([`super::batches::refusal`]).
    pub batch_id: Option<i64>,
}

impl NewTask {
    pub fn new(queue: &str, payload: &str) -> NewTask {
        NewTask {
            queue: queue.to_string(),
            payload: payload.to_string(),
            priority: None,
            run_at: RunAt::Now,
            max_attempts: None,
            idempotency_key: None,
            concurrency_key: None,
            depends_on: Vec::new(),
            on_dep_failure: None,
            tags: Vec::new(),
            metadata: None,
            batch_id: None,
        }
    }

    /// Check the queue name, the payload, the keys, the number of parents and the tags (the
    /// metadata was checked when it was made): what the CLI and the HTTP API do before they
    /// call [`enqueue`].
    ///
    /// # Errors
    ///
    /// The first field that breaks its rule.
    pub fn check(&self) -> Result<(), BadInput> {
        check_queue_name(&self.queue)?;
        check_payload(&self.payload)?;
        if let Some(key) = &self.idempotency_key {
            check_idempotency_key(key)?;
        }
        if let Some(key) = &self.concurrency_key {
            check_concurrency_key(key)?;
        }
        check_depends_on(&self.depends_on)?;
        check_tags(&self.tags)?;
        Ok(())
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new task.
    Created(i64),
    /// The idempotency key was taken by this task, with the same payload: a repeat.
    Existing(i64),
    /// The idempotency key was taken by this task, with another payload: nothing inserted.
    KeyConflict(i64),
}

impl Enqueued {
    /// The id of the task the key (or the insert) names.
    pub fn id(self) -> i64 {
        match self {
            Enqueued::Created(id) | Enqueued::Existing(id) | Enqueued::KeyConflict(id) => id,
        }
    }
}

/// Insert or, for a key already taken, find. The defaults written here are the columns' own
/// (`pgtaskd.tasks` in sql/schema.sql). The read of a taken key is a second part of the same statement, which
/// cannot see a row committed by a concurrent enqueue it waited for: then [`enqueue`] asks
/// again, with a fresh snapshot. A parent that does not exist, or is not older than the task,
/// fails the insert ([`refusal`] sorts it), as does a batch that does not exist or is sealed
/// ([`super::batches::refusal`]). Tags, metadata and batch are nulls unless given (`$11`,
/// `$12`, the metadata's JSON text, `$13`).
pub(super) const ENQUEUE: &str = "
WITH inserted AS (
    INSERT INTO pgtaskd.tasks (queue, payload, priority, run_at, max_attempts, idempotency_key,
                               concurrency_key, depends_on, on_dep_failure, tags, metadata,
                               batch_id)
    VALUES ($1, $2, coalesce($3, 0), coalesce($4, now() + coalesce($5, 0) * interval '1 millisecond'),
            $6, $7, $8, $9, $10, $11, $12::jsonb, $13)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id, true, true FROM inserted
UNION ALL
SELECT t.id, false, t.payload = $2
  FROM pgtaskd.tasks AS t
 WHERE $7 IS NOT NULL AND t.queue = $1 AND t.idempotency_key = $7
   AND NOT EXISTS (SELECT FROM inserted)";

/// How many times a keyed enqueue asks again when the key's holder was not visible to it.
const KEY_ROUNDS: usize = 5;

/// Insert `task`; the insert trigger wakes the daemons at commit. With an idempotency key
/// already taken in the queue, nothing is inserted and the holder's id comes back, as a
/// repeat when its payload is the same.
///
/// # Errors
///
/// Database failures; a parent that does not exist or is not older than the task among them,
/// which [`refusal`] tells from the others, and a batch that does not exist or is sealed,
/// which [`super::batches::refusal`] tells.
pub async fn enqueue(client: &Client, task: &NewTask) -> Result<Enqueued, DbError> {
    enqueue_with(client, ENQUEUE, task).await
}

/// [`enqueue`] with `sql`, [`ENQUEUE`] or a form of it that reads the payload elsewhere.
pub(super) async fn enqueue_with(
    client: &impl tokio_postgres::GenericClient,
    sql: &str,
    task: &NewTask,
) -> Result<Enqueued, DbError> {
    let (at, delay_ms) = match task.run_at {
        RunAt::Now => (None, None),
        RunAt::At(at) => (Some(at), None),
        RunAt::After(delay) => (None, Some(delay.as_secs_f64() * 1000.0)),
    };
    let priority = task.priority;
    // No parents is a null, as a producer's own INSERT leaves it.
    let depends_on = (!task.depends_on.is_empty()).then_some(&task.depends_on);
    let on_dep_failure = task.on_dep_failure.map(OnDepFailure::as_str);
    let tags = (!task.tags.is_empty()).then_some(&task.tags);
    let metadata = task.metadata.as_ref().map(Metadata::as_str);
    for _ in 0..KEY_ROUNDS {
        let rows = client
            .query_typed(
                sql,
                &[
                    (&task.queue, Type::TEXT),
                    (&task.payload, Type::TEXT),
                    (&priority, Type::INT2),
                    (&at, Type::TIMESTAMPTZ),
                    (&delay_ms, Type::FLOAT8),
                    (&task.max_attempts, Type::INT4),
                    (&task.idempotency_key, Type::TEXT),
                    (&task.concurrency_key, Type::TEXT),
                    (&depends_on, Type::INT8_ARRAY),
                    (&on_dep_failure, Type::TEXT),
                    (&tags, Type::TEXT_ARRAY),
                    (&metadata, Type::TEXT),
                    (&task.batch_id, Type::INT8),
                ],
            )
            .await?;
        if let Some(row) = rows.first() {
            let id: i64 = row.get(0);
            return Ok(match (row.get::<_, bool>(1), row.get::<_, bool>(2)) {
                (true, _) => Enqueued::Created(id),
                (false, true) => Enqueued::Existing(id),
                (false, false) => Enqueued::KeyConflict(id),
            });
        }
    }
    Err(DbError::unavailable(
        "the idempotency key is held by a task that could not be read",
    ))
}

#[cfg(test)]
mod tests;
