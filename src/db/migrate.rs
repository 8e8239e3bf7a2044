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

/// Every migration this binary knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_tasks",
        sql: include_str!("../../sql/0001_tasks.sql"),
    },
    Migration {
        version: 2,
        name: "0002_roles",
        sql: include_str!("../../sql/0002_roles.sql"),
    },
    Migration {
        version: 3,
        name: "0003_plans",
        sql: include_str!("../../sql/0003_plans.sql"),
    },
    Migration {
        version: 4,
        name: "0004_hardening",
        sql: include_str!("../../sql/0004_hardening.sql"),
    },
    Migration {
        version: 5,
        name: "0005_completions",
        sql: include_str!("../../sql/0005_completions.sql"),
    },
    Migration {
        version: 6,
        name: "0006_queues",
        sql: include_str!("../../sql/0006_queues.sql"),
    },
    Migration {
        version: 7,
        name: "0007_idle_notify",
        sql: include_str!("../../sql/0007_idle_notify.sql"),
    },
    Migration {
        version: 8,
        name: "0008_autovacuum",
        sql: include_str!("../../sql/0008_autovacuum.sql"),
    },
    Migration {
        version: 9,
        name: "0009_vacuum_health",
        sql: include_str!("../../sql/0009_vacuum_health.sql"),
    },
    Migration {
        version: 10,
        name: "0010_notify_cost",
        sql: include_str!("../../sql/0010_notify_cost.sql"),
    },
    Migration {
        version: 11,
        name: "0011_plans_by_key",
        sql: include_str!("../../sql/0011_plans_by_key.sql"),
    },
    Migration {
        version: 12,
        name: "0012_claim_after",
        sql: include_str!("../../sql/0012_claim_after.sql"),
    },
    Migration {
        version: 13,
        name: "0013_positions",
        sql: include_str!("../../sql/0013_positions.sql"),
    },
    Migration {
        version: 14,
        name: "0014_idle_hint",
        sql: include_str!("../../sql/0014_idle_hint.sql"),
    },
    Migration {
        version: 15,
        name: "0015_definer_paths",
        sql: include_str!("../../sql/0015_definer_paths.sql"),
    },
    Migration {
        version: 16,
        name: "0016_claim_tokens",
        sql: include_str!("../../sql/0016_claim_tokens.sql"),
    },
    Migration {
        version: 17,
        name: "0017_prepared_producers",
        sql: include_str!("../../sql/0017_prepared_producers.sql"),
    },
    Migration {
        version: 18,
        name: "0018_queue_names",
        sql: include_str!("../../sql/0018_queue_names.sql"),
    },
    Migration {
        version: 19,
        name: "0019_handlers",
        sql: include_str!("../../sql/0019_handlers.sql"),
    },
    Migration {
        version: 20,
        name: "0020_list_indexes",
        sql: include_str!("../../sql/0020_list_indexes.sql"),
    },
    Migration {
        version: 21,
        name: "0021_daemons",
        sql: include_str!("../../sql/0021_daemons.sql"),
    },
    Migration {
        version: 22,
        name: "0022_retry_failed",
        sql: include_str!("../../sql/0022_retry_failed.sql"),
    },
    Migration {
        version: 23,
        name: "0023_daemon_handlers",
        sql: include_str!("../../sql/0023_daemon_handlers.sql"),
    },
    Migration {
        version: 24,
        name: "0024_task_view",
        sql: include_str!("../../sql/0024_task_view.sql"),
    },
    Migration {
        version: 25,
        name: "0025_claim_tokens_by_timeline",
        sql: include_str!("../../sql/0025_claim_tokens_by_timeline.sql"),
    },
    Migration {
        version: 26,
        name: "0026_state_functions",
        sql: include_str!("../../sql/0026_state_functions.sql"),
    },
    Migration {
        version: 27,
        name: "0027_room_for_updates",
        sql: include_str!("../../sql/0027_room_for_updates.sql"),
    },
    Migration {
        version: 28,
        name: "0028_parked_results",
        sql: include_str!("../../sql/0028_parked_results.sql"),
    },
    Migration {
        version: 29,
        name: "0029_quiet_sessions",
        sql: include_str!("../../sql/0029_quiet_sessions.sql"),
    },
    Migration {
        version: 30,
        name: "0030_task_keys",
        sql: include_str!("../../sql/0030_task_keys.sql"),
    },
    Migration {
        version: 31,
        name: "0031_schedules",
        sql: include_str!("../../sql/0031_schedules.sql"),
    },
    Migration {
        version: 32,
        name: "0032_snooze",
        sql: include_str!("../../sql/0032_snooze.sql"),
    },
    Migration {
        version: 33,
        name: "0033_queue_limits",
        sql: include_str!("../../sql/0033_queue_limits.sql"),
    },
    Migration {
        version: 34,
        name: "0034_parked_results_skip_locked",
        sql: include_str!("../../sql/0034_parked_results_skip_locked.sql"),
    },
    Migration {
        version: 35,
        name: "0035_schedule_and_limit_mends",
        sql: include_str!("../../sql/0035_schedule_and_limit_mends.sql"),
    },
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
