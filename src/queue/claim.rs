//! Claiming: QUEUED -> RUNNING, in batches, with exactly one winner per task ("One winner" in
//! docs/design.md).
//!
//! The rows are picked in a materialized CTE with `FOR UPDATE SKIP LOCKED`, so that concurrent
//! claimers step around each other instead of queueing, and the outer `UPDATE` re-checks
//! `status = 'QUEUED'`: the database is the arbiter, never an in-process lock. Each queue is
//! read through its own ordered scan of the partial index (a `LATERAL` per queue): a single
//! `queue = ANY(...)` scan would sort every QUEUED row of the queues on every claim. (A plain
//! `WHERE id IN (SELECT ... LIMIT n)` may be re-planned and update more rows than the limit.)
//! The claim increments `attempt`, takes a fencing token of its own (`claim_token`, from the
//! sequence `pgtaskd.claim_tokens`: unique per claim, docs/design.md "One claim, one token"),
//! and sets the lease from the database clock.

use std::time::Duration;

use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, Row};

use crate::db::DbError;

/// Payloads at least this long stay in the buffer the database's answer arrived in, rather
/// than being copied out: the daemon holds one copy of a large text, not two.
const KEEP_IN_ROW_FROM: usize = 64 * 1024;

/// The text of a claimed task, held once.
pub struct Payload(Text);

enum Text {
    Owned(String),
    /// A large payload, read in place from the row it arrived in (column 2).
    InRow(Row),
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        self.as_str().as_bytes()
    }
}

impl Payload {
    /// The text to analyze.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Text::Owned(text) => text,
            Text::InRow(row) => row.get::<_, Utf8>(2).0,
        }
    }
}

/// A `text` column read in place, its UTF-8 checked with SIMD instructions (`simdutf8`): the
/// standard library's check of every payload took a fifth of the daemon's CPU in a drain.
struct Utf8<'a>(&'a str);

impl<'a> FromSql<'a> for Utf8<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Utf8(simdutf8::basic::from_utf8(raw)?))
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Payload {
        Payload(Text::Owned(text))
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.as_str().len())
    }
}

/// A task this instance now runs, as the claim returned it.
#[derive(Debug)]
pub struct Claimed {
    pub id: i64,
    /// The attempt this claim is (counted from 1; a claim given back is not counted).
    pub attempt: i32,
    /// The claim's fencing token, unique per claim: every later change of this claim names it.
    pub token: i64,
    /// The payload's length in bytes.
    pub bytes: u64,
    /// The text; `None` when it is longer than the claim's `max_payload` and was left in the
    /// database.
    pub payload: Option<Payload>,
    /// Seconds from the task becoming due to the claim, by the database clock.
    pub waited: f64,
    /// What a handler is told about the task besides its id, attempt and claim.
    pub told: Told,
}

/// What the claim reads for a handler (docs/handlers.md, "What a handler is told").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Told {
    /// How many times the task's work was started, this start included: it never goes back
    /// (a release lowers the attempt, not this).
    pub run: i32,
    /// The task's key: the same for every claim of the task, different for every task and
    /// every database (`<site>-<id>-<created>`, as `pgtaskd.task_view.task_key` spells it).
    pub key: String,
    /// The key the producer enqueued the task with, if any.
    pub idempotency_key: Option<String>,
    /// The producer's W3C trace context, if any.
    pub traceparent: Option<String>,
    /// For a task with parents (`depends_on`, schema 37): `ID=STATUS` of its first 200
    /// parents in id order, separated by commas (`12=SUCCEEDED,13=FAILED`); `None` without.
    pub parents: Option<String>,
    /// How many parents it has (0 without).
    pub parent_count: i32,
    /// The progress earlier attempts left (schema 39), JSON text of an object; `None` when
    /// none was written.
    pub progress: Option<String>,
    /// The batch the task is a member of, or whose callback it is (schema 39).
    pub batch: Option<i64>,
    /// For a batch's callback: its members by outcome, `succeeded=N,failed=N,canceled=N`.
    pub batch_counts: Option<String>,
}

/// How much one claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimLimits {
    /// The most tasks.
    pub tasks: usize,
    /// The most payload bytes, all tasks together (payloads left in the database weigh
    /// nothing).
    pub bytes: u64,
    /// Take the first task whatever its size, so that a payload larger than any budget runs.
    pub take_one: bool,
    /// Payloads longer than this are claimed without their text.
    pub max_payload: Option<u64>,
}

