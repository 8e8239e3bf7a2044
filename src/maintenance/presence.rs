//! Presence: the daemon's row in `pgtaskd.daemons` (docs/design.md, "Daemons connected"),
//! which says that a live daemon serves its queues.
//!
//! [`Presence::start`] writes the row once, right after the schema check, so that a daemon
//! ready to work is listed; a failure there is logged and retried at the next heartbeat, never
//! a reason not to start. Then a task of its own renews `heartbeat_at` every [`period`]
//! (jittered), and deletes the rows of daemons gone for [`queue::daemons::FORGET_AFTER`].
//! Every statement is bounded by the pool's deadline; an outage is logged once and waited
//! out, the next heartbeat after it writes the row again (an upsert: a row deleted meanwhile
//! comes back). Nothing here holds a session the worker needs for longer than one statement.
//! [`Presence::stop`] ends the task and deletes the row, at a clean stop, waiting at most
//! `STOP_WAIT` (a database that does not answer leaves the row to turn stale).

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::jitter;
use crate::db::{DbError, Pool};
use crate::queue;

/// The version written in the row: this binary's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How often a daemon renews its heartbeat: five poll intervals, from 1 s to 30 s (10 s with
/// the default `worker.poll_interval` of 2 s). The row turns stale after
/// [`queue::daemons::STALE_PERIODS`] of them.
pub fn period(poll_interval: Duration) -> Duration {
    (poll_interval * 5).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// The longest a stop waits to delete the row, a session included.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// What the row says.
#[derive(Debug, Clone)]
struct Row {
    instance: String,
    queues: Vec<String>,
    every: Duration,
}

/// The running heartbeat of one daemon's row.
pub struct Presence {
    pool: Pool,
    row: Row,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Presence {
    /// Write the row of `instance`, serving `queues`, and renew it every [`period`] of
    /// `poll_interval` until [`Presence::stop`].
    pub async fn start(
        pool: &Pool,
        instance: &str,
        queues: &[String],
        poll_interval: Duration,
    ) -> Presence {
        let row = Row {
            instance: instance.to_string(),
            queues: queues.to_vec(),
            every: period(poll_interval),
        };
        let written = register(pool, &row).await;
        if let Err(err) = &written {
            tracing::warn!(error = %err, "could not record this daemon in pgtaskd.daemons; retried at the next heartbeat");
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(heartbeat(
            pool.clone(),
            row.clone(),
            written.is_ok(),
            stop.clone(),
        ));
        Presence {
            pool: pool.clone(),
            row,
            stop,
            task,
        }
    }

    /// Stop the heartbeat and delete the row: the daemon serves nothing any more.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
        let removed = async {
            let client = self.pool.get().await?;
            client
                .bounded(queue::daemons::remove(&client, &self.row.instance))
                .await
        };
        // A database that does not answer does not hold the stop: the row turns stale.
        match tokio::time::timeout(STOP_WAIT, removed).await {
            Ok(Ok(())) => tracing::debug!("removed from pgtaskd.daemons"),
            Ok(Err(err)) => tracing::warn!(
                error = %err,
                "could not remove this daemon from pgtaskd.daemons; its row turns stale"
            ),
            Err(_) => tracing::warn!(
                wait = ?STOP_WAIT,
                "the database did not answer the removal from pgtaskd.daemons; its row turns stale"
            ),
        }
    }
}

/// Renew the row and forget the long gone on every tick until `stop` fires; `up`: the last
/// write succeeded.
async fn heartbeat(pool: Pool, row: Row, mut up: bool, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(jitter(row.every)) => {}
        }
        let result = async {
            register(&pool, &row).await?;
            let client = pool.get().await?;
            client
                .bounded(queue::daemons::forget(
                    &client,
                    queue::daemons::FORGET_AFTER,
                ))
                .await
        };
        match (result.await, up) {
            (Ok(forgotten), _) => {
                if !up {
                    tracing::info!("recorded in pgtaskd.daemons again");
                }
                if forgotten > 0 {
                    tracing::info!(
                        forgotten,
                        "rows of daemons gone for an hour deleted from pgtaskd.daemons"
                    );
                }
                up = true;
            }
            (Err(err), true) => {
                tracing::warn!(error = %err, "could not renew this daemon's heartbeat in pgtaskd.daemons; it waits for the database");
                up = false;
            }
            (Err(err), false) => {
                tracing::debug!(error = %err, "heartbeat of pgtaskd.daemons failed again")
            }
        }
    }
}

/// Insert or renew `row`, within the pool's deadline.
async fn register(pool: &Pool, row: &Row) -> Result<(), DbError> {
    let client = pool.get().await?;
    client
        .bounded(queue::daemons::register(
            &client,
            &row.instance,
            VERSION,
            &row.queues,
            row.every,
        ))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_five_poll_intervals_between_a_second_and_half_a_minute() {
        let s = Duration::from_secs;
        assert_eq!(period(s(2)), s(10));
        assert_eq!(period(Duration::from_millis(100)), s(1));
        assert_eq!(period(s(60)), s(30));
    }
}
