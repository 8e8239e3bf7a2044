//! Vacuum health: one call of `pgtaskd.vacuum_health()` (in `sql/schema.sql`) reads
//! whether the task table is bloating and whether vacuum is held back (docs/design.md,
//! "Vacuum health"): its live and dead tuples, when it was last vacuumed, its sizes, and the
//! oldest xmin horizon that holds back its vacuum with what holds it. The function runs with
//! its owner's rights and returns no query text; the daemon's role only executes it.

use tokio_postgres::Client;

use crate::db::DbError;

const VACUUM_HEALTH: &str = "
SELECT live_tuples, dead_tuples, vacuum_age_s, autovacuum_age_s, vacuum_count, autovacuum_count,
       table_bytes, toast_bytes, index_bytes,
       horizon_kind, horizon_xid, horizon_age_xids, horizon_age_s,
       holder_pid, holder_name, holder_state, sees_all_sessions
  FROM pgtaskd.vacuum_health()";

/// What holds the oldest xmin horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HorizonKind {
    /// A session's snapshot or transaction id.
    Session,
    /// A prepared (two-phase) transaction.
    PreparedTransaction,
    /// A replication slot's `xmin`.
    ReplicationSlot,
}

impl HorizonKind {
    /// The name the function and the `kind` label use.
    pub fn as_str(self) -> &'static str {
        match self {
            HorizonKind::Session => "session",
            HorizonKind::PreparedTransaction => "prepared_transaction",
            HorizonKind::ReplicationSlot => "replication_slot",
        }
    }

    fn parse(text: &str) -> Option<HorizonKind> {
        match text {
            "session" => Some(HorizonKind::Session),
            "prepared_transaction" => Some(HorizonKind::PreparedTransaction),
            "replication_slot" => Some(HorizonKind::ReplicationSlot),
            _ => None,
        }
    }
}

/// The oldest xmin horizon and what holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Horizon {
    pub kind: HorizonKind,
    /// The transaction id that is the horizon (what tells one horizon from the next).
    pub xid: i64,
    /// How many transaction ids were assigned since it.
    pub age_xids: i64,
    /// Seconds since it began, when the server knows: a session's `xact_start` (hidden from
    /// an owner without `pg_read_all_stats` for other roles' sessions), a prepared
    /// transaction's `prepared`; never for a slot.
    pub age_s: Option<f64>,
    /// The session's pid, or the pid of the session using the slot.
    pub pid: Option<i32>,
    /// The session's `application_name`, or the slot's name.
    pub name: Option<String>,
    /// The session's state (`active`, `idle in transaction`, ...), when seen.
    pub state: Option<String>,
}

/// One reading of the vacuum health of `pgtaskd.task_state`.
#[derive(Debug, Clone, PartialEq)]
pub struct VacuumHealth {
    /// The statistics system's estimate of live tuples.
    pub live_tuples: i64,
    /// Its estimate of dead tuples: what the next vacuum can remove, if the horizon allows.
    pub dead_tuples: i64,
    /// Seconds since the last manual `VACUUM`; `None`: none since the statistics were reset.
    pub vacuum_age_s: Option<f64>,
    /// Seconds since the last autovacuum; `None`: none since the statistics were reset.
    pub autovacuum_age_s: Option<f64>,
    pub vacuum_count: i64,
    pub autovacuum_count: i64,
    /// The heap's main fork.
    pub table_bytes: i64,
    /// The TOAST table and its index.
    pub toast_bytes: i64,
    /// Every index of the table.
    pub index_bytes: i64,
    /// `None` when nothing holds a horizon (no snapshot, transaction, prepared transaction or
    /// slot besides the reader's own statement).
    pub horizon: Option<Horizon>,
    /// Whether the function's owner sees every session's state and start (a superuser, or a
    /// member of `pg_read_all_stats`).
    pub sees_all_sessions: bool,
}

/// Read the vacuum health of `pgtaskd.task_state`: one statement, a few milliseconds.
///
/// # Errors
///
/// Database failures, and a role without `EXECUTE` on `pgtaskd.vacuum_health()` (not granted
/// by `grant_daemon` before schema 9: migrate, or grant it).
pub async fn vacuum_health(client: &Client) -> Result<VacuumHealth, DbError> {
    let row = client.query_typed_one(VACUUM_HEALTH, &[]).await?;
    let kind: Option<String> = row.try_get("horizon_kind")?;
    let horizon = match kind.as_deref().and_then(HorizonKind::parse) {
        Some(kind) => Some(Horizon {
            kind,
            xid: row.try_get("horizon_xid")?,
            age_xids: row.try_get("horizon_age_xids")?,
            age_s: row
                .try_get::<_, Option<f64>>("horizon_age_s")?
                .map(|s| s.max(0.0)),
            pid: row.try_get("holder_pid")?,
            name: row.try_get("holder_name")?,
            state: row.try_get("holder_state")?,
        }),
        None => None,
    };
    Ok(VacuumHealth {
        live_tuples: row.try_get("live_tuples")?,
        dead_tuples: row.try_get("dead_tuples")?,
        vacuum_age_s: row.try_get("vacuum_age_s")?,
        autovacuum_age_s: row.try_get("autovacuum_age_s")?,
        vacuum_count: row.try_get("vacuum_count")?,
        autovacuum_count: row.try_get("autovacuum_count")?,
        table_bytes: row.try_get("table_bytes")?,
        toast_bytes: row.try_get("toast_bytes")?,
        index_bytes: row.try_get("index_bytes")?,
        horizon,
        sees_all_sessions: row.try_get("sees_all_sessions")?,
    })
}
