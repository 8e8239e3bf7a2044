//! Schema migrations: the numbered files of `sql/`, embedded in the binary.
//!
//! [`migrate`] applies the pending ones in order, all in one transaction, under a
//! transaction-level advisory lock so that daemons started together never race; it records
//! each in `pgtaskd.schema_migrations`, so applying twice is a no-op. [`check`] is what
//! `pgtaskd run` does instead: it refuses a database whose schema it does not know.
//! Both refuse a database whose encoding is not UTF8 (payloads are UTF-8 text). [`target`]
//! says which database a session is on, as `pgtaskd migrate` prints it and `run --migrate`
//! logs it before migrating.

use std::fmt;

use tokio_postgres::config::Host;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::{ConnectSettings, DbError};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// A [`Migration`] of `sql/NAME.sql`: its version, its name, and its text embedded.
macro_rules! migration {
    ($version:literal, $name:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../sql/", $name, ".sql")),
        }
    };
}

/// Every migration this binary knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_tasks"),
    migration!(2, "0002_roles"),
    migration!(3, "0003_plans"),
    migration!(4, "0004_hardening"),
    migration!(5, "0005_completions"),
    migration!(6, "0006_queues"),
    migration!(7, "0007_idle_notify"),
    migration!(8, "0008_autovacuum"),
    migration!(9, "0009_vacuum_health"),
    migration!(10, "0010_notify_cost"),
    migration!(11, "0011_plans_by_key"),
    migration!(12, "0012_claim_after"),
    migration!(13, "0013_positions"),
    migration!(14, "0014_idle_hint"),
    migration!(15, "0015_definer_paths"),
    migration!(16, "0016_claim_tokens"),
    migration!(17, "0017_prepared_producers"),
    migration!(18, "0018_queue_names"),
    migration!(19, "0019_handlers"),
    migration!(20, "0020_list_indexes"),
    migration!(21, "0021_daemons"),
    migration!(22, "0022_retry_failed"),
    migration!(23, "0023_daemon_handlers"),
    migration!(24, "0024_task_view"),
    migration!(25, "0025_claim_tokens_by_timeline"),
    migration!(26, "0026_state_functions"),
    migration!(27, "0027_room_for_updates"),
    migration!(28, "0028_parked_results"),
    migration!(29, "0029_quiet_sessions"),
    migration!(30, "0030_task_keys"),
    migration!(31, "0031_schedules"),
    migration!(32, "0032_snooze"),
    migration!(33, "0033_queue_limits"),
    migration!(34, "0034_parked_results_skip_locked"),
    migration!(35, "0035_schedule_and_limit_mends"),
    migration!(36, "0036_task_state"),
    migration!(37, "0037_dependencies"),
    migration!(38, "0038_tags"),
    migration!(39, "0039_batches_and_progress"),
    migration!(40, "0040_narrow_state"),
    migration!(41, "0041_lease_key"),
    migration!(42, "0042_graph_cycle"),
    migration!(43, "0043_graph_missing_ref"),
    migration!(44, "0044_claim_lookups"),
    migration!(45, "0045_settle_lookups"),
    migration!(46, "0046_state_rights"),
    migration!(47, "0047_created_at_range"),
    migration!(48, "0048_batch_loops"),
];

/// The schema version this binary was built for.
pub const LATEST_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// The advisory lock key held while migrating ("pgtaskd" in ASCII).
const MIGRATION_LOCK: i64 = 0x0070_6774_6173_6b64;

