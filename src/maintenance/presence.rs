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
//!
//! The row also says how the daemon runs each queue (`handlers`, schema 23), and each daemon
//! compares its own with the other live daemons' (`Differences`): at the start, a daemon
//! that would run a queue with the built-in text-stats (it has no `[queues.NAME]` section)
//! while another runs it with a handler refuses to start ([`HandlerConflict`]): it would mark
//! the queue's tasks SUCCEEDED with word counts and never run their work. A daemon without the
//! section that runs already when such a daemon appears (restarted, or started at the same
//! moment) withholds the queue from its claims from its next heartbeat on
//! (`crate::worker::Withheld`), until no live daemon runs it with a handler. Every other
//! difference (another command, `exec` here and `http` there) is logged at ERROR once when
//! first seen, at the start or at a heartbeat: a rolling change of a queue's handler goes
//! through such a state and must not stop.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::jitter;
use crate::config::HandlerConfig;
use crate::db::{DbError, Pool};
use crate::queue;
use crate::worker::Withheld;

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
    /// Parallel to `queues`: how this daemon runs each ([`crate::config::HandlerConfig::fingerprint`]).
    handlers: Vec<String>,
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
    /// Write the row of `instance`, serving `queues` with `handlers` (parallel), then compare
    /// them with the other live daemons', and renew the row every [`period`] of
    /// `poll_interval` until [`Presence::stop`], comparing again each time and setting
    /// `withheld`, the queues the lanes leave out of their claims.
    ///
    /// # Errors
    ///
    /// [`HandlerConflict`]: this daemon would run a queue with text-stats that another live
    /// daemon runs with a handler; its row is deleted again.
    pub async fn start(
        pool: &Pool,
        instance: &str,
        queues: &[String],
        handlers: &[String],
        poll_interval: Duration,
        withheld: Arc<Withheld>,
    ) -> Result<Presence, HandlerConflict> {
        let row = Row {
            instance: instance.to_string(),
            queues: queues.to_vec(),
            handlers: handlers.to_vec(),
            every: period(poll_interval),
        };
        // Written and compared in one transaction, under a lock every starting daemon takes:
        // of two daemons starting at once, the second sees the first.
        let written = async {
            let client = pool.get().await?;
            client
                .bounded(queue::daemons::register_and_read(
                    &client,
                    &row.instance,
                    VERSION,
                    &row.queues,
                    &row.handlers,
                    row.every,
                ))
                .await
        }
        .await;
        let mut differences = Differences {
            seen: HashSet::new(),
            withheld,
        };
        match &written {
            Ok(others) => {
                if let Err(conflict) = differences.judge(&row, true, others.clone()) {
                    let _ = tokio::time::timeout(STOP_WAIT, remove(pool, &row.instance)).await;
                    return Err(conflict);
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not record this daemon in pgtaskd.daemons; retried at the next heartbeat")
            }
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(heartbeat(
            pool.clone(),
            row.clone(),
            written.is_ok(),
            differences,
            stop.clone(),
        ));
        Ok(Presence {
            pool: pool.clone(),
            row,
            stop,
            task,
        })
    }

    /// Stop the heartbeat and delete the row: the daemon serves nothing any more. While a task
    /// is still RUNNING under its lease key (a claim left unsettled, a result parked for a
    /// rescuer), the row is left to turn stale, as a crashed daemon's is, so that
    /// `pgtaskd.task_view` and the rescuer's error keep naming the daemon by its whole instance
    /// id until it is forgotten (schema 41).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
        let removed = remove(&self.pool, &self.row.instance);
        // A database that does not answer does not hold the stop: the row turns stale.
        match tokio::time::timeout(STOP_WAIT, removed).await {
            Ok(Ok(true)) => tracing::debug!("removed from pgtaskd.daemons"),
            Ok(Ok(false)) => tracing::info!(
                "left in pgtaskd.daemons: a task is still RUNNING under this daemon's lease (a claim left unsettled, a result parked for a rescuer); the row turns stale"
            ),
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
async fn heartbeat(
    pool: Pool,
    row: Row,
    mut up: bool,
    mut differences: Differences,
    stop: CancellationToken,
) {
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
        // A stop does not wait for a statement the database holds (a commit waiting for a
        // synchronous standby that is gone answers only at the pool's deadline).
        let result = tokio::select! {
            _ = stop.cancelled() => return,
            result = result => result,
        };
        match (result, up) {
            (Ok(forgotten), _) => {
                differences.compare(&pool, &row).await;
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
            &row.handlers,
            row.every,
        ))
        .await
}

/// Delete `instance`'s row.
async fn remove(pool: &Pool, instance: &str) -> Result<bool, DbError> {
    let client = pool.get().await?;
    client
        .bounded(queue::daemons::remove(&client, instance))
        .await
}

/// This daemon would run a queue with the built-in text-stats that another live daemon runs
/// with a handler of its own.
#[derive(Debug, thiserror::Error)]
#[error(
    "queue \"{queue}\" is run by daemon {instance} with its {handler} handler, but this daemon has \
     no [queues.{queue}] section and would run its tasks through the built-in text-stats, \
     marking them SUCCEEDED without running their work: give this daemon the same \
     [queues.{queue}] section, or leave the queue out of its worker.queues"
)]
pub struct HandlerConflict {
    pub queue: String,
    pub instance: String,
    /// The other daemon's handler: `exec` or `http`.
    pub handler: String,
}

/// The differences between how this daemon and the other live ones run the same queues,
/// each logged once, when first seen.
#[derive(Debug)]
struct Differences {
    seen: HashSet<queue::daemons::RunElsewhere>,
    /// The queues left out of this daemon's claims, shared with its lanes.
    withheld: Arc<Withheld>,
}

impl Differences {
    /// At a heartbeat: read how the other live daemons run this daemon's queues, and judge.
    /// A failed read changes nothing (the next heartbeat reads again).
    async fn compare(&mut self, pool: &Pool, row: &Row) {
        let read = async {
            let client = pool.get().await?;
            client
                .bounded(queue::daemons::run_elsewhere(
                    &client,
                    &row.instance,
                    &row.queues,
                ))
                .await
        };
        match read.await {
            // Never a conflict after the start: a daemon that runs does not stop for it.
            Ok(others) => {
                let _ = self.judge(row, false, others);
            }
            Err(err) => {
                tracing::debug!(error = %err, "could not compare handlers with the other daemons");
            }
        }
    }

    /// Judge `others`, how the other live daemons run this daemon's queues. At the `start`, a
    /// queue this daemon would run with text-stats while another runs it with a handler is a
    /// [`HandlerConflict`]. Later, such queues are withheld from this daemon's claims (set in
    /// `withheld`, logged at ERROR when they start to be, at INFO when claimed again). Every
    /// other difference is logged at ERROR once.
    fn judge(
        &mut self,
        row: &Row,
        start: bool,
        others: Vec<queue::daemons::RunElsewhere>,
    ) -> Result<(), HandlerConflict> {
        let text_stats = HandlerConfig::TextStats.fingerprint();
        let mut withhold: BTreeMap<String, (String, String)> = BTreeMap::new();
        for other in others {
            let Some(ours) = row
                .queues
                .iter()
                .position(|queue| *queue == other.queue)
                .map(|k| &row.handlers[k])
            else {
                continue;
            };
            if *ours == other.handler {
                continue;
            }
            let kind = other
                .handler
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string();
            if *ours == text_stats && other.handler != text_stats {
                if start {
                    return Err(HandlerConflict {
                        queue: other.queue,
                        instance: other.instance,
                        handler: kind,
                    });
                }
                withhold
                    .entry(other.queue.clone())
                    .or_insert((other.instance, kind));
                continue;
            }
            if self.seen.contains(&other) {
                continue;
            }
            tracing::error!(
                queue = %other.queue,
                this_daemon = %ours,
                other_daemon = %other.instance,
                other_handler = %other.handler,
                "another daemon runs this queue with another handler or command: each task runs \
                 with the one of the daemon that claims it; give every daemon serving the queue \
                 the same [queues.NAME] section"
            );
            self.seen.insert(other);
        }
        let (added, removed) = self.withheld.set(withhold.keys().cloned().collect());
        for queue in added {
            let (instance, handler) = &withhold[&queue];
            tracing::error!(
                queue = %queue,
                other_daemon = %instance,
                other_handler = %handler,
                "this daemon stops claiming the queue: another daemon runs it with its handler, \
                 and this one has no [queues.NAME] section and would mark its tasks SUCCEEDED \
                 without running their work; give it the same section"
            );
        }
        for queue in removed {
            tracing::info!(
                queue = %queue,
                "this daemon claims the queue again: no live daemon runs it with a handler any more"
            );
        }
        Ok(())
    }
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
