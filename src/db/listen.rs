//! The dedicated LISTEN connection: one per daemon, outside the pool, never in a transaction,
//! opened with `database.listen_url` (by default `database.url`), which must lead to
//! PostgreSQL itself: the daemon proves it at start (`super::pooler`).
//!
//! It turns `NOTIFY pgtaskd_tasks` into a wake-up, `NOTIFY pgtaskd_cancel, '<id>'` into a
//! cancel hint and, when the daemon has waiters to serve, `NOTIFY pgtaskd_done, '<id>,<id>...'`
//! into completion hints, through [`ListenEvents`]. Any role may send a notification, so none changes
//! anything by itself: a wake-up leads to a claim, which finds what the table holds; a cancel
//! hint is confirmed in the row before an analyzer is stopped; and the worker's poll tick is
//! the safety net for a notification lost (docs/design.md, "Nothing lost").
//!
//! The connection is checked, not trusted: a round trip every `LIVENESS_INTERVAL` (5 s) with a
//! deadline, on top of TCP keepalives, finds a half-open connection in seconds. With
//! `target_session_attrs=read-write` the round trip also asks whether the server still
//! accepts writes: a server turned read-only is no longer where producers insert, so its
//! notifications would never come. On any failure it reconnects, through the host list, with
//! capped, jittered backoff, and after every (re)connect it first
//! issues `LISTEN`, then reports [`ListenEvents::connected`] so that the daemon scans for work
//! that was enqueued while nobody listened, in that order.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, SimpleQueryMessage};
use tokio_util::sync::CancellationToken;

use super::{ConnectSettings, DbError};
use crate::backoff::Backoff;
use crate::repeats::{log_failure, Repeats};

/// The channel the insert trigger notifies.
pub const TASKS_CHANNEL: &str = "pgtaskd_tasks";
/// The channel `pgtaskd.cancel` notifies, with the task id as payload.
pub const CANCEL_CHANNEL: &str = "pgtaskd_cancel";
/// The channel every commit that ends tasks notifies, with their ids, comma-separated.
pub const DONE_CHANNEL: &str = "pgtaskd_done";

/// The task ids of a `pgtaskd_done` payload; anything that is not an id is skipped (anyone
/// may send a notification).
pub fn done_ids(payload: &str) -> impl Iterator<Item = i64> + '_ {
    payload
        .split(',')
        .filter_map(|part| part.trim().parse::<i64>().ok())
}

/// Messages received and not yet handled; past this, notifications are dropped (they are
/// hints: a wake-up is coalesced anyway, and the heartbeat reads cancel requests).
const MESSAGE_QUEUE: usize = 4096;
/// The most of a notification's payload a log line repeats.
const LOGGED_PAYLOAD: usize = 64;
/// Notifications without a task id on the cancel channel are reported at most once per this
/// period, with how many there were: anyone may send them.
const IGNORED_REPORT_PERIOD: Duration = Duration::from_secs(60);

/// Counts cancel notifications that name no task, and reports them without filling the log.
struct Ignored {
    count: u64,
    reported: Option<tokio::time::Instant>,
}

impl Ignored {
    fn new() -> Ignored {
        Ignored {
            count: 0,
            reported: None,
        }
    }

    /// One more arrived with `payload`: the first of a period is logged with (the start of)
    /// its payload; the rest are counted and reported when the period is over.
    fn add(&mut self, payload: &str) {
        self.count += 1;
        let now = tokio::time::Instant::now();
        if self
            .reported
            .is_some_and(|at| now.duration_since(at) < IGNORED_REPORT_PERIOD)
        {
            return;
        }
        let mut end = payload.len().min(LOGGED_PAYLOAD);
        while !payload.is_char_boundary(end) {
            end -= 1;
        }
        tracing::warn!(
            payload = &payload[..end],
            len = payload.len(),
            ignored = self.count,
            "ignoring cancel notifications without a task id (reported at most once a minute)"
        );
        self.count = 0;
        self.reported = Some(now);
    }
}

/// How often the listener proves its connection alive.
const LIVENESS_INTERVAL: Duration = Duration::from_secs(5);
/// How long that proof may take.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(5);
const RECONNECT_BASE: Duration = Duration::from_millis(100);
const RECONNECT_CAP: Duration = Duration::from_secs(5);

/// What the listener reports to the daemon.
pub trait ListenEvents: Send + Sync + 'static {
    /// `LISTEN` is in place on a fresh connection: scan once for work.
    fn connected(&self);
    /// The connection was lost, or a new one could not be opened, for the reason given;
    /// notifications are not arriving until the next `connected`.
    fn disconnected(&self, why: Option<&DbError>);
    /// Tasks were enqueued.
    fn work_available(&self);
    /// A running task's cancellation was requested.
    fn cancel_requested(&self, id: i64);
    /// Whether to LISTEN on [`DONE_CHANNEL`] too (the daemon serves waiters).
    fn wants_completions(&self) -> bool;
    /// These tasks were ended by a commit (a hint: read the rows).
    fn completed(&self, ids: &mut dyn Iterator<Item = i64>);
}

