//! The database side: connecting, the pool of worker sessions, migrating, and the dedicated
//! LISTEN connection.
//!
//! [`DbError`] is the one error type of database work. Its split between
//! [`DbError::Unavailable`] (the database could not be reached, or the connection died) and
//! [`DbError::Query`] (the server answered with an error) is what keeps SPEC invariant 7:
//! an outage is reported as "unavailable", never as "not found".

pub mod connect;
pub mod listen;
pub mod migrate;
pub mod pool;
pub mod tls;

pub use connect::ConnectSettings;
pub use pool::{Outage, Pool, Session};

use tokio_postgres::error::SqlState;

/// A failure of database work.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database could not be reached, refused the connection, or the connection was lost.
    #[error("database unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The server answered a statement with an error.
    #[error("database error")]
    Query(#[source] tokio_postgres::Error),
}

impl DbError {
    /// Whether this is an outage rather than an answer.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_))
    }

    /// An outage with a message of its own.
    pub(crate) fn unavailable(message: impl Into<String>) -> DbError {
        DbError::Unavailable(message.into().into())
    }

    /// The SQLSTATE of a server error, when there is one.
    pub fn code(&self) -> Option<&SqlState> {
        match self {
            DbError::Query(err) => err.code(),
            DbError::Unavailable(_) => None,
        }
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(err: tokio_postgres::Error) -> Self {
        if is_connection_error(&err) {
            DbError::Unavailable(Box::new(err))
        } else {
            DbError::Query(err)
        }
    }
}

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(err: deadpool_postgres::PoolError) -> Self {
        match err {
            deadpool_postgres::PoolError::Backend(err) => DbError::from(err),
            other => DbError::Unavailable(Box::new(other)),
        }
    }
}

/// Whether an error means the connection is unusable rather than that a statement failed:
/// no SQLSTATE at all (I/O, closed connection, timeout), connection exceptions (class 08),
/// the server shutting down or starting (57P01..57P03), or too many connections.
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
        }
    }
}

/// A log-friendly description of an error with the server's fields, when it has them:
/// SQLSTATE, message, detail and hint.
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        if let Some(db) = inner.downcast_ref::<tokio_postgres::error::DbError>() {
            text.push_str(&format!(
                ": {} (SQLSTATE {})",
                db.message(),
                db.code().code()
            ));
            if let Some(detail) = db.detail() {
                text.push_str(&format!(", detail: {detail}"));
            }
            if let Some(hint) = db.hint() {
                text.push_str(&format!(", hint: {hint}"));
            }
            return text;
        }
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}
