//! The start-up checks of where the sessions lead, for a daemon behind a connection pooler
//! (docs/operations.md, "Behind PgBouncer").
//!
//! [`check_listen`] proves that the LISTEN session reaches PostgreSQL itself: it LISTENs on a
//! channel of its own, a second session NOTIFYs it, and the notification must arrive within
//! [`LISTEN_PROBE_TIMEOUT`]. Behind a pooler in transaction mode the LISTEN stays on a server
//! session the pooler hands to other clients, and the notification never reaches this one;
//! a pooler that refuses the startup options is found sooner, by its refusal. Either is a
//! configuration error (exit 78) that says to point `database.listen_url` at PostgreSQL.
//!
//! [`check_defaults`] reads the transaction defaults a session got. With `database.pooler =
//! "transaction"`, where pgtaskd cannot send the startup options that set what its statements
//! rely on, they must come from the role or the database (`ALTER ROLE ... SET`), and a session
//! that gets others is a configuration error that names the statement to run; timeouts left
//! off are said in the log (the client-side deadline of every operation still holds).
//! Otherwise the startup options set them, and a session that gets others had its options
//! dropped on the way (a pooler's `ignore_startup_parameters = options`): a configuration
//! error too, where every finish would have been refused.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::AsyncMessage;

use super::{ConnectSettings, DbError};

/// How long the LISTEN session's own notification may take to arrive. A server answers in
/// milliseconds; only a misplaced session waits this long, once, at start.
pub const LISTEN_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A start-up check that failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolerError {
    /// The database could not be asked.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The sessions lead somewhere pgtaskd cannot work as configured: the message says
    /// where and what to change (exit 78).
    #[error("{0}")]
    Misplaced(String),
}

/// Where the LISTEN session's settings came from, in the configuration's words.
pub fn listen_setting(database: &crate::config::DatabaseConfig) -> &'static str {
    if database.listen_url.is_some() {
        "database.listen_url"
    } else {
        "database.listen_url (not set, so the same as database.url)"
    }
}

/// How long the check's notification waits for the lock every NOTIFY takes at commit.
const NOTIFY_LOCK_WAIT: Duration = Duration::from_secs(3);

