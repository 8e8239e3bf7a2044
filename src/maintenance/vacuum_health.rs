//! The vacuum-health watch (docs/design.md, "Vacuum health"): every `vacuum_health.check_interval`,
//! read the task table's bloat and the oldest xmin horizon with one statement
//! ([`queue::vacuum_health`]), set the `/metrics` gauges from it, and, while the horizon has
//! been held longer than `vacuum_health.xmin_horizon_warning`, give `/readyz` a warning (the daemon
//! stays ready) and log one: at once when the horizon becomes held, then at most once a
//! minute while it stays held, and once when it is released.
//!
//! The horizon's age is the server's when it knows when the holder began (a session's
//! transaction start, a prepared transaction's time); otherwise (a replication slot, or another
//! role's session when the function's owner lacks `pg_read_all_stats`) it is how long this
//! watch has seen the same horizon: a lower bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::VacuumHealthConfig;
use crate::db::{DbError, Pool};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::queue::{self, Horizon, HorizonKind, VacuumHealth};

/// How often a horizon that stays held is logged again.
const REMINDER: Duration = Duration::from_secs(60);

/// Watch until `stop` fires.
pub async fn run(
    pool: Pool,
    config: VacuumHealthConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    stop: CancellationToken,
) {
    let mut watch = Watch::new(config.xmin_horizon_warning);
    let mut last_error: Option<String> = None;
    let mut said_partial = false;
    loop {
        match read(&pool).await {
            Ok(reading) => {
                if last_error.take().is_some() {
                    tracing::info!("vacuum health readable again");
                }
                if !reading.sees_all_sessions && !said_partial {
                    said_partial = true;
                    tracing::info!(
                        "the owner of pgtaskd.vacuum_health() has no pg_read_all_stats: the \
                         age of a horizon held by another role's session is measured from when \
                         this daemon first saw it, and its state is not known"
                    );
                }
                let seen = watch.observe(&reading, Instant::now());
                metrics.observe_vacuum(&reading, seen.age_s, seen.warning.is_some());
                health.horizon_held(seen.warning.clone());
                log(&seen, reading.horizon.as_ref());
            }
            Err(err) => {
                let text = err.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %err, "cannot read the vacuum health");
                    last_error = Some(text);
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.check_interval) => {}
        }
    }
}

/// One reading of the vacuum health on a pooled session (also the daemon's vacuum's, in
/// `super::vacuum`).
pub(crate) async fn read(pool: &Pool) -> Result<VacuumHealth, DbError> {
    let session = pool.get().await?;
    session.bounded(queue::vacuum_health(&session)).await
}

fn log(seen: &Seen, horizon: Option<&Horizon>) {
    let Some(notice) = seen.notice else { return };
    match (notice, horizon) {
        (Notice::Held | Notice::StillHeld, Some(h)) => tracing::warn!(
            kind = h.kind.as_str(),
            age_s = seen.age_s.round() as u64,
            age_xids = h.age_xids,
            pid = h.pid,
            name = h.name.as_deref(),
            state = h.state.as_deref(),
            "{}",
            if notice == Notice::Held {
                "xmin horizon held back: vacuum cannot remove the dead rows of pgtaskd.task_state"
            } else {
                "xmin horizon still held back: vacuum cannot remove the dead rows of pgtaskd.task_state"
            }
        ),
        _ => tracing::info!("xmin horizon released: vacuum can remove dead rows again"),
    }
}

/// What one reading means for the log, `/readyz` and the gauges.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    /// The horizon's age in seconds (0 when nothing holds it).
    age_s: f64,
    /// `/readyz`'s warning, while held past the threshold.
    warning: Option<String>,
    /// What to log now, if anything.
    notice: Option<Notice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// The horizon became held past the threshold.
    Held,
    /// It is still held, a minute or more after the last line.
    StillHeld,
    /// It is not held any more.
    Released,
}

/// The watch's memory between readings: the horizon first seen (for the age of one whose
/// start the server does not give), and whether it was held and when that was last logged.
#[derive(Debug)]
struct Watch {
    threshold: Duration,
    first_seen: Option<(i64, Instant)>,
    held: bool,
    last_logged: Option<Instant>,
}

impl Watch {
    fn new(threshold: Duration) -> Watch {
        Watch {
            threshold,
            first_seen: None,
            held: false,
            last_logged: None,
        }
    }

    fn observe(&mut self, reading: &VacuumHealth, now: Instant) -> Seen {
        let age_s = match &reading.horizon {
            None => {
                self.first_seen = None;
                0.0
            }
            Some(horizon) => {
                let since = match self.first_seen {
                    Some((xid, at)) if xid == horizon.xid => at,
                    _ => {
                        self.first_seen = Some((horizon.xid, now));
                        now
                    }
                };
                horizon
                    .age_s
                    .unwrap_or_else(|| now.saturating_duration_since(since).as_secs_f64())
            }
        };
        let held = reading
            .horizon
            .as_ref()
            .filter(|_| age_s >= self.threshold.as_secs_f64());
        let notice = match (self.held, held.is_some()) {
            (false, true) => Some(Notice::Held),
            (true, true)
                if self
                    .last_logged
                    .is_none_or(|at| now.saturating_duration_since(at) >= REMINDER) =>
            {
                Some(Notice::StillHeld)
            }
            (true, false) => Some(Notice::Released),
            _ => None,
        };
        if notice.is_some() {
            self.last_logged = Some(now);
        }
        self.held = held.is_some();
        Seen {
            age_s,
            warning: held.map(|h| describe(h, age_s)),
            notice,
        }
    }
}

