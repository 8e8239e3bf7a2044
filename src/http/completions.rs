//! The daemon's waiters for finished tasks: `GET /tasks/{id}?wait=...` requests, served from
//! the daemon's one LISTEN session, with no database session held while they wait.
//!
//! [`Completions`] is a map of waiters keyed by task id. The listener feeds it the ids of each
//! `pgtaskd_done` notification ([`Completions::completed`]) and wakes every waiter after it
//! reconnects ([`Completions::wake_all`]: notifications may have been lost meanwhile); its poll
//! loop ([`Completions::poll`]) asks the table, once per tick for all waiters together, which
//! of their tasks are finished or gone. A wake-up only makes a waiter read its row again: the
//! row is the truth (docs/design.md, "Completion notifications"). A waiter costs a map entry
//! and a `watch` channel, a few hundred bytes; ten thousand of them cost a few MiB and no
//! session beyond the pool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

use crate::db::Pool;

/// Every waiter of the daemon, by task id.
#[derive(Default)]
pub struct Completions {
    waiters: Mutex<HashMap<i64, watch::Sender<()>>>,
}

impl Completions {
    pub fn new() -> Arc<Completions> {
        Arc::new(Completions::default())
    }

    fn waiters(&self) -> MutexGuard<'_, HashMap<i64, watch::Sender<()>>> {
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Start watching task `id`. Register before reading the row: a wake-up that comes after
    /// this call and before [`Watch::changed`] is not lost.
    pub fn watch(self: &Arc<Completions>, id: i64) -> Watch {
        let receiver = self
            .waiters()
            .entry(id)
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        Watch {
            hub: Arc::clone(self),
            id,
            receiver: Some(receiver),
        }
    }

    /// These tasks may have finished: wake their waiters.
    pub fn completed(&self, ids: impl IntoIterator<Item = i64>) {
        let waiters = self.waiters();
        if waiters.is_empty() {
            return;
        }
        for id in ids {
            if let Some(sender) = waiters.get(&id) {
                sender.send_replace(());
            }
        }
    }

    /// Wake every waiter: notifications may have been lost (the listener reconnected).
    pub fn wake_all(&self) {
        for sender in self.waiters().values() {
            sender.send_replace(());
        }
    }

    /// How many tasks are waited for.
    #[cfg(test)]
    pub fn watched(&self) -> usize {
        self.waiters().len()
    }

    /// Until `stop`: every `every` (jittered), ask the table which of the tasks waited for are
    /// finished or gone, in one statement for all of them, and wake their waiters. The safety
    /// net for a lost notification.
    pub async fn poll(
        self: Arc<Completions>,
        pool: Pool,
        every: Duration,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(crate::backoff::jitter(every)) => {}
            }
            let ids: Vec<i64> = self.waiters().keys().copied().collect();
            if ids.is_empty() {
                continue;
            }
            match ended(&pool, &ids).await {
                Ok(ended) => self.completed(ended),
                Err(err) => tracing::debug!(error = %err, "cannot poll the tasks waited for"),
            }
        }
    }
}

/// Of `ids`, those whose task is terminal or has no row.
async fn ended(pool: &Pool, ids: &[i64]) -> Result<Vec<i64>, crate::db::DbError> {
    let session = pool.get().await?;
    let rows = session
        .bounded(async {
            session
                .query_typed(
                    "SELECT w.id FROM unnest($1::bigint[]) AS w(id) \
                       LEFT JOIN pgtaskd.task_view AS t ON t.id = w.id \
                      WHERE t.id IS NULL OR t.status IN ('SUCCEEDED', 'FAILED', 'CANCELED')",
                    &[(&ids, Type::INT8_ARRAY)],
                )
                .await
                .map_err(crate::db::DbError::from)
        })
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// One waiter's registration; dropping it unregisters.
pub struct Watch {
    hub: Arc<Completions>,
    id: i64,
    receiver: Option<watch::Receiver<()>>,
}

impl Watch {
    /// Until the task may have finished (a hint: read the row).
    pub async fn changed(&mut self) {
        // The sender lives in the map while any receiver does, so `changed` fails only when
        // this watch was dropped.
        if let Some(receiver) = self.receiver.as_mut() {
            if receiver.changed().await.is_ok() {
                return;
            }
        }
        std::future::pending().await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.receiver = None;
        let mut waiters = self.hub.waiters();
        if waiters
            .get(&self.id)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            waiters.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_completion_after_the_watch_began_is_not_lost_and_the_last_watch_unregisters() {
        let hub = Completions::new();
        let mut first = hub.watch(7);
        let mut second = hub.watch(7);
        let other = hub.watch(8);
        assert_eq!(hub.watched(), 2);
        hub.completed([7, 9]);
        tokio::time::timeout(Duration::from_secs(5), first.changed())
            .await
            .expect("woken");
        tokio::time::timeout(Duration::from_secs(5), second.changed())
            .await
            .expect("woken");
        drop(first);
        assert_eq!(hub.watched(), 2);
        drop(second);
        assert_eq!(hub.watched(), 1);
        drop(other);
        assert_eq!(hub.watched(), 0);
    }
}