/// Check that a notification sent by another session reaches a session opened with
/// `settings` (the LISTEN session's); `setting` names where they came from, for the message.
///
/// # Errors
///
/// [`PoolerError::Misplaced`] when the session leads to a pooler, [`PoolerError::Db`] when the
/// database could not be asked.
pub async fn check_listen(settings: &ConnectSettings, setting: &str) -> Result<(), PoolerError> {
    let misplaced = |why: String| {
        PoolerError::Misplaced(format!(
            "{setting} leads to a connection pooler, where LISTEN does not work ({why}): set \
             database.listen_url to a direct connection to PostgreSQL (database.url may stay \
             behind the pooler; docs/operations.md, \"Behind PgBouncer\")"
        ))
    };
    let (sender, mut messages) = tokio::sync::mpsc::channel(16);
    let channel = format!("pgtaskd_probe_{:016x}", fastrand::u64(..));
    // Two sessions and two statements, none of which may wait forever on a half-open
    // connection.
    let setup = async {
        let (listener, driver) = match settings.open(Some(sender)).await {
            Err(err) if super::is_pooler_refusal(&err) => {
                return Err(misplaced("it refused the startup options".into()))
            }
            opened => opened?,
        };
        // Not `LISTEN ...` first in `pg_stat_activity.query`: that is how the daemon's own
        // listener is recognised from outside (tests, the bench, operators' queries).
        listener
            .batch_execute(&format!(
                "/* pgtaskd: does this session reach PostgreSQL? */ LISTEN {channel}"
            ))
            .await
            .map_err(DbError::from)?;
        let sender = settings.connect().await?;
        // A producer's commit that waits for a synchronous standby that is not there holds
        // the lock every NOTIFY of the cluster takes at commit: the check is then skipped
        // after a short wait rather than failing the start. `SET LOCAL`: behind a
        // transaction pooler a session's setting would stay on the server connection.
        let notified = sender
            .batch_execute(&format!(
                "BEGIN; SET LOCAL lock_timeout = {}; NOTIFY {channel}; COMMIT",
                NOTIFY_LOCK_WAIT.as_millis()
            ))
            .await;
        match notified {
            Err(err) if err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
            Err(err) => Err(PoolerError::from(DbError::from(err))),
            Ok(()) => Ok::<_, PoolerError>(Some((listener, driver))),
        }
    };
    let limit = settings.connect_deadline * 2 + settings.query_deadline;
    let opened = tokio::time::timeout(limit, setup)
        .await
        .map_err(|_| DbError::unavailable("the LISTEN session's check did not finish in time"))??;
    let Some((_listener, _driver)) = opened else {
        tracing::warn!(
            "could not check that {setting} reaches PostgreSQL itself: another session holds the lock every NOTIFY takes (a commit waiting for a synchronous standby that is not connected?); going on without the check"
        );
        return Ok(());
    };
    let arrived = tokio::time::timeout(LISTEN_PROBE_TIMEOUT, async {
        while let Some(message) = messages.recv().await {
            if matches!(&message, AsyncMessage::Notification(n) if n.channel() == channel) {
                return true;
            }
        }
        false
    })
    .await;
    match arrived {
        // Both sessions end here: closing them is the UNLISTEN.
        Ok(true) => Ok(()),
        Ok(false) => Err(DbError::unavailable("the LISTEN session was closed").into()),
        Err(_) => Err(misplaced(format!(
            "a notification sent to its session from another did not arrive within {}s",
            LISTEN_PROBE_TIMEOUT.as_secs()
        ))),
    }
}

/// What the sessions of a transaction pooler are given by the role and the database: read
/// once at start, on one of them.
const DEFAULTS: &str = "
SELECT current_user::text,
       pg_catalog.current_setting('default_transaction_isolation'),
       pg_catalog.current_setting('default_transaction_read_only'),
       pg_catalog.current_setting('default_transaction_deferrable'),
       pg_catalog.current_setting('statement_timeout'),
       pg_catalog.current_setting('lock_timeout'),
       pg_catalog.current_setting('idle_in_transaction_session_timeout')";

/// The transaction defaults every statement of pgtaskd is written for, as `current_setting`
/// shows them.
const REQUIRED: [(&str, &str); 3] = [
    ("default_transaction_isolation", "read committed"),
    ("default_transaction_read_only", "off"),
    ("default_transaction_deferrable", "off"),
];

