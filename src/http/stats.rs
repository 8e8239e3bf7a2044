//! The dashboard's JSON, also usable by scripts: `GET /stats` (what `pgtaskd stats --json`
//! prints) and `GET /stats/throughput` (tasks finished per minute over the last 15 minutes).
//! The dashboard's list of tasks is `GET /tasks` (`list.rs`).
//!
//! Each reads the same bounded statements as the commands (`queue::stats`);
//! the throughput is `queue::finished_per_minute`, one range of `tasks_finished_idx` reaching
//! 15 minutes back, so its cost follows the last minutes' throughput, never the table's size.

use axum::Json;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;

use super::error::ApiError;
use super::extract::Db;
use crate::queue::{self, Finished, Stats};

/// The minutes of `GET /stats/throughput`, the current one included.
const MINUTES: i64 = 15;

/// `GET /stats`: every queue's figures and the daemons connected.
pub(super) async fn stats(Db(session): Db) -> Result<Json<Stats>, ApiError> {
    Ok(Json(session.bounded(queue::stats(&session)).await?))
}

/// One minute of `GET /stats/throughput`.
#[derive(Debug, Serialize)]
pub(super) struct Minute {
    /// The minute's start.
    minute: DateTime<Utc>,
    #[serde(flatten)]
    finished: Finished,
}

/// `GET /stats/throughput`: the tasks finished in each of the last 15 minutes (the current,
/// partial one last), by how they ended; a minute without any is zeros.
pub(super) async fn throughput(Db(session): Db) -> Result<Json<Vec<Minute>>, ApiError> {
    let now = Utc::now()
        .duration_trunc(TimeDelta::minutes(1))
        .unwrap_or_else(|_| Utc::now());
    let first = now - TimeDelta::minutes(MINUTES - 1);
    let counted = session
        .bounded(queue::finished_per_minute(&session, first))
        .await?;
    let mut minutes: Vec<Minute> = (0..MINUTES)
        .map(|i| Minute {
            minute: first + TimeDelta::minutes(i),
            finished: Finished::default(),
        })
        .collect();
    for (minute, finished) in counted {
        if let Some(slot) = minutes.iter_mut().find(|m| m.minute == minute) {
            slot.finished = finished;
        }
    }
    Ok(Json(minutes))
}
