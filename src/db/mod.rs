//! The database side: connecting, the pool of worker sessions, migrating, and the dedicated
//! LISTEN connection.
//!
//! [`DbError`] is the one error type of database work, and this module is the one place that
//! sorts failures: [`DbError::Unavailable`] (the database could not be reached, the
//! connection died, or the session is on a server that does not accept writes) against [`DbError::Rejected`] (the database refused these settings: a
//! wrong password, an unknown role, no `pg_hba.conf` entry, no such database, or a password it
//! asks for and was not given) against [`DbError::Query`] (the server answered a statement
//! with an error). The first split keeps "Unavailable is not absent" (docs/design.md): an
//! outage is reported as "unavailable", never as "not found". The second keeps a configuration error from being
//! waited for as if it were an outage. Its message says everything there is to say (the
//! server's message, SQLSTATE, detail and hint, or why no answer came, and for a refusal what
//! to check), so callers log it with `%err` and nothing more.

pub mod listen;
pub mod migrate;
mod open;
pub mod pool;
pub mod pooler;
mod refusal;
pub mod settings;
pub mod tls;

pub use pool::{Outage, Pool, Session, RETIRE_AFTER_BYTES};
pub use settings::{BadConnectionString, ConnectSettings, DATABASE_URL_ENV};

pub(crate) use refusal::is_pooler_refusal;
use refusal::{refused, rejection};

use std::fmt;

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::error::SqlState;

/// A failure of database work.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database could not be reached, refused the connection, or the connection was lost.
    #[error("database unavailable: {0}")]
    Unavailable(Cause),
    /// The database refused a session with these settings, or they cannot work with it:
    /// trying again with the same settings does not help. `advice` says what to check.
    #[error("database refused the connection: {cause}; {advice}")]
    Rejected { cause: Cause, advice: &'static str },
    /// The server answered a statement with an error.
    #[error("database error: {0}")]
    Query(Cause),
}

/// What went wrong: the server's own words and fields, or, when no answer came, the client's
/// account of why.
#[derive(Debug, Clone)]
pub struct Cause {
    message: String,
    code: Option<SqlState>,
    detail: Option<String>,
    hint: Option<String>,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(code) = &self.code {
            write!(f, " (SQLSTATE {})", code.code())?;
        }
        if let Some(detail) = &self.detail {
            write!(f, ", detail: {detail}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, ", hint: {hint}")?;
        }
        Ok(())
    }
}

impl Cause {
    fn message(message: impl Into<String>) -> Cause {
        Cause {
            message: message.into(),
            code: None,
            detail: None,
            hint: None,
        }
    }
}

impl From<&tokio_postgres::Error> for Cause {
    fn from(err: &tokio_postgres::Error) -> Self {
        match err.as_db_error() {
            Some(db) => Cause {
                message: db.message().to_string(),
                code: Some(db.code().clone()),
                detail: db.detail().map(str::to_string),
                hint: db.hint().map(str::to_string),
            },
            None => Cause::message(crate::error_chain(err)),
        }
    }
}

