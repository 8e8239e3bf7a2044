//! The bounded pool of worker sessions, with a client-side deadline on every operation.
//!
//! The server enforces `statement_timeout`, but a connection that went half-open (the peer
//! vanished without a reset) answers nothing at all: without a deadline of its own, a worker
//! would wait forever. [`Session::bounded`] puts one on each operation, and a session whose
//! operation failed as unavailable (it timed out, lost its connection, or found its server
//! no longer accepting writes, as a primary demoted by a failover) is discarded when dropped,
//! never handed out again: the next session is opened anew, through the host list.
//!
//! A server that holds every commit for a synchronous standby that is not connected (a
//! promoted standby that kept `synchronous_standby_names`, a primary whose standbys are all
//! gone) answers no write at all: every session would wait in its commit until the
//! deadline, and the pool would be wedged. A new session checks that once, and a session
//! handed out again checks again every [`REPLICATION_RECHECK`] (each time while the server
//! has none), one handed out that often by [`Pool::watch_replication`] at least. On such a
//! server the session ends the commit waits of the daemon's own sessions opened before,
//! commits with `synchronous_commit = local` and sends no notifications (`pgtaskd.notify
//! = off`: a producer's commit stuck there after its NOTIFY holds the lock every NOTIFY
//! takes), is said once in the log, and lives at most
//! [`UNREPLICATED_SESSION_LIFE`], so that sessions opened once a standby is back wait for it
//! again (docs/design.md, "No commit waits for a standby that is not there"). Behind a
//! transaction pooler (`database.pooler = "transaction"`) a session's `SET` would stay on the
//! server session for whichever client the pooler hands it to next: there the check only
//! says so in the log, and commits wait for the standby as the server asks.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::ObjectId;

use tokio_postgres::Client;

use super::DbError;

/// How long a session that commits without waiting for a synchronous standby is used.
pub const UNREPLICATED_SESSION_LIFE: Duration = Duration::from_secs(10);

/// How often a session opened while a synchronous standby was connected checks again.
pub const REPLICATION_RECHECK: Duration = Duration::from_secs(5);

/// The server names a synchronous standby and none is connected (`pg_stat_replication`
/// lists every WAL sender to any role; only one that `synchronous_standby_names` names
/// counts, as `sync` or `quorum`: an asynchronous standby, a `pg_basebackup` or a
/// `pg_receivewal` does not end the wait). A macro, so that both statements below are
/// literals built from the one condition.
macro_rules! no_synchronous_standby {
    () => {
        "pg_catalog.current_setting('synchronous_standby_names') <> ''
   AND NOT pg_catalog.pg_is_in_recovery()
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_replication AS r
                    WHERE r.sync_state IN ('sync', 'quorum'))"
    };
}

/// Whether commits of this session would wait for a synchronous standby while none is
/// connected.
const UNREPLICATED: &str = concat!(
    "
SELECT pg_catalog.current_setting('synchronous_commit') NOT IN ('off', 'local')
   AND ",
    no_synchronous_standby!()
);

/// On a server that names a synchronous standby and has none connected (whatever this
/// session's own `synchronous_commit`): end the waits of this daemon's own sessions (its
/// `application_name`) that committed before they were told, and wait in their commits for
/// one. A canceled wait leaves the commit made locally (PostgreSQL's words: "The transaction
/// has already committed locally"), visible, and its row locks free; left alone, those
/// sessions hold the rows of their tasks until a standby connects, and every finish of
/// those tasks waits. Returns how many waits were ended.
const CANCEL_OWN_REPLICATION_WAITS: &str = concat!(
    "
SELECT count(pg_catalog.pg_cancel_backend(a.pid))
  FROM pg_catalog.pg_stat_activity AS a
 WHERE a.wait_event = 'SyncRep'
   AND a.application_name = pg_catalog.current_setting('application_name')
   AND a.pid <> pg_catalog.pg_backend_pid()
   AND ",
    no_synchronous_standby!()
);

/// How long the replication watch waits for a pooled session before it opens one of its own
/// (every pooled session may be waiting in a commit).
const WATCH_SESSION_WAIT: Duration = Duration::from_secs(1);