/// Why the schema cannot be used as it is (exit 78), or the database failed.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("database encoding is {0}, but pgtaskd needs UTF8 (create the database with ENCODING 'UTF8')")]
    Encoding(String),
    #[error(
        "the pgtaskd schema is not installed: run `pgtaskd migrate` (or `pgtaskd run --migrate`)"
    )]
    Missing,
    #[error("the pgtaskd schema is at version {found}, older than this binary's {LATEST_VERSION}: run `pgtaskd migrate`")]
    Behind { found: i32 },
    #[error("the pgtaskd schema is at version {found}, newer than this binary knows ({LATEST_VERSION}): upgrade pgtaskd")]
    Ahead { found: i32 },
    #[error("pgtaskd.site has no row: its id is the first part of every task key a handler is given; run `pgtaskd migrate` to make a new one, or insert the old one back (docs/handlers.md, \"What a handler is told\")")]
    NoSite,
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<tokio_postgres::Error> for SchemaError {
    fn from(err: tokio_postgres::Error) -> Self {
        SchemaError::Db(err.into())
    }
}

/// The database a session is on: what an operator needs to tell one database from another,
/// never the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host name or address the configuration names, or for a Unix-domain socket its
    /// directory. A configuration naming several servers gives the address of the one that
    /// answered, as that server reports it.
    pub host: String,
    pub port: u16,
    /// The database and the user, as the server reports them (`current_database()`,
    /// `current_user`): right also when the configuration left them to their defaults.
    pub database: String,
    pub user: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "database {:?} on host {}, port {}, as user {:?}",
            self.database, self.host, self.port, self.user
        )
    }
}

/// Which database `client`, opened with `settings`, is on.
///
/// # Errors
///
/// Database failures.
pub async fn target(settings: &ConnectSettings, client: &Client) -> Result<Target, DbError> {
    let row = client
        .query_typed_one(
            "SELECT current_database()::text, current_user::text, \
                    host(inet_server_addr()), inet_server_port()",
            &[],
        )
        .await?;
    let (database, user): (String, String) = (row.get(0), row.get(1));
    let (server_host, server_port): (Option<String>, Option<i32>) = (row.get(2), row.get(3));
    let config = &settings.config;
    let configured_port = config.get_ports().first().copied().unwrap_or(5432);
    let one_server = config.get_hosts().len().max(config.get_hostaddrs().len()) <= 1;
    let configured_host = match (config.get_hosts().first(), config.get_hostaddrs().first()) {
        (Some(Host::Tcp(name)), _) => Some(name.clone()),
        (Some(Host::Unix(dir)), _) => Some(dir.display().to_string()),
        (None, Some(addr)) => Some(addr.to_string()),
        (None, None) => None,
    };
    let (host, port) = match (one_server, configured_host, server_host) {
        (true, Some(host), _) => (host, configured_port),
        (_, _, Some(host)) => (
            host,
            server_port
                .and_then(|port| u16::try_from(port).ok())
                .unwrap_or(configured_port),
        ),
        (_, configured, None) => (
            configured.unwrap_or_else(|| "localhost".to_string()),
            configured_port,
        ),
    };
    Ok(Target {
        host,
        port,
        database,
        user,
    })
}

/// Apply every pending migration. Returns the versions applied (empty when up to date).
///
/// # Errors
///
/// [`SchemaError::Encoding`] and [`SchemaError::Ahead`] refuse the database; database
/// failures roll everything back.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, SchemaError> {
    migrate_to(client, LATEST_VERSION).await
}