impl DbError {
    /// Whether this is an outage rather than an answer.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_))
    }

    /// Whether the server is out of a resource (class 53: a full disk, out of memory, a
    /// configuration limit): it answers, but takes no write of that kind until it has room.
    /// A session it would not open (too many connections) is an outage, not this.
    pub fn is_exhausted(&self) -> bool {
        !self.is_unavailable()
            && self
                .code()
                .is_some_and(|code| code.code().starts_with("53"))
    }

    /// Whether the database refused these settings (a configuration error, exit 78 at start).
    pub fn is_rejected(&self) -> bool {
        matches!(self, DbError::Rejected { .. })
    }

    /// Whether the database could not serve the request now, though a later try may: an
    /// outage, a refusal of the session (a running daemon whose password was rotated works
    /// again once it is put right), or an answer that says so (a serialization failure or
    /// deadlock, class 40; insufficient resources, 53; operator intervention such as a
    /// statement timeout, 57; a system error, 58; a `lock_timeout` that passed, 55P03, behind
    /// another session's lock). Anything else is a refused statement or a bug, and trying
    /// again will not help.
    pub fn is_transient(&self) -> bool {
        self.is_unavailable()
            || self.is_rejected()
            || self.code().is_some_and(|code| {
                matches!(&code.code()[..2], "40" | "53" | "57" | "58") || code.code() == "55P03"
            })
    }

    /// An outage with a message of its own.
    pub(crate) fn unavailable(message: impl Into<String>) -> DbError {
        DbError::Unavailable(Cause::message(message))
    }

    /// A refusal with a message of its own, for tests of what callers make of one.
    #[cfg(test)]
    pub(crate) fn rejected(message: impl Into<String>, advice: &'static str) -> DbError {
        DbError::Rejected {
            cause: Cause::message(message),
            advice,
        }
    }

    /// A session to the servers of `config` that could not be opened: refused settings
    /// ([`DbError::Rejected`]), else an outage, whatever else the server answered. When no
    /// server answered, the message names where it tried as psql does (`connection to server
    /// at "127.0.0.1", port 5433 failed: Connection refused`).
    pub(crate) fn connecting(
        err: tokio_postgres::Error,
        config: &tokio_postgres::Config,
    ) -> DbError {
        if let Some(answered) = refused(&err) {
            return answered;
        }
        let mut reason = &err as &(dyn std::error::Error + 'static);
        while let Some(source) = reason.source() {
            reason = source;
        }
        if speaks_another_protocol(&err, reason) {
            return DbError::Unavailable(Cause::message(format!(
                "{} failed: the server there does not speak the PostgreSQL protocol (it \
                 answered with something else, such as HTTP): check the host and port",
                servers(config)
            )));
        }
        DbError::Unavailable(Cause::message(format!(
            "{} failed: {reason}",
            servers(config)
        )))
    }

    /// The SQLSTATE the server answered with, when there is one.
    pub fn code(&self) -> Option<&SqlState> {
        self.cause().code.as_ref()
    }

    /// The server's message alone (or the client's account of why no answer came), without
    /// the SQLSTATE, detail and hint the error's `Display` adds: for a message a function of
    /// the schema raised for the user to read.
    pub fn message(&self) -> &str {
        &self.cause().message
    }

    fn cause(&self) -> &Cause {
        match self {
            DbError::Query(cause)
            | DbError::Unavailable(cause)
            | DbError::Rejected { cause, .. } => cause,
        }
    }

    /// A statement's refusal with a SQLSTATE, for tests of what callers make of one.
    #[cfg(test)]
    pub(crate) fn answered(message: &str, code: SqlState) -> DbError {
        DbError::Query(Cause {
            message: message.to_string(),
            code: Some(code),
            detail: None,
            hint: None,
        })
    }
}

/// Whether a session's start failed because the peer's answer was not PostgreSQL's protocol
/// (an HTTP server on the port, say): the answer ended inside what the client took for a
/// message ("bytes remaining on stream", tokio-util's words at the end of a stream), its tag
/// was none of the protocol's, or it came where another was due. Neither tokio-postgres nor
/// tokio-util exposes these as kinds: only their fixed `Display` text tells them apart.
fn speaks_another_protocol(
    err: &tokio_postgres::Error,
    reason: &(dyn std::error::Error + 'static),
) -> bool {
    let reason = reason.to_string();
    err.code().is_none()
        && (reason == "bytes remaining on stream"
            || reason.starts_with("unknown message tag")
            || err.to_string() == "unexpected message from server")
}

impl From<tokio_postgres::Error> for DbError {
    fn from(err: tokio_postgres::Error) -> Self {
        if let Some(rejected) = rejection(&err) {
            return rejected;
        }
        let cause = Cause::from(&err);
        if is_connection_error(&err) {
            DbError::Unavailable(cause)
        } else {
            DbError::Query(cause)
        }
    }
}

impl From<PoolError> for DbError {
    fn from(err: PoolError) -> Self {
        match err {
            // Only opening a session fails this way, as for [`DbError::connecting`].
            PoolError::Backend(err) => refused(&err).unwrap_or_else(|| DbError::from(err)),
            PoolError::Timeout(TimeoutType::Wait) => {
                DbError::unavailable("no pooled session became free in time")
            }
            PoolError::Timeout(TimeoutType::Create) => {
                DbError::unavailable("timed out connecting to the database")
            }
            PoolError::Timeout(TimeoutType::Recycle) => {
                DbError::unavailable("timed out checking a pooled session")
            }
            other => DbError::unavailable(crate::error_chain(&other)),
        }
    }
}

/// Where a session to `config` is opened, in psql's words: `connection to server at "HOST",
/// port P`, or `on socket "DIR/.s.PGSQL.P"`; several servers are listed in the order tried.
pub(crate) fn servers(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let hosts: Vec<String> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, addr)| format!("at \"{addr}\", port {}", port(i)))
            .collect()
    } else {
        config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| match host {
                Host::Tcp(name) => format!("at \"{name}\", port {}", port(i)),
                Host::Unix(dir) => {
                    format!("on socket \"{}/.s.PGSQL.{}\"", dir.display(), port(i))
                }
            })
            .collect()
    };
    match hosts.as_slice() {
        [one] => format!("connection to server {one}"),
        many => format!("connection to every server ({})", many.join("; ")),
    }
}