/// End the commit waits of this daemon's sessions on a server with no synchronous standby
/// ([`CANCEL_OWN_REPLICATION_WAITS`]); returns how many.
async fn end_own_replication_waits(client: &Client) -> Result<i64, DbError> {
    let row = client.query_one(CANCEL_OWN_REPLICATION_WAITS, &[]).await?;
    let ended: i64 = row.get(0);
    if ended > 0 {
        tracing::warn!(
            sessions = ended,
            "ended the waits of this daemon's sessions whose commits waited for the missing synchronous standby: they are committed on this server alone"
        );
    }
    Ok(ended)
}

/// A pool of at most `database.pool_size` sessions, opened on demand.
#[derive(Clone)]
pub struct Pool {
    inner: deadpool_postgres::Pool,
    deadline: Duration,
    /// Sessions opened with `synchronous_commit = local`, and when.
    unreplicated: Arc<Mutex<HashMap<ObjectId, Instant>>>,
    /// Whether the log has said so since the last session that found a standby.
    said_unreplicated: Arc<AtomicBool>,
    /// Whether the last look (a session's check, or the watch's) found no standby: every
    /// session handed out is checked then.
    standby_missing: Arc<AtomicBool>,
    /// Whether the sessions go through a transaction pooler: no session `SET` then.
    pooled: bool,
    /// When a session last checked for a synchronous standby.
    checked_at: Arc<Mutex<Instant>>,
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
    pub(crate) fn new(inner: deadpool_postgres::Pool, deadline: Duration, pooled: bool) -> Pool {
        Pool {
            inner,
            deadline,
            unreplicated: Arc::default(),
            said_unreplicated: Arc::default(),
            standby_missing: Arc::default(),
            pooled,
            checked_at: Arc::new(Mutex::new(Instant::now())),
        }
    }

    /// Every [`REPLICATION_RECHECK`] until `stop`: end the commit waits of this daemon's
    /// sessions on a server that lost its synchronous standby, on a pooled session (which is
    /// checked as it is handed out), or on one of its own when none is free within
    /// a second (every one may be waiting in a commit). Behind a transaction
    /// pooler, where sessions commit as the server asks, it does nothing.
    pub async fn watch_replication(
        self,
        settings: super::ConnectSettings,
        stop: tokio_util::sync::CancellationToken,
    ) {
        if self.pooled {
            return;
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(REPLICATION_RECHECK) => {}
            }
            let watch = async {
                match tokio::time::timeout(WATCH_SESSION_WAIT, self.get()).await {
                    Ok(session) => {
                        let session = session?;
                        session.bounded(end_own_replication_waits(&session)).await
                    }
                    Err(_) => {
                        let (client, driver) = settings.open(None).await?;
                        let ended =
                            tokio::time::timeout(self.deadline, end_own_replication_waits(&client))
                                .await;
                        drop(client);
                        driver.abort();
                        ended.unwrap_or_else(|_| {
                            Err(DbError::unavailable(
                                "the replication watch did not finish in time",
                            ))
                        })
                    }
                }
            };
            let ended = tokio::select! {
                _ = stop.cancelled() => return,
                ended = watch => ended,
            };
            match ended {
                Ok(ended) if ended > 0 => self.standby_missing.store(true, Ordering::Relaxed),
                Ok(_) => {}
                Err(err) => tracing::debug!(error = %err, "replication watch could not look"),
            }
        }
    }

    /// A session from the pool, waiting for one to be free (bounded by the pool's wait and
    /// create timeouts).
    ///
    /// # Errors
    ///
    /// [`DbError::Unavailable`] when no session could be had in time.
    pub async fn get(&self) -> Result<Session, DbError> {
        loop {
            let object = self.inner.get().await?;
            let id = deadpool_postgres::Object::id(&object);
            let fresh = deadpool_postgres::Object::metrics(&object).recycle_count == 0;
            let session = Session {
                object: Some(object),
                deadline: self.deadline,
                broken: AtomicBool::new(false),
                in_flight: AtomicBool::new(false),
            };
            if fresh {
                self.check_replication(&session, id).await?;
                return Ok(session);
            }
            let (degraded, expired) = {
                let mut unreplicated = self.unreplicated.lock().expect("not poisoned");
                let since = unreplicated.get(&id).copied();
                let expired =
                    since.is_some_and(|since| since.elapsed() >= UNREPLICATED_SESSION_LIFE);
                if expired {
                    unreplicated.remove(&id);
                }
                (since.is_some(), expired)
            };
            if !expired {
                // A session opened while a standby was there: checked again once a while,
                // and every time while the server is known to have none.
                let due = self.checked_at.lock().expect("not poisoned").elapsed()
                    >= REPLICATION_RECHECK
                    || (self.standby_missing.load(Ordering::Relaxed) && !self.pooled);
                if !degraded && due {
                    self.check_replication(&session, id).await?;
                }
                return Ok(session);
            }
            // Closed, and the next one checks again.
            session.broken.store(true, Ordering::Relaxed);
        }
    }

    /// A new session on a server that would hold its commits for a synchronous standby that
    /// is not connected commits locally, for a while.
    async fn check_replication(&self, session: &Session, id: ObjectId) -> Result<(), DbError> {
        *self.checked_at.lock().expect("not poisoned") = Instant::now();
        let unreplicated: bool = session
            .bounded(async {
                let rows = session.simple_query(UNREPLICATED).await?;
                let answer = rows.iter().find_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "t"),
                    _ => None,
                });
                Ok::<_, DbError>(answer.unwrap_or(false))
            })
            .await?;
        self.standby_missing.store(unreplicated, Ordering::Relaxed);
        if !unreplicated {
            self.said_unreplicated.store(false, Ordering::Relaxed);
            return Ok(());
        }
        if self.pooled {
            if !self.said_unreplicated.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the server holds commits for a synchronous standby (synchronous_standby_names) and none is connected: behind a transaction pooler (database.pooler = \"transaction\") this daemon cannot set synchronous_commit = local for its sessions, so its commits wait until a standby connects"
                );
            }
            return Ok(());
        }
        session
            .bounded(async {
                session
                    .batch_execute("SET synchronous_commit = local; SET pgtaskd.notify = off")
                    .await?;
                end_own_replication_waits(session).await
            })
            .await?;
        self.unreplicated
            .lock()
            .expect("not poisoned")
            .insert(id, Instant::now());
        if !self.said_unreplicated.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the server holds commits for a synchronous standby (synchronous_standby_names) and none is connected: this daemon's sessions commit without waiting for one (synchronous_commit = local) and send no notifications until a standby connects"
            );
        }
        Ok(())
    }

    /// The client-side deadline of one operation.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The most sessions the pool opens.
    pub fn max_size(&self) -> usize {
        self.inner.status().max_size
    }

    /// Sessions open now, and how many of them are handed out.
    pub fn status(&self) -> (usize, usize) {
        let status = self.inner.status();
        (status.size, status.size - status.available)
    }
}

