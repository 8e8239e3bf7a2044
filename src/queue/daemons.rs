//! The daemons connected: each running daemon's row in `pgtaskd.daemons` (docs/design.md,
//! "Daemons connected"), and what readers make of them.
//!
//! A daemon writes its row with [`register`] at its start and at every heartbeat (an upsert:
//! a row deleted meanwhile, by an operator or by another daemon's [`forget`] after a long
//! outage, comes back), and deletes it with [`remove`] at a clean stop. A row whose
//! heartbeat is older than [`STALE_PERIODS`] of its own periods counts as gone; [`forget`]
//! deletes those older than [`FORGET_AFTER`]. [`list`] is `pgtaskd daemons`; [`serves`] is
//! the one read `pgtaskd enqueue` makes before warning about a queue nobody serves.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::db::DbError;

/// A row is stale when its heartbeat is older than this many of its periods.
pub const STALE_PERIODS: u32 = 3;
/// A row whose heartbeat is older than this is deleted by any daemon.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The SQL condition "this row (alias `d`) is live", shared by every reader: its heartbeat
/// is younger than [`STALE_PERIODS`] (3) of its periods.
macro_rules! live {
    () => {
        "d.heartbeat_at >= now() - 3 * d.heartbeat_every"
    };
}
pub(crate) use live;

/// Insert or renew `instance`'s row; `started_at` is kept from the first insert.
const REGISTER: &str = "
INSERT INTO pgtaskd.daemons AS d (instance, version, queues, heartbeat_every, handlers)
VALUES ($1, $2, $3, $4 * interval '1 millisecond', $5)
ON CONFLICT (instance) DO UPDATE
   SET version = excluded.version,
       queues = excluded.queues,
       handlers = excluded.handlers,
       heartbeat_every = excluded.heartbeat_every,
       heartbeat_at = now()";

/// Delete `instance`'s row, unless a task is still RUNNING under its lease key `$2` (a result
/// parked for a rescuer, a claim not given back): the row then stays to turn stale, so that
/// the view keeps naming that lease's holder by its whole id. Returns the rows deleted.
const REMOVE: &str = "
WITH gone AS (
    DELETE FROM pgtaskd.daemons AS d
     WHERE d.instance = $1
       AND NOT EXISTS (SELECT 1 FROM pgtaskd.task_state AS s
                        WHERE s.status = 'RUNNING' AND s.lease_owner = $2)
    RETURNING 1
)
SELECT count(*) FROM gone";

/// Delete the rows whose heartbeat is older than `$1` milliseconds.
const FORGET: &str = "
WITH gone AS (
    DELETE FROM pgtaskd.daemons WHERE heartbeat_at < now() - $1 * interval '1 millisecond'
    RETURNING 1
)
SELECT count(*) FROM gone";

const LIST: &str = concat!(
    "
SELECT d.instance, d.version, d.queues, d.handlers, d.started_at, d.heartbeat_at,
       extract(epoch FROM d.heartbeat_every)::float8 AS heartbeat_every_s,
       extract(epoch FROM now() - d.heartbeat_at)::float8 AS heartbeat_age_s,
       NOT (",
    live!(),
    ") AS stale
  FROM pgtaskd.daemons AS d
 ORDER BY d.started_at, d.instance"
);

/// How the other live daemons run the queues in `$2` (those that said: schema 23 and later).
const ELSEWHERE: &str = concat!(
    "
SELECT d.instance, q.queue, q.handler
  FROM pgtaskd.daemons AS d, unnest(d.queues, d.handlers) AS q (queue, handler)
 WHERE d.instance <> $1 AND d.handlers IS NOT NULL AND q.queue = ANY ($2) AND ",
    live!(),
    "
 ORDER BY q.queue, d.instance"
);

const SERVES: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM pgtaskd.daemons AS d WHERE $1 = ANY (d.queues) AND ",
    live!(),
    ")"
);

/// One row of `pgtaskd.daemons`, as `pgtaskd daemons --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Registered {
    /// Its instance id (`host:pid:random`), as it logs it and as its leases name it.
    pub instance: String,
    /// The version of its binary.
    pub version: String,
    /// The queues it serves (`worker.queues`, every lane's).
    pub queues: Vec<String>,
    /// How it runs each of them, in the same order: `text-stats`, `exec:HASH` or `http:HASH`
    /// (`null` from a daemon older than schema 23).
    pub handlers: Option<Vec<String>>,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// How often it renews `heartbeat_at`, in seconds.
    pub heartbeat_every_s: f64,
    /// Seconds since its last heartbeat, by the database clock.
    pub heartbeat_age_s: f64,
    /// No heartbeat for [`STALE_PERIODS`] periods: it counts as gone (killed, or cut off).
    pub stale: bool,
}

