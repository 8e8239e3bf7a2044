//! Idle flags: a daemon waiting for work says so in `pgtaskd.idle_daemons`, and the insert
//! trigger notifies only while some flag is live (docs/design.md, "Idle flags").
//!
//! [`flag_idle`] writes the flag and then, in a transaction of its own (pipelined on the same
//! session: one round trip), reads which transactions were still in progress once the flag
//! was visible: the only producers that may have read "nobody idle" and still commit their
//! rows later. [`settled`] tells which of those have ended since. [`clear_idle`] expires the
//! flag when the daemon becomes busy, [`remove_idle`] deletes it when the daemon stops.
//!
//! A daemon's flag is one row for its whole life, only ever updated in place: neither
//! statement that writes it changes its key, so each is a HOT update that any later read of
//! the page prunes. The table stays at one page per few dozen daemons however often they go
//! idle and busy, with or without vacuum, as long as the xmin horizon moves. (Deleting the
//! flag on every busy turn left a dead line pointer behind each time: without autovacuum the
//! table grew by a page every few hundred turns, and every INSERT's trigger reads all of its
//! pages.)

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::db::DbError;

/// Upsert this instance's flag, live for `ttl` by the database clock.
const FLAG: &str = "
INSERT INTO pgtaskd.idle_daemons AS d (instance, expires_at)
VALUES ($1, now() + $2 * interval '1 millisecond')
ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at";

/// The transactions in progress in a snapshot taken now, as text (`xid8` has no binary form
/// in the client).
const IN_PROGRESS: &str = "SELECT coalesce(array_agg(x::text), '{}') \
     FROM pg_snapshot_xip(pg_current_snapshot()) AS x";

/// Expire this instance's flag in place (the trigger reads only flags that expire later than
/// now).
const CLEAR: &str = "UPDATE pgtaskd.idle_daemons SET expires_at = '-infinity' WHERE instance = $1";

/// Delete this instance's flag: the daemon stops.
const REMOVE: &str = "DELETE FROM pgtaskd.idle_daemons WHERE instance = $1";

/// Of the transactions named, those still in progress, and whether any of the others
/// committed (an aborted one inserted nothing anybody will see).
const SETTLED: &str = "
SELECT coalesce(array_agg(s.x) FILTER (WHERE s.status = 'in progress'), '{}'),
       coalesce(bool_or(s.status = 'committed'), false)
  FROM (SELECT x, pg_xact_status(x::xid8) AS status FROM unnest($1::text[]) AS x) AS s";

/// Flag `instance` idle for `ttl`, then return the transactions in progress once the flag was
/// committed. A producer whose trigger read the flags before that commit is among them, or
/// had committed already (then a claim sent after this returns sees its rows).
///
/// # Errors
///
/// Database failures; the flag may or may not have been written (it expires either way).
pub async fn flag_idle(
    client: &Client,
    instance: &str,
    ttl: Duration,
) -> Result<Vec<String>, DbError> {
    let ttl_ms = ttl.as_millis() as f64;
    // Both on one session, in this order: the server runs them one after the other, each in
    // a transaction of its own, so the snapshot is taken after the flag's commit.
    let params: [(&(dyn ToSql + Sync), Type); 2] =
        [(&instance, Type::TEXT), (&ttl_ms, Type::FLOAT8)];
    let flag = client.query_typed(FLAG, &params);
    let snapshot = client.query_typed(IN_PROGRESS, &[]);
    let (_, rows) = tokio::try_join!(flag, snapshot)?;
    let xids: Vec<String> = rows.first().map(|row| row.get(0)).unwrap_or_default();
    Ok(xids)
}

/// Expire `instance`'s flag: inserts stop notifying for it. The row stays for the next
/// [`flag_idle`].
///
/// # Errors
///
/// Database failures; the flag then stays until it expires (inserts notify in vain meanwhile).
pub async fn clear_idle(client: &Client, instance: &str) -> Result<(), DbError> {
    write_flag(client, CLEAR, instance).await
}

/// Delete `instance`'s flag, at the daemon's stop.
///
/// # Errors
///
/// Database failures; the flag then stays until it expires (inserts notify in vain
/// meanwhile), and its row until a daemon of the same instance id, which never comes again,
/// or an operator deletes it (an expired row costs the trigger one row's read).
pub async fn remove_idle(client: &Client, instance: &str) -> Result<(), DbError> {
    write_flag(client, REMOVE, instance).await
}

/// Run `sql`, a statement on `instance`'s flag alone.
async fn write_flag(client: &Client, sql: &str, instance: &str) -> Result<(), DbError> {
    client.query_typed(sql, &[(&instance, Type::TEXT)]).await?;
    Ok(())
}

/// Of `xids`, those still in progress, and whether any other committed.
///
/// # Errors
///
/// Database failures.
pub async fn settled(client: &Client, xids: &[String]) -> Result<(Vec<String>, bool), DbError> {
    let rows = client
        .query_typed(SETTLED, &[(&xids, Type::TEXT_ARRAY)])
        .await?;
    // An aggregate: always one row.
    Ok(rows
        .first()
        .map(|row| (row.get(0), row.get(1)))
        .unwrap_or_default())
}