/// An answer or a statement larger than this retires its session: the connection keeps read
/// and write buffers as large as the largest message it carried for as long as it lives, so a
/// pool whose sessions each once carried a 100 MB payload held that much each (a hostile
/// review: a daemon's resident memory rose by one payload per session, 105 to 778 MiB over
/// 24 payloads of 100 MB, and stayed there).
pub const RETIRE_AFTER_BYTES: u64 = 4 << 20;

/// One pooled session; dereferences to the [`Client`].
pub struct Session {
    object: Option<deadpool_postgres::Object>,
    deadline: Duration,
    broken: AtomicBool,
    /// An operation is on its way: set while [`Session::bounded`] waits.
    in_flight: AtomicBool,
}

impl Session {
    /// This session carried `bytes` of payload in one message (a row, a statement): past
    /// [`RETIRE_AFTER_BYTES`], it is closed when dropped rather than given back to the pool,
    /// and its buffers with it.
    pub fn carried(&self, bytes: u64) {
        if bytes > RETIRE_AFTER_BYTES {
            self.broken.store(true, Ordering::Relaxed);
        }
    }

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
        // Broken until the operation answers: an operation dropped on its way (its caller
        // stopped waiting) leaves a statement on the connection that the next user would
        // queue behind, so its session is discarded, never handed out again.
        self.in_flight.store(true, Ordering::Relaxed);
        let answer = tokio::time::timeout(self.deadline, operation).await;
        self.in_flight.store(false, Ordering::Relaxed);
        match answer {
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
        if self.broken.load(Ordering::Relaxed) || self.in_flight.load(Ordering::Relaxed) {
            if let Some(object) = self.object.take() {
                // Out of the pool: dropping it closes the connection.
                drop(deadpool_postgres::Object::take(object));
            }
        }
    }
}
