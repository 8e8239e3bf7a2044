//! Producers mode: how many single-row INSERTs per second `--producers` connections commit
//! while the daemon runs, first with the table's NOTIFY trigger as shipped, then with it
//! disabled (`ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify`), in the same run. Every
//! commit that sends a notification takes a lock shared by the whole cluster, so the second
//! figure is what the first would be without that lock. Before the first half and after the
//! second, the daemon's idle latency is measured as latency mode does, so that a run also
//! shows that the daemon is woken at once when the producers stop (the trigger notifies only
//! while a daemon is flagged idle: docs/design.md, "Idle flags"). The trigger is enabled again after
//! the second half whether it succeeded or not (a bench killed during that half leaves it
//! disabled: `ALTER TABLE pgtaskd.tasks ENABLE TRIGGER tasks_notify` puts it back). Called by
//! [`super::run`].
//!
//! Task `k` of the run, counted across producers and halves, gets the workload's text `k`, so
//! the table's totals are checked as every other mode's. Each half stops at `--duration` or
//! once [`PRODUCER_LIMIT`] tasks were inserted in the run.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::{AsyncMessage, Client};

use super::daemon::Daemon;
use super::report::{Enqueue, Latency, Producers};
use super::sql;
use super::table::wait_done;
use super::timing::{latencies, listening};
use super::{workload, BenchError, LATENCY_MODE_TASKS, PRODUCER_LIMIT};
use crate::db::{listen, ConnectSettings};

/// Measure the idle latency, run both halves, measure the idle latency again; returns the
/// figures and the tasks inserted.
pub(super) async fn producers(
    settings: &ConnectSettings,
    client: &Client,
    queue: &str,
    daemon: &Daemon,
    producers: usize,
    duration: Duration,
) -> Result<(Producers, u32), BenchError> {
    let mut sessions = Vec::with_capacity(producers);
    for _ in 0..producers {
        sessions.push(Arc::new(settings.connect().await?));
    }
    let next = Arc::new(AtomicU32::new(0));
    let idle_before = idle_latency(client, queue, daemon, &next).await?;
    let with_trigger = half(settings, client, &sessions, queue, duration, &next).await?;
    wait_done(client, queue, inserted(&next) as usize).await?;
    client.batch_execute(sql::DISABLE_NOTIFY_TRIGGER).await?;
    let without = half(settings, client, &sessions, queue, duration, &next).await;
    client.batch_execute(sql::ENABLE_NOTIFY_TRIGGER).await?;
    let without_trigger = without?;
    wait_done(client, queue, inserted(&next) as usize).await?;
    // The numbers drawn past the limit were not inserted: the next tasks take them.
    next.store(inserted(&next), Ordering::SeqCst);
    let idle_after = idle_latency(client, queue, daemon, &next).await?;
    let n = next.load(Ordering::SeqCst);
    let figures = Producers {
        producers,
        seconds_each: duration.as_secs_f64(),
        with_over_without: with_trigger.commits_per_s / without_trigger.commits_per_s,
        with_trigger,
        without_trigger,
        idle_latency_before_ms: idle_before,
        idle_latency_after_ms: idle_after,
    };
    Ok((figures, n))
}

/// Latency mode's measurement on the daemon of the run, now idle: warm-up tasks, then one
/// task at a time, 20 ms apart, each timed from just before its INSERT to its analyzer start.
/// The tasks take the next numbers of the run's workload.
async fn idle_latency(
    client: &Client,
    queue: &str,
    daemon: &Daemon,
    next: &AtomicU32,
) -> Result<Latency, BenchError> {
    let first = next.fetch_add(LATENCY_MODE_TASKS, Ordering::SeqCst);
    let texts: Vec<String> = (first..first + LATENCY_MODE_TASKS)
        .map(workload::gen_text)
        .collect();
    latencies(client, queue, &texts, daemon).await
}

/// The tasks inserted so far: every number drawn under the limit was inserted.
fn inserted(next: &AtomicU32) -> u32 {
    next.load(Ordering::SeqCst).min(PRODUCER_LIMIT)
}

/// Every session commits single-row INSERTs until `duration` has passed, while a `LISTEN`
/// session counts the notifications they sent.
async fn half(
    settings: &ConnectSettings,
    client: &Client,
    sessions: &[Arc<Client>],
    queue: &str,
    duration: Duration,
    next: &Arc<AtomicU32>,
) -> Result<Enqueue, BenchError> {
    let counter = NotifyCounter::start(settings).await?;
    let started = Instant::now();
    let deadline = started + duration;
    let mut producers = tokio::task::JoinSet::new();
    for session in sessions {
        let session = Arc::clone(session);
        let next = Arc::clone(next);
        let queue = queue.to_string();
        producers.spawn(async move {
            let insert = session.prepare(sql::INSERT_ONE).await?;
            let mut commits = 0u64;
            while Instant::now() < deadline {
                let k = next.fetch_add(1, Ordering::SeqCst);
                if k >= PRODUCER_LIMIT {
                    break;
                }
                session
                    .execute(&insert, &[&queue, &workload::gen_text(k)])
                    .await?;
                commits += 1;
            }
            Ok::<_, BenchError>(commits)
        });
    }
    let mut commits = 0;
    while let Some(done) = producers.join_next().await {
        commits += done.map_err(|err| BenchError::Session(err.to_string()))??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let notified = counter.finish(client).await?;
    Ok(Enqueue {
        commits,
        seconds,
        commits_per_s: commits as f64 / seconds,
        notified,
    })
}

/// The channel of the marker that ends a count: notifications arrive in commit order, so
/// once the marker has, so has every notification committed before it.
const MARKER_CHANNEL: &str = "pgtaskd_bench_marker";

/// A `LISTEN` session of the bench's own counting `pgtaskd_tasks` notifications.
struct NotifyCounter {
    _session: Client,
    counted: tokio::task::JoinHandle<u64>,
}

impl NotifyCounter {
    async fn start(settings: &ConnectSettings) -> Result<Self, BenchError> {
        let (session, mut messages, pump) =
            listening(settings, &[listen::TASKS_CHANNEL, MARKER_CHANNEL]).await?;
        let counted = tokio::spawn(async move {
            // The session's connection lives as long as the count.
            let _pump = pump;
            let mut n = 0;
            while let Some(message) = messages.recv().await {
                if let AsyncMessage::Notification(note) = message {
                    if note.channel() == MARKER_CHANNEL {
                        break;
                    }
                    n += 1;
                }
            }
            n
        });
        Ok(NotifyCounter {
            _session: session,
            counted,
        })
    }

    /// Send the marker and return the notifications counted before it.
    async fn finish(self, client: &Client) -> Result<u64, BenchError> {
        client.batch_execute(&sql::notify(MARKER_CHANNEL)).await?;
        tokio::time::timeout(MARKER_WAIT, self.counted)
            .await
            .map_err(|_| BenchError::NoNotification)?
            .map_err(|err| BenchError::Session(err.to_string()))
    }
}

/// How long the marker may take to arrive.
const MARKER_WAIT: Duration = Duration::from_secs(30);
