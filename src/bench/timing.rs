//! Timing single tasks, for latency and producers modes: the latency of each task from just
//! before its INSERT to the daemon's analyzer start, and the notify floor under it, timed to
//! a `LISTEN` session of the bench's own.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client};

use super::daemon::{AnalyzerStarts, Daemon};
use super::report::Latency;
use super::sql;
use super::table::{delete_rows, wait_done};
use super::{BenchError, LATENCY_GAP, LATENCY_TASKS, NOTIFY_WAIT, WARM_UP};
use crate::db::{listen, ConnectSettings, DbError};

/// How long the notify floor's idle flag lives: the floor's 210 inserts take about 5 s.
const FLOOR_FLAG: Duration = Duration::from_secs(60);

/// Latency mode: warm-up, then one task at a time, 20 ms apart; the latency of a task is
/// from just before its INSERT to the daemon's [`crate::events::ANALYZER_RUN`] event for it.
pub(super) async fn latencies(
    client: &Client,
    queue: &str,
    texts: &[String],
    daemon: &Daemon,
) -> Result<Latency, BenchError> {
    let insert = client.prepare(sql::INSERT_ONE_RETURNING_ID).await?;
    let count = texts.len();
    let mut sent = Vec::with_capacity(count);
    for (i, text) in texts.iter().take(count).enumerate() {
        let before = chrono::Utc::now();
        let id: i64 = client.query_one(&insert, &[&queue, text]).await?.get(0);
        if i >= WARM_UP {
            sent.push((id, before));
        }
        tokio::time::sleep(LATENCY_GAP).await;
    }
    wait_done(client, queue, count).await?;
    let mut starts = AnalyzerStarts::default();
    let mut millis = Vec::with_capacity(sent.len());
    for (id, before) in sent {
        let started = starts.of(daemon, id).await?;
        millis.push((started - before).num_microseconds().unwrap_or(0) as f64 / 1000.0);
    }
    Ok(Latency::of(millis))
}

/// The floor under the latency: the same inserts, one at a time and as far apart, with no
/// daemon running and a `LISTEN` session of the bench's own timing each notification's
/// arrival. Its rows go to a queue of their own, removed afterwards. The session flags itself
/// idle as a daemon does (`pgtaskd.idle_daemons`), so that the inserts notify; the flag is
/// removed afterwards, and expires by itself within [`FLOOR_FLAG`] if the bench is killed.
pub(super) async fn notify_floor(
    settings: &ConnectSettings,
    client: &Client,
    queue: &str,
    texts: &[String],
) -> Result<Latency, BenchError> {
    let (_listener, mut messages, _pump) = listening(settings, &[listen::TASKS_CHANNEL]).await?;
    let queue = format!("{queue}-floor");
    let flag = format!("{queue}:{}", std::process::id());
    client
        .execute(sql::FLAG_IDLE, &[&flag, &FLOOR_FLAG.as_secs_f64()])
        .await?;
    let insert = client.prepare(sql::INSERT_ONE).await?;
    let timed = async {
        let mut millis = Vec::with_capacity(LATENCY_TASKS);
        for (i, text) in texts.iter().enumerate() {
            let before = Instant::now();
            client.execute(&insert, &[&queue, text]).await?;
            let notified = async {
                loop {
                    match messages.recv().await {
                        Some(AsyncMessage::Notification(_)) => return Some(Instant::now()),
                        Some(_) => {}
                        None => return None,
                    }
                }
            };
            let arrived = tokio::time::timeout(NOTIFY_WAIT, notified)
                .await
                .ok()
                .flatten()
                .ok_or(BenchError::NoNotification)?;
            if i >= WARM_UP {
                millis.push((arrived - before).as_micros() as f64 / 1000.0);
            }
            tokio::time::sleep(LATENCY_GAP).await;
        }
        Ok::<_, BenchError>(millis)
    }
    .await;
    client.execute(sql::UNFLAG_IDLE, &[&flag]).await?;
    delete_rows(client, &queue).await?;
    Ok(Latency::of(timed?))
}

/// A session of the bench's own that `LISTEN`s on `channels`, its messages forwarded as the
/// daemon's listener forwards them; the session lives while the client and the pump do.
pub(super) async fn listening(
    settings: &ConnectSettings,
    channels: &[&str],
) -> Result<(Client, mpsc::Receiver<AsyncMessage>, listen::AbortOnDrop), BenchError> {
    let (session, connection) = settings
        .config()
        .connect(settings.tls())
        .await
        .map_err(DbError::from)?;
    let (messages, pump) = listen::forward_messages(connection);
    session.batch_execute(&sql::listen(channels)).await?;
    Ok((session, messages, pump))
}