/// Whether an error means the connection is unusable rather than that a statement failed:
/// no SQLSTATE at all (I/O, closed connection, timeout), connection exceptions (class 08),
/// the server shutting down or starting (57P01..57P03), too many connections, or a server
/// that does not accept writes (25006 read_only_sql_transaction: a standby, a primary demoted
/// by a failover, or one put into read-only mode). The last is not an error of the statement:
/// the session is on the wrong server, and a new one, opened through the host list with
/// `target_session_attrs=read-write`, finds the primary.
fn is_connection_error(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    match err.code() {
        None => true,
        Some(code) => {
            code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS
                || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        }
    }
}

#[cfg(test)]
mod tests {
    use super::refusal::PASSWORD_ADVICE;
    use super::*;

    #[test]
    fn a_server_answer_names_its_message_and_sqlstate_and_has_no_source() {
        let err = DbError::Query(Cause {
            message: "relation \"x\" does not exist".into(),
            code: Some(SqlState::UNDEFINED_TABLE),
            detail: None,
            hint: Some("create it first".into()),
        });
        assert_eq!(
            err.to_string(),
            "database error: relation \"x\" does not exist (SQLSTATE 42P01), hint: create it first"
        );
        assert!(std::error::Error::source(&err).is_none());
        assert!(!err.is_unavailable());
        assert!(!err.is_transient());
    }

    #[test]
    fn an_outage_is_unavailable_and_transient() {
        let err = DbError::unavailable("connection refused");
        assert_eq!(err.to_string(), "database unavailable: connection refused");
        assert!(err.is_unavailable());
        assert!(err.is_transient());
        assert_eq!(err.code(), None);
    }

    #[test]
    fn a_refused_session_names_the_servers_words_and_what_to_check() {
        let err = DbError::Rejected {
            cause: Cause {
                message: "password authentication failed for user \"alice\"".into(),
                code: Some(SqlState::INVALID_PASSWORD),
                detail: None,
                hint: None,
            },
            advice: PASSWORD_ADVICE,
        };
        let text = err.to_string();
        assert!(
            text.starts_with(
                "database refused the connection: password authentication failed for user \"alice\" (SQLSTATE 28P01); "
            ),
            "{text}"
        );
        assert!(text.contains("does not read ~/.pgpass"), "{text}");
        assert!(err.is_rejected());
        assert!(!err.is_unavailable());
        assert!(
            err.is_transient(),
            "a running daemon waits for it to be put right"
        );
    }

    #[test]
    fn a_statement_timeout_is_transient_but_not_an_outage() {
        let err = DbError::Query(Cause {
            message: "canceling statement due to statement timeout".into(),
            code: Some(SqlState::QUERY_CANCELED),
            detail: None,
            hint: None,
        });
        assert!(!err.is_unavailable());
        assert!(err.is_transient());
    }

    #[test]
    fn a_full_disk_is_exhausted_but_a_session_refused_for_too_many_clients_is_an_outage() {
        let full = DbError::Query(Cause {
            message: "could not extend file: No space left on device".into(),
            code: Some(SqlState::DISK_FULL),
            detail: None,
            hint: None,
        });
        assert!(full.is_exhausted() && full.is_transient() && !full.is_unavailable());
        let crowded = DbError::Unavailable(Cause {
            message: "sorry, too many clients already".into(),
            code: Some(SqlState::TOO_MANY_CONNECTIONS),
            detail: None,
            hint: None,
        });
        assert!(!crowded.is_exhausted(), "no write was refused for room");
        assert!(crowded.is_unavailable() && crowded.is_transient());
    }

    #[test]
    fn a_lock_timeout_is_transient_but_not_an_outage() {
        let err = DbError::Query(Cause {
            message: "canceling statement due to lock timeout".into(),
            code: Some(SqlState::LOCK_NOT_AVAILABLE),
            detail: None,
            hint: None,
        });
        assert!(!err.is_unavailable());
        assert!(
            err.is_transient(),
            "HTTP 503 and exit 69, as a statement timeout"
        );
    }
}