/// A task's place in the order claims take tasks in: highest priority first, then lowest
/// id, which is how positions compare (a later position is greater). A claim given one
/// starts after it ([`claim_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub priority: i32,
    pub id: i64,
}

impl Ord for Position {
    fn cmp(&self, other: &Position) -> std::cmp::Ordering {
        (other.priority, self.id).cmp(&(self.priority, other.id))
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Position) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// What one claim took.
#[derive(Debug, Default)]
pub struct ClaimBatch {
    /// In the order they should start.
    pub tasks: Vec<Claimed>,
    /// Payload bytes the batch holds.
    pub bytes: u64,
    /// The size of the first due task that the byte budget left out, if any: claim again once
    /// that much is free.
    pub left_out: Option<u64>,
    /// The position of the last task claimed, in claim order.
    pub last: Option<Position>,
    /// A limited queue was passed over and may have room this much later: its lock was held
    /// by another claim, or its rate window was full (docs/limits.md). A queue at its running
    /// limit gives none: the end of one of its tasks notifies.
    pub again_in: Option<Duration>,
}

/// The statement lives in `pgtaskd.claim` (in sql/schema.sql), whose planner settings
/// keep the ordered index plan however stale the table's statistics are.
const CLAIM_AFTER: &str =
    "SELECT task_id, task_attempt, task_payload, task_bytes, waited_s, task_priority, task_claim, \
            task_run, task_key, task_idempotency_key, task_traceparent, task_parents, \
            task_parent_count, task_progress, task_batch, task_batch_counts \
     FROM pgtaskd.claim($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// What the claims of daemon `instance` write as `lease_owner`, and what every write fenced on
/// its leases names: the last `:`-separated part of the instance id, the key of
/// [`crate::daemon::new_instance_id`] (schema 41). Ten characters whatever the host's name,
/// so that the state row's version a held snapshot keeps stays narrow; `pgtaskd.task_view`
/// answers the whole id of the daemon whose id's last part it is (`pgtaskd.lease_holder`). An
/// instance id without a `:` is its own key.
pub fn lease_key(instance: &str) -> &str {
    instance.rsplit(':').next().unwrap_or(instance)
}

/// Claim, for lease owner `owner` (a [`lease_key`]) with a lease of `lease`, the QUEUED tasks of `queues` whose
/// `run_at` has come, highest priority first, then oldest, within `limits`: once the next
/// task's payload would take the batch past `limits.bytes`, no more are taken (the first one
/// aside, with `limits.take_one`). An empty batch means nothing could be claimed, not an error.
///
/// # Errors
///
/// Database failures. A server error changed nothing; when the connection failed
/// ([`DbError::Unavailable`]), the claim may have committed without its answer arriving, and
/// [`held_by`] finds its tasks.
pub async fn claim_within(
    client: &Client,
    owner: &str,
    queues: &[String],
    limits: ClaimLimits,
    lease: Duration,
) -> Result<ClaimBatch, DbError> {
    claim_after(client, owner, queues, limits, lease, None).await
}

/// [`claim_within`], reading only the tasks after `after` in claim order when it is given
/// (positioned by the index: the dead entries of tasks claimed before it are never read). It
/// does not see a task before the position, whatever its priority or age: the caller claims
/// without one often enough (docs/design.md, "Claims after a position").
///
/// # Errors
///
/// As [`claim_within`].
pub async fn claim_after(
    client: &Client,
    owner: &str,
    queues: &[String],
    limits: ClaimLimits,
    lease: Duration,
    after: Option<Position>,
) -> Result<ClaimBatch, DbError> {
    let after_priority = after.map(|p| p.priority);
    let after_id = after.map(|p| p.id);
    let max_tasks = i64::try_from(limits.tasks).unwrap_or(i64::MAX);
    let max_bytes = i64::try_from(limits.bytes).unwrap_or(i64::MAX);
    let max_payload = limits
        .max_payload
        .map(|most| i64::try_from(most).unwrap_or(i64::MAX));
    let lease_ms = lease.as_millis() as f64;
    let rows = client
        .query_typed(
            CLAIM_AFTER,
            &[
                (&queues, Type::TEXT_ARRAY),
                (&max_tasks, Type::INT8),
                (&owner, Type::TEXT),
                (&lease_ms, Type::FLOAT8),
                (&max_bytes, Type::INT8),
                (&limits.take_one, Type::BOOL),
                (&max_payload, Type::INT8),
                (&after_priority, Type::INT4),
                (&after_id, Type::INT8),
            ],
        )
        .await?;
    let mut batch = ClaimBatch::default();
    for row in rows {
        let Some(id) = row.get::<_, Option<i64>>(0) else {
            match row.get::<_, Option<i64>>(3) {
                Some(size) => batch.left_out = Some(u64::try_from(size).unwrap_or(0)),
                None => {
                    let seconds = row.get::<_, Option<f64>>(4).unwrap_or(0.0);
                    batch.again_in = Some(Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0)));
                }
            }
            continue;
        };
        let size = u64::try_from(row.get::<_, i64>(3)).unwrap_or(0);
        let attempt = row.get(1);
        let waited = row.get(4);
        let token = row.get(6);
        let told = Told {
            run: row.get(7),
            key: row.get::<_, Option<String>>(8).unwrap_or_default(),
            idempotency_key: row.get(9),
            traceparent: row.get(10),
            parents: row.get(11),
            parent_count: row.get::<_, Option<i32>>(12).unwrap_or(0),
            progress: row.get(13),
            batch: row.get(14),
            batch_counts: row.get(15),
        };
        batch.last = Some(Position {
            priority: row.get(5),
            id,
        });
        let payload = match row.get::<_, Option<Utf8>>(2) {
            None => None,
            Some(Utf8(text)) if text.len() < KEEP_IN_ROW_FROM => {
                Some(Payload::from(text.to_owned()))
            }
            Some(_) => Some(Payload(Text::InRow(row))),
        };
        if payload.is_some() {
            batch.bytes += size;
        }
        batch.tasks.push(Claimed {
            id,
            attempt,
            token,
            bytes: size,
            payload,
            waited,
            told,
        });
    }
    Ok(batch)
}