/// Apply the pending migrations up to version `target`, as an older pgtaskd would have: what
/// upgrade tests start from.
///
/// # Errors
///
/// As [`migrate`].
pub async fn migrate_to(client: &mut Client, target: i32) -> Result<Vec<i32>, SchemaError> {
    check_encoding(client).await?;
    let tx = client.transaction().await?;
    tx.query_typed(
        "SELECT pg_advisory_xact_lock($1)",
        &[(&MIGRATION_LOCK, Type::INT8)],
    )
    .await?;
    // "already exists, skipping" notices are expected on every run but the first.
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .await?;
    // No statement timeout: a migration of millions of rows takes what it takes (the
    // daemon's `database.statement_timeout` is for its own statements). Every lock is waited
    // for at most 10 s (less when the session asks for less), from the first migration on:
    // producers' statements queue behind a migration's wait for a table.
    tx.batch_execute(
        "SET LOCAL statement_timeout = 0;
         SELECT pg_catalog.set_config('lock_timeout', '10s', true)
          WHERE pg_catalog.current_setting('lock_timeout')::interval = interval '0'
             OR pg_catalog.current_setting('lock_timeout')::interval > interval '10 seconds';",
    )
    .await?;
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS pgtaskd;
         CREATE TABLE IF NOT EXISTS pgtaskd.schema_migrations (
             version    int         PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await?;
    let found: Option<i32> = tx
        .query_typed_one("SELECT max(version) FROM pgtaskd.schema_migrations", &[])
        .await?
        .get(0);
    let found = found.unwrap_or(0);
    if found > LATEST_VERSION {
        return Err(SchemaError::Ahead { found });
    }
    let mut applied = Vec::new();
    for migration in MIGRATIONS
        .iter()
        .filter(|m| m.version > found && m.version <= target)
    {
        tx.batch_execute(migration.sql).await?;
        tx.query_typed(
            "INSERT INTO pgtaskd.schema_migrations (version, name) VALUES ($1, $2)",
            &[
                (&migration.version, Type::INT4),
                (&migration.name, Type::TEXT),
            ],
        )
        .await?;
        applied.push(migration.version);
    }
    // The database's own id (schema 30), made again if someone deleted it.
    if target >= 30 {
        tx.batch_execute(
            "INSERT INTO pgtaskd.site (created_at) SELECT now() \
              WHERE NOT EXISTS (SELECT FROM pgtaskd.site)",
        )
        .await?;
    }
    tx.commit().await?;
    Ok(applied)
}

/// Check that the schema is exactly the one this binary knows.
///
/// # Errors
///
/// [`SchemaError::Missing`], [`SchemaError::Behind`] or [`SchemaError::Ahead`] when it is not;
/// [`SchemaError::Encoding`] for a database that is not UTF8.
pub async fn check(client: &Client) -> Result<i32, SchemaError> {
    check_encoding(client).await?;
    let found = current_version(client).await?;
    match found {
        None => Err(SchemaError::Missing),
        Some(found) if found < LATEST_VERSION => Err(SchemaError::Behind { found }),
        Some(found) if found > LATEST_VERSION => Err(SchemaError::Ahead { found }),
        Some(found) => {
            let site: bool = client
                .query_typed_one("SELECT EXISTS (SELECT FROM pgtaskd.site)", &[])
                .await?
                .get(0);
            if site {
                Ok(found)
            } else {
                Err(SchemaError::NoSite)
            }
        }
    }
}

/// The highest applied migration, or `None` when the schema is not installed.
///
/// # Errors
///
/// Database failures.
pub async fn current_version(client: &Client) -> Result<Option<i32>, DbError> {
    let installed: bool = client
        .query_typed_one(
            "SELECT to_regclass('pgtaskd.schema_migrations') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !installed {
        return Ok(None);
    }
    let row = client
        .query_typed_one("SELECT max(version) FROM pgtaskd.schema_migrations", &[])
        .await?;
    Ok(row.get(0))
}

async fn check_encoding(client: &Client) -> Result<(), SchemaError> {
    let row = client
        .query_typed_one("SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()", &[])
        .await?;
    let encoding: String = row.get(0);
    if encoding == "UTF8" {
        Ok(())
    } else {
        Err(SchemaError::Encoding(encoding))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_increasing_order_from_one() {
        assert_eq!(MIGRATIONS[0].version, 1);
        for pair in MIGRATIONS.windows(2) {
            assert!(pair[0].version < pair[1].version, "{pair:?}");
        }
        for migration in MIGRATIONS {
            assert!(migration
                .name
                .starts_with(&format!("{:04}_", migration.version)));
            assert!(!migration.sql.trim().is_empty());
        }
    }
}
