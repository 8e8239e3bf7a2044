//! The dashboard's JSON, also usable by scripts: `GET /stats` (what `pgtaskd stats --json`
//! prints), `GET /tasks?queue=&status=&limit=` (what `pgtaskd list --json` prints, as one
//! array) and `GET /stats/throughput` (tasks finished per minute over the last 15 minutes).
//!
//! Each reads the same bounded statements as the commands (`queue::stats`, `queue::list`);
//! the throughput is `queue::finished_per_minute`, one range of `tasks_finished_idx` reaching
//! 15 minutes back, so its cost follows the last minutes' throughput, never the table's size.

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::Json;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::extract::Db;
use crate::queue::{self, Finished, ListFilter, Listed, Stats, TaskStatus};

/// The most rows `GET /tasks` answers with, as `pgtaskd list --limit`.
const MAX_LIMIT: i64 = 10_000;
/// The rows `GET /tasks` answers with when no `limit` is given, as `pgtaskd list`.
const DEFAULT_LIMIT: i64 = 20;
/// The minutes of `GET /stats/throughput`, the current one included.
const MINUTES: i64 = 15;

/// `GET /stats`: every queue's figures and the daemons connected.
pub(super) async fn stats(Db(session): Db) -> Result<Json<Stats>, ApiError> {
    Ok(Json(session.bounded(queue::stats(&session)).await?))
}

/// The query of `GET /tasks`; other parameters are ignored.
#[derive(Debug, Deserialize)]
pub(super) struct ListParams {
    queue: Option<String>,
    status: Option<String>,
    limit: Option<String>,
}

impl ListParams {
    fn filter(self) -> Result<ListFilter, ApiError> {
        if let Some(queue) = &self.queue {
            queue::enqueue::check_queue_name(queue)?;
        }
        let queue = self.queue;
        let status = self
            .status
            .map(|s| {
                s.to_ascii_uppercase().parse::<TaskStatus>().map_err(|_| {
                    ApiError::BadRequest(
                        "status must be queued, running, succeeded, failed or canceled".into(),
                    )
                })
            })
            .transpose()?;
        let limit = match self.limit {
            None => DEFAULT_LIMIT,
            Some(text) => text
                .parse::<i64>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::BadRequest(format!("limit must be a number from 1 to {MAX_LIMIT}"))
                })?,
        };
        Ok(ListFilter {
            queue,
            status,
            limit,
        })
    }
}

/// `GET /tasks`: the latest tasks, newest first, without their payloads.
pub(super) async fn list(
    params: Result<Query<ListParams>, QueryRejection>,
    Db(session): Db,
) -> Result<Json<Vec<Listed>>, ApiError> {
    let Query(params) = params.map_err(|err| ApiError::BadRequest(err.body_text()))?;
    let filter = params.filter()?;
    Ok(Json(session.bounded(queue::list(&session, &filter)).await?))
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