/// Listen until `stop` fires, reconnecting as often as needed.
pub async fn run(settings: ConnectSettings, events: impl ListenEvents, stop: CancellationToken) {
    let mut backoff = Backoff::new(RECONNECT_BASE, RECONNECT_CAP);
    let failures = Repeats::new();
    loop {
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            outcome = listen_once(&settings, &events, &mut backoff, &failures) => outcome,
        };
        events.disconnected(outcome.as_ref().err());
        if let Err(err) = outcome {
            log_failure!(
                failures,
                err,
                "listener connection lost; reconnecting with backoff"
            );
        }
        let delay = backoff.next_delay();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// One connection's life: connect, LISTEN, report, then dispatch until it fails.
async fn listen_once(
    settings: &ConnectSettings,
    events: &impl ListenEvents,
    backoff: &mut Backoff,
    failures: &Repeats,
) -> Result<(), DbError> {
    let (sender, mut messages) = mpsc::channel(MESSAGE_QUEUE);
    let (client, driver) = settings.open(Some(sender)).await?;
    let _driver = AbortOnDrop(driver);

    let mut listen = format!("LISTEN {TASKS_CHANNEL}; LISTEN {CANCEL_CHANNEL};");
    if events.wants_completions() {
        listen.push_str(&format!(" LISTEN {DONE_CHANNEL};"));
    }
    client.batch_execute(&listen).await?;
    match failures.succeeded() {
        Some(recovered) => tracing::info!(
            failures = recovered.failures,
            after_ms = recovered.after.as_millis() as u64,
            "listening for notifications again"
        ),
        None => tracing::info!("listening for notifications"),
    }
    backoff.reset();
    events.connected();

    let mut liveness = tokio::time::interval(LIVENESS_INTERVAL);
    let mut ignored = Ignored::new();
    liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    liveness.tick().await;
    loop {
        tokio::select! {
            message = messages.recv() => match message {
                Some(AsyncMessage::Notification(n)) => match n.channel() {
                    TASKS_CHANNEL => events.work_available(),
                    CANCEL_CHANNEL => match n.payload().trim().parse::<i64>() {
                        Ok(id) => events.cancel_requested(id),
                        Err(_) => ignored.add(n.payload()),
                    },
                    DONE_CHANNEL => events.completed(&mut done_ids(n.payload())),
                    other => tracing::debug!(channel = other, "ignoring a notification"),
                },
                Some(AsyncMessage::Notice(notice)) => {
                    tracing::debug!(message = notice.message(), "server notice on the listener");
                }
                Some(_) => {}
                None => return Err(DbError::unavailable("listener connection closed")),
            },
            _ = liveness.tick() => check_alive(&client, settings.requires_writes()).await?,
        }
    }
}

/// One liveness round trip, under [`LIVENESS_TIMEOUT`]; with `writes`, the server must also
/// still accept writes.
async fn check_alive(client: &tokio_postgres::Client, writes: bool) -> Result<(), DbError> {
    let query = if writes {
        "SHOW transaction_read_only"
    } else {
        ""
    };
    let answer = tokio::time::timeout(LIVENESS_TIMEOUT, client.simple_query(query))
        .await
        .map_err(|_| {
            DbError::unavailable("listener connection did not answer its liveness check")
        })??;
    let read_only = answer
        .iter()
        .any(|message| matches!(message, SimpleQueryMessage::Row(row) if row.get(0) == Some("on")));
    if read_only {
        return Err(DbError::unavailable(
            "the listener's server no longer accepts writes",
        ));
    }
    Ok(())
}

/// The messages (notifications, notices) of `connection`, forwarded by a task of its own:
/// they come only from a connection that is polled for them. The channel closes when the
/// connection fails or closes; dropping the returned guard stops the task.
pub fn forward_messages<S, T>(
    connection: tokio_postgres::Connection<S, T>,
) -> (mpsc::Receiver<AsyncMessage>, AbortOnDrop)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, messages) = mpsc::channel(MESSAGE_QUEUE);
    (
        messages,
        AbortOnDrop(super::open::drive(connection, Some(sender))),
    )
}

/// Aborts its task when dropped.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_ids_reads_the_ids_and_skips_the_rest() {
        let ids: Vec<i64> = done_ids("1,22, 333,x,,-4,99999999999999999999").collect();
        assert_eq!(ids, vec![1, 22, 333, -4]);
        assert_eq!(done_ids("").count(), 0);
    }
}
