//! The bounded pool of worker sessions, with a client-side deadline on every operation.
//!
//! The server enforces `statement_timeout`, but a connection that went half-open (the peer
//! vanished without a reset) answers nothing at all: without a deadline of its own, a worker
//! would wait forever. [`Session::bounded`] puts one on each operation, and a session whose
//! operation failed as unavailable (it timed out, lost its connection, or found its server
//! no longer accepting writes, as a primary demoted by a failover) is discarded when dropped,
//! never handed out again: the next session is opened anew, through the host list.

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::Client;

use super::DbError;

/// A pool of at most `database.pool_size` sessions, opened on demand.
#[derive(Clone)]
pub struct Pool {
    inner: deadpool_postgres::Pool,
    deadline: Duration,
}

/// An error that may mean the session is unusable.
pub trait Outage {
    fn is_outage(&self) -> bool;
}

impl Outage for DbError {
    fn is_outage(&self) -> bool {
        self.is_unavailable()
    }
}

impl Pool {
    pub(crate) fn new(inner: deadpool_postgres::Pool, deadline: Duration) -> Pool {
        Pool { inner, deadline }
    }

    /// A session from the pool, waiting for one to be free (bounded by the pool's wait and
    /// create timeouts).
    ///
    /// # Errors
    ///
    /// [`DbError::Unavailable`] when no session could be had in time.
    pub async fn get(&self) -> Result<Session, DbError> {
        let object = self.inner.get().await?;
        Ok(Session {
            object: Some(object),
            deadline: self.deadline,
            broken: AtomicBool::new(false),
        })
    }

    /// The client-side deadline of one operation.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Sessions open now, and how many of them are handed out.
    pub fn status(&self) -> (usize, usize) {
        let status = self.inner.status();
        (status.size, status.size - status.available)
    }
}

/// One pooled session; dereferences to the [`Client`].
pub struct Session {
    object: Option<deadpool_postgres::Object>,
    deadline: Duration,
    broken: AtomicBool,
}

impl Session {
    /// Run one database operation on this session under the pool's deadline. A deadline
    /// that passes is an outage (the outcome of what was sent is unknown), and marks the
    /// session for discarding, as does any outage the operation reports.
    ///
    /// # Errors
    ///
    /// The operation's own error, or [`DbError::Unavailable`] when the deadline passed.
    pub async fn bounded<T, E>(&self, operation: impl Future<Output = Result<T, E>>) -> Result<T, E>
    where
        E: From<DbError> + Outage,
    {
        match tokio::time::timeout(self.deadline, operation).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                if err.is_outage() {
                    self.broken.store(true, Ordering::Relaxed);
                }
                Err(err)
            }
            Err(_) => {
                self.broken.store(true, Ordering::Relaxed);
                Err(DbError::unavailable(format!(
                    "the database did not answer within {:?}",
                    self.deadline
                ))
                .into())
            }
        }
    }
}

impl Deref for Session {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.object.as_ref().expect("present until dropped")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.broken.load(Ordering::Relaxed) {
            if let Some(object) = self.object.take() {
                // Out of the pool: dropping it closes the connection.
                drop(deadpool_postgres::Object::take(object));
            }
        }
    }
}
