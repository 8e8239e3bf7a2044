//! The scheduler: every daemon looks at every schedule when its next instant comes (and at
//! least once a second, to see schedules added, changed, paused or fired by another daemon),
//! and fires what is due through `pgtaskd.fire_schedule`, which lets exactly one daemon make
//! each fire (docs/schedules.md, "No leader"). The instants are compared with the database's
//! clock, read with the schedules, so that daemons whose clocks disagree agree on what is due.

use std::collections::HashSet;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::{DbError, Pool};
use crate::repeats::{log_failure, log_recovery, Repeats};
use crate::schedule::store::{self, FireError, Fired};

/// The looks that failed since the last that did: an outage said once, not once a second.
static FAILURES: Repeats = Repeats::new();

/// The longest time between two looks: a schedule added, changed or resumed is seen within it.
const RELOAD: Duration = Duration::from_secs(1);

/// Look at the schedules until `stop` fires.
pub async fn run(pool: Pool, stop: CancellationToken) {
    // The schedules whose rule the daemons cannot read, warned about once per definition, and
    // those whose fire the database refused, once per error.
    let mut warned: HashSet<(String, String)> = HashSet::new();
    loop {
        let wait = match look(&pool, &mut warned).await {
            Ok(wait) => {
                log_recovery!(FAILURES, "the schedules are fired again");
                wait
            }
            Err(err) => {
                log_failure!(
                    FAILURES,
                    err,
                    "cannot fire the schedules; trying again every second"
                );
                RELOAD
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Fire every schedule due now; how long until the next instant (at most [`RELOAD`]).
async fn look(pool: &Pool, warned: &mut HashSet<(String, String)>) -> Result<Duration, DbError> {
    if warned.len() > 10_000 {
        warned.clear();
    }
    let client = pool.get().await?;
    let (schedules, now) = client.bounded(store::list_to_fire(&client)).await?;
    let mut wait = RELOAD;
    for schedule in &schedules {
        if schedule.paused {
            continue;
        }
        match client.bounded(fire_one(&client, schedule, now)).await {
            Ok(()) => {}
            Err(FireError::Rule(reason)) => {
                let definition =
                    format!("{:?} {:?} {}", schedule.cron, schedule.every, schedule.tz);
                if warned.insert((schedule.name.clone(), definition)) {
                    tracing::warn!(schedule = %schedule.name, %reason, "schedule not fired: its rule cannot be read");
                }
            }
            Err(FireError::Db(err)) if err.is_unavailable() => return Err(err),
            // This schedule's fire was refused (a trigger or a constraint of the site's
            // refused its task, say): the others fire all the same.
            Err(FireError::Db(err)) => {
                if warned.insert((schedule.name.clone(), err.to_string())) {
                    tracing::warn!(schedule = %schedule.name, error = %err, "schedule not fired: the database refused its fire; trying again at each look");
                }
            }
        }
        if let Some(next) = schedule.next_fire {
            let until = (next - now).to_std().unwrap_or(Duration::ZERO);
            wait = wait.min(until);
        }
    }
    Ok(wait)
}

async fn fire_one(
    client: &tokio_postgres::Client,
    schedule: &store::Schedule,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), FireError> {
    match store::fire_due(client, schedule, now).await? {
        Some(Fired::Made(ids)) => {
            tracing::debug!(schedule = %schedule.name, tasks = ?ids, "schedule fired");
        }
        Some(Fired::Overlap) => tracing::info!(
            schedule = %schedule.name,
            task = schedule.last_task,
            "schedule fire passed over: the previous fire's task is still queued or running (no_overlap)"
        ),
        Some(Fired::Moved) | None => {}
    }
    Ok(())
}

impl crate::db::Outage for FireError {
    fn is_outage(&self) -> bool {
        matches!(self, FireError::Db(err) if err.is_unavailable())
    }
}
