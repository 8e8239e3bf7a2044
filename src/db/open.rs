//! Opening sessions with [`ConnectSettings`]: the one way the pool, the LISTEN connection and
//! the one-shot commands connect.
//!
//! [`ConnectSettings::open`] connects under the connect timeout and hands the connection to
//! [`drive`], a task of its own that polls it (a tokio-postgres connection does nothing
//! unless polled), forwards what the server sends unasked to whoever wants it, and ends when
//! the client is dropped or the connection fails. The pool's sessions take the same path,
//! with the pool's create timeout as their deadline.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, Config, Connection};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{ConnectSettings, DbError, Pool};

/// How long a caller may wait in the pool's queue for a session before it is an outage.
const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

impl ConnectSettings {
    /// Open one session and drive its connection on a task of its own.
    ///
    /// # Errors
    ///
    /// [`DbError::Unavailable`] when the server cannot be reached in time or refuses the
    /// session.
    pub async fn connect(&self) -> Result<Client, DbError> {
        let (client, _driver) = self.open(None).await?;
        Ok(client)
    }

    /// Open one session under the connect timeout; what the server sends unasked
    /// (notifications, notices) goes to `messages` when given. The returned task drives the
    /// connection.
    ///
    /// # Errors
    ///
    /// As [`ConnectSettings::connect`].
    pub(crate) async fn open(
        &self,
        messages: Option<Sender<AsyncMessage>>,
    ) -> Result<(Client, JoinHandle<()>), DbError> {
        let connecting = self.config.connect(self.tls.clone());
        let (client, connection) = tokio::time::timeout(self.connect_deadline, connecting)
            .await
            .map_err(|_| {
                let servers = super::servers(&self.config);
                DbError::unavailable(format!("{servers} failed: timed out"))
            })?
            .map_err(|err| DbError::connecting(err, &self.config))?;
        Ok((client, drive(connection, messages)))
    }

    /// A pool of at most `database.pool_size` sessions, opened on demand, with a
    /// client-side deadline of twice `statement_timeout` on each operation.
    pub fn pool(&self) -> Pool {
        let manager = Manager::from_connect(
            self.config.clone(),
            PoolConnect(self.tls.clone()),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .create_timeout(Some(self.connect_deadline))
            .recycle_timeout(Some(self.connect_deadline))
            .build()
            .expect("a pool with a runtime always builds");
        let pooled = self.pooler() == crate::config::Pooler::Transaction;
        Pool::new(pool, self.query_deadline, pooled)
    }
}

/// Poll `connection` on a task of its own until it ends, sending its messages to `messages`
/// while someone receives them; without a receiver, notices are logged and notifications
/// dropped. A message that finds the receiver's queue full is dropped too: notifications are
/// only hints, and a flood of them must neither grow memory nor stop this task from reading
/// the answers its client waits for. The task ends when the client is dropped, the
/// connection fails, or the receiver goes away.
pub(crate) fn drive<S, T>(
    mut connection: Connection<S, T>,
    messages: Option<Sender<AsyncMessage>>,
) -> JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            match (message, &messages) {
                (Ok(message), Some(messages)) => match messages.try_send(message) {
                    Ok(()) => {}
                    // Dropped without a word: a log line each would be the flood again.
                    Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Closed(_)) => break,
                },
                (Ok(AsyncMessage::Notice(notice)), None) => {
                    tracing::debug!(message = notice.message(), "server notice");
                }
                (Ok(_), None) => {}
                (Err(err), _) => {
                    tracing::debug!(error = %err, "database connection ended");
                    break;
                }
            }
        }
    })
}

/// How the pool opens a session: connect, then [`drive`]. The pool's create timeout bounds it.
struct PoolConnect(MakeRustlsConnect);

type Connecting<'a> = Pin<
    Box<dyn Future<Output = Result<(Client, JoinHandle<()>), tokio_postgres::Error>> + Send + 'a>,
>;

impl deadpool_postgres::Connect for PoolConnect {
    fn connect(&self, config: &Config) -> Connecting<'_> {
        let (config, tls) = (config.clone(), self.0.clone());
        Box::pin(async move {
            let (client, connection) = config.connect(tls).await?;
            Ok((client, drive(connection, None)))
        })
    }
}