/// Check that a session gets the transaction defaults pgtaskd relies on; behind a
/// transaction pooler (`transaction_pooler`), say in the log which timeouts it runs without.
///
/// # Errors
///
/// [`PoolerError::Misplaced`] naming the `ALTER ROLE` to run (behind a transaction pooler),
/// or saying that the startup options were dropped (otherwise), when a default is another;
/// [`PoolerError::Db`] when the database could not be asked.
pub async fn check_defaults(
    client: &tokio_postgres::Client,
    transaction_pooler: bool,
) -> Result<(), PoolerError> {
    let row = client
        .query_typed_one(DEFAULTS, &[])
        .await
        .map_err(DbError::from)?;
    let role: String = row.get(0);
    let value = |i: usize| -> String { row.get(i) };
    let wrong: Vec<String> = REQUIRED
        .iter()
        .enumerate()
        .filter(|(i, (_, want))| value(i + 1) != *want)
        .map(|(i, (name, want))| format!("{name} is {:?}, not {want:?}", value(i + 1)))
        .collect();
    if !wrong.is_empty() && !transaction_pooler {
        return Err(PoolerError::Misplaced(format!(
            "pgtaskd's sessions set their transaction defaults in their startup options, and \
             this one has others ({}): the options are dropped on the way, by a connection \
             pooler (PgBouncer's ignore_startup_parameters?), and every task's end would be \
             refused. Connect to PostgreSQL itself, or set database.pooler = \"transaction\" \
             and the role's defaults (docs/operations.md, \"Behind PgBouncer\")",
            wrong.join(", ")
        )));
    }
    if !transaction_pooler {
        return Ok(());
    }
    if !wrong.is_empty() {
        let fix: Vec<String> = REQUIRED
            .iter()
            .map(|(name, want)| format!("ALTER ROLE {} SET {name} = '{want}';", ident(&role)))
            .collect();
        return Err(PoolerError::Misplaced(format!(
            "behind a transaction pooler (database.pooler = \"transaction\") pgtaskd cannot set \
             its sessions' transaction defaults, and this role's sessions get others ({}): \
             set them for the role, as in `{}`",
            wrong.join(", "),
            fix.join(" ")
        )));
    }
    let off: Vec<&str> = [
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
    ]
    .into_iter()
    .enumerate()
    .filter(|(i, _)| value(i + 4) == "0")
    .map(|(_, name)| name)
    .collect();
    if !off.is_empty() {
        tracing::warn!(
            role = %role,
            off = ?off,
            "behind a transaction pooler the sessions' timeouts are the role's, and these are off: set them for the role (ALTER ROLE ... SET statement_timeout = '30s', and so on); each operation still has its client-side deadline"
        );
    }
    Ok(())
}

/// `name` as an SQL identifier: as it is when it needs no quotes, else double-quoted.
fn ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

#[cfg(test)]
mod tests {
    use super::ident;
    use crate::config::Pooler;
    use crate::db::ConnectSettings;

    #[test]
    fn a_role_name_is_quoted_only_when_it_must_be() {
        assert_eq!(ident("pgtaskd_daemon"), "pgtaskd_daemon");
        assert_eq!(ident("Worker"), "\"Worker\"");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(ident("1x"), "\"1x\"");
    }

    #[test]
    fn behind_a_transaction_pooler_the_pool_sends_no_options_and_listen_url_is_the_listeners() {
        let text = "[database]\n\
                    url = \"host=pooler port=6432 user=u dbname=d\"\n\
                    listen_url = \"host=db user=u dbname=d\"\n\
                    pooler = \"transaction\"\n";
        let config = crate::config::Config::from_toml(text, "t").unwrap();
        let pool = ConnectSettings::new(&config.database, "x").unwrap();
        assert_eq!(pool.pooler(), Pooler::Transaction);
        assert_eq!(pool.config().get_ports(), &[6432]);
        assert_eq!(pool.config().get_options(), None, "no startup options");
        assert_eq!(pool.config().get_application_name(), Some("pgtaskd/x"));
        let listen = ConnectSettings::listen(&config.database, "x").unwrap();
        assert_eq!(listen.pooler(), Pooler::None);
        assert_eq!(
            listen.config().get_hosts(),
            &[tokio_postgres::config::Host::Tcp("db".into())]
        );
        let options = listen.config().get_options().unwrap();
        assert!(options.contains("-c default_transaction_isolation=read\\ committed"));
    }

    #[test]
    fn listen_url_defaults_to_the_url_and_pooler_to_none() {
        let config = crate::config::Config::from_toml(
            "[database]\nurl = \"host=db port=5433 user=u\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(config.database.pooler, Pooler::None);
        let listen = ConnectSettings::listen(&config.database, "x").unwrap();
        let pool = ConnectSettings::new(&config.database, "x").unwrap();
        assert_eq!(listen.config().get_ports(), &[5433]);
        assert_eq!(listen.config().get_options(), pool.config().get_options());
        let err = crate::config::Config::from_toml("[database]\npooler = \"session\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("database.pooler must be \"none\" or \"transaction\""),
            "{err}"
        );
    }
}