/// Claim up to `limit` tasks with no byte budget: [`claim_within`] for callers that hold
/// small texts (tools and tests).
///
/// # Errors
///
/// As [`claim_within`].
pub async fn claim(
    client: &Client,
    owner: &str,
    queues: &[String],
    limit: usize,
    lease: Duration,
) -> Result<Vec<Claimed>, DbError> {
    let limits = ClaimLimits {
        tasks: limit,
        bytes: u64::MAX,
        take_one: true,
        max_payload: None,
    };
    Ok(claim_within(client, owner, queues, limits, lease)
        .await?
        .tasks)
}

/// The claims the table holds for lease owner `owner` (a [`lease_key`]) in `queues`: `(id, attempt, token)` of its
/// RUNNING rows, read through the partial index of RUNNING rows. (A daemon's lanes share its
/// instance id, each with queues of its own.)
///
/// # Errors
///
/// Database failures.
pub async fn held_by(
    client: &Client,
    owner: &str,
    queues: &[String],
) -> Result<Vec<(i64, i32, i64)>, DbError> {
    let rows = client
        .query_typed(
            "SELECT id, attempt, claim_token FROM pgtaskd.task_state \
              WHERE status = 'RUNNING' AND lease_owner = $1 AND queue = ANY ($2)",
            &[(&owner, Type::TEXT), (&queues, Type::TEXT_ARRAY)],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|row| Some((row.get(0), row.get(1), row.get::<_, Option<i64>>(2)?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::lease_key;

    #[test]
    fn a_daemons_lease_key_is_the_ten_characters_that_end_its_instance_id() {
        let mut keys = std::collections::HashSet::new();
        for _ in 0..100 {
            let instance = crate::daemon::new_instance_id();
            let key = lease_key(&instance);
            assert_eq!(key.len(), 10, "{instance}");
            assert!(
                key.bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()),
                "{instance}"
            );
            assert!(keys.insert(key.to_string()), "{key} drawn twice");
            assert_eq!(
                instance.strip_suffix(key).map(|s| s.ends_with(':')),
                Some(true)
            );
        }
        assert_eq!(lease_key("a-long-host-name:4242:00c0ffee42"), "00c0ffee42");
        assert_eq!(lease_key("daemon-b"), "daemon-b");
    }
}