/// Insert or renew `instance`'s row: this binary's `version`, the `queues` it serves and how
/// it runs each (`handlers`, parallel to `queues`), a heartbeat every `every`.
///
/// # Errors
///
/// Database failures; the row is then as it was.
pub async fn register(
    client: &Client,
    instance: &str,
    version: &str,
    queues: &[String],
    handlers: &[String],
    every: Duration,
) -> Result<(), DbError> {
    let every_ms = every.as_millis() as f64;
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&instance, Type::TEXT),
        (&version, Type::TEXT),
        (&queues, Type::TEXT_ARRAY),
        (&every_ms, Type::FLOAT8),
        (&handlers, Type::TEXT_ARRAY),
    ];
    client.query_typed(REGISTER, &params).await?;
    Ok(())
}

/// Delete `instance`'s row at a stop, unless a task is still RUNNING under its lease key (a
/// result parked for a rescuer, a claim not given back): false when the row was kept (or was
/// gone already). A row kept turns stale, as a crashed daemon's does, and is forgotten after
/// [`FORGET_AFTER`]; until then `pgtaskd.task_view` names the lease's holder by its whole id.
///
/// # Errors
///
/// Database failures; the row then turns stale too.
pub async fn remove(client: &Client, instance: &str) -> Result<bool, DbError> {
    let key = crate::queue::lease_key(instance);
    let row = client
        .query_typed_one(REMOVE, &[(&instance, Type::TEXT), (&key, Type::TEXT)])
        .await?;
    Ok(row.get::<_, i64>(0) > 0)
}

/// Delete the rows whose heartbeat is older than `after`; returns how many.
///
/// # Errors
///
/// Database failures.
pub async fn forget(client: &Client, after: Duration) -> Result<u64, DbError> {
    let after_ms = after.as_millis() as f64;
    let row = client
        .query_typed_one(FORGET, &[(&after_ms, Type::FLOAT8)])
        .await?;
    let deleted: i64 = row.get(0);
    Ok(deleted as u64)
}

/// Every row, oldest start first, stale ones included.
///
/// # Errors
///
/// Database failures.
pub async fn list(client: &Client) -> Result<Vec<Registered>, DbError> {
    let rows = client.query_typed(LIST, &[]).await?;
    Ok(rows
        .iter()
        .map(|row| Registered {
            instance: row.get("instance"),
            version: row.get("version"),
            queues: row.get("queues"),
            handlers: row.get("handlers"),
            started_at: row.get("started_at"),
            heartbeat_at: row.get("heartbeat_at"),
            heartbeat_every_s: row.get("heartbeat_every_s"),
            heartbeat_age_s: row.get("heartbeat_age_s"),
            stale: row.get("stale"),
        })
        .collect())
}

/// Whether a live daemon serves `queue`.
///
/// # Errors
///
/// Database failures.
pub async fn serves(client: &Client, queue: &str) -> Result<bool, DbError> {
    let row = client
        .query_typed_one(SERVES, &[(&queue, Type::TEXT)])
        .await?;
    Ok(row.get(0))
}

/// A queue another live daemon runs: which daemon, and how (`text-stats`, `exec:HASH`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunElsewhere {
    pub instance: String,
    pub queue: String,
    pub handler: String,
}

/// How the live daemons other than `instance` run the queues of `queues` (those of schema 23
/// and later, which record it), by queue then instance.
///
/// # Errors
///
/// Database failures.
pub async fn run_elsewhere(
    client: &Client,
    instance: &str,
    queues: &[String],
) -> Result<Vec<RunElsewhere>, DbError> {
    let rows = client
        .query_typed(
            ELSEWHERE,
            &[(&instance, Type::TEXT), (&queues, Type::TEXT_ARRAY)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| RunElsewhere {
            instance: row.get("instance"),
            queue: row.get("queue"),
            handler: row.get("handler"),
        })
        .collect())
}

/// The transaction-scoped advisory lock key that serialises daemons' starts ("pgtdhand").
const START_LOCK: i64 = 0x7067_7464_6861_6e64;

/// At a daemon's start: [`register`] its row and read [`run_elsewhere`] in one transaction,
/// under an advisory lock that every starting daemon takes, so that of two daemons starting
/// at once the second sees the first's row (each statement of a transaction reads what was
/// committed before it began, and the first commits before the second gets the lock).
///
/// # Errors
///
/// Database failures; the transaction is rolled back (or, when the database is gone, the
/// session discarded by its bound).
pub async fn register_and_read(
    client: &Client,
    instance: &str,
    version: &str,
    queues: &[String],
    handlers: &[String],
    every: Duration,
) -> Result<Vec<RunElsewhere>, DbError> {
    if let Err(err) = client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({START_LOCK})"
        ))
        .await
    {
        // The BEGIN may have run (the lock's wait timed out): never hand the session back
        // inside a failed transaction.
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(err.into());
    }
    let done = async {
        register(client, instance, version, queues, handlers, every).await?;
        run_elsewhere(client, instance, queues).await
    }
    .await;
    match done {
        Ok(others) => {
            client.batch_execute("COMMIT").await?;
            Ok(others)
        }
        Err(err) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(err)
        }
    }
}