/// `/readyz`'s words for a held horizon: what holds it and for how long, never a query.
fn describe(horizon: &Horizon, age_s: f64) -> String {
    let holder = match horizon.kind {
        HorizonKind::Session => {
            let mut text = String::from("a session");
            if let Some(pid) = horizon.pid {
                text.push_str(&format!(" (pid {pid}"));
                if let Some(name) = horizon.name.as_deref().filter(|n| !n.is_empty()) {
                    text.push_str(&format!(", application_name {name:?}"));
                }
                if let Some(state) = &horizon.state {
                    text.push_str(&format!(", {state}"));
                }
                text.push(')');
            }
            text
        }
        HorizonKind::PreparedTransaction => "a prepared transaction".to_string(),
        HorizonKind::ReplicationSlot => match &horizon.name {
            Some(name) => format!("replication slot {name:?}"),
            None => "a replication slot".to_string(),
        },
    };
    format!(
        "xmin horizon held back for {}s ({} transactions) by {holder}: vacuum cannot remove the \
         dead rows of pgtaskd.task_state",
        age_s.round() as u64,
        horizon.age_xids
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(horizon: Option<Horizon>) -> VacuumHealth {
        VacuumHealth {
            live_tuples: 0,
            dead_tuples: 0,
            vacuum_age_s: None,
            autovacuum_age_s: None,
            vacuum_count: 0,
            autovacuum_count: 0,
            table_bytes: 0,
            toast_bytes: 0,
            index_bytes: 0,
            horizon,
            sees_all_sessions: true,
        }
    }

    fn session(xid: i64, age_s: Option<f64>) -> Horizon {
        Horizon {
            kind: HorizonKind::Session,
            xid,
            age_xids: 3,
            age_s,
            pid: Some(4711),
            name: Some("psql".into()),
            state: Some("idle in transaction".into()),
        }
    }

    #[test]
    fn a_held_horizon_is_logged_when_it_starts_each_minute_after_and_when_released() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut watch = Watch::new(s(300));
        let at = |secs| reading(Some(session(7, Some(secs))));
        let steps = [
            (0, at(10.0), None),
            (15, at(299.0), None),
            (30, at(300.0), Some(Notice::Held)),
            (45, at(315.0), None),
            (60, at(330.0), None),
            (89, at(359.0), None),
            (90, at(360.0), Some(Notice::StillHeld)),
            (105, at(375.0), None),
            (150, at(420.0), Some(Notice::StillHeld)),
            (165, reading(None), Some(Notice::Released)),
            (180, reading(None), None),
            (195, at(400.0), Some(Notice::Held)),
        ];
        for (secs, r, want) in steps {
            let seen = watch.observe(&r, t0 + s(secs));
            assert_eq!(seen.notice, want, "at {secs}s");
            assert_eq!(
                seen.warning.is_some(),
                r.horizon.as_ref().and_then(|h| h.age_s).unwrap_or(0.0) >= 300.0,
                "at {secs}s"
            );
        }
    }

    #[test]
    fn without_a_start_from_the_server_the_age_counts_from_when_the_horizon_was_first_seen() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut watch = Watch::new(s(60));
        let slot = |xid| {
            reading(Some(Horizon {
                kind: HorizonKind::ReplicationSlot,
                xid,
                age_xids: 100,
                age_s: None,
                pid: None,
                name: Some("standby_1".into()),
                state: None,
            }))
        };
        assert_eq!(watch.observe(&slot(9), t0).age_s, 0.0);
        assert_eq!(watch.observe(&slot(9), t0 + s(30)).age_s, 30.0);
        let seen = watch.observe(&slot(9), t0 + s(61));
        assert_eq!((seen.age_s, seen.notice), (61.0, Some(Notice::Held)));
        assert_eq!(
            seen.warning.as_deref(),
            Some(
                "xmin horizon held back for 61s (100 transactions) by replication slot \
                 \"standby_1\": vacuum cannot remove the dead rows of pgtaskd.task_state"
            )
        );
        // Another horizon starts the count again.
        let seen = watch.observe(&slot(12), t0 + s(70));
        assert_eq!((seen.age_s, seen.notice), (0.0, Some(Notice::Released)));
    }

    #[test]
    fn the_warning_names_the_session_and_never_more() {
        let text = describe(&session(7, Some(400.0)), 400.0);
        assert_eq!(
            text,
            "xmin horizon held back for 400s (3 transactions) by a session (pid 4711, \
             application_name \"psql\", idle in transaction): vacuum cannot remove the dead \
             rows of pgtaskd.task_state"
        );
    }
}
