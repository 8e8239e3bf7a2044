//! The scheduler: every daemon looks at every schedule when its next instant comes (and at
//! least once a second, to see schedules added, changed, paused or fired by another daemon),
//! and fires what is due through `pgtaskd.fire_schedule`, which lets exactly one daemon make
//! each fire (docs/schedules.md, "No leader"). The instants are compared with the database's
//! clock, read with the schedules, so that daemons whose clocks disagree agree on what is due.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::db::{DbError, Pool};
use crate::repeats::{log_failure, log_recovery, Repeats};
use crate::schedule::store::{self, Fired, Schedule};
use crate::schedule::{plan, Plan, Rule};

/// The looks that failed since the last that did: an outage said once, not once a second.
static FAILURES: Repeats = Repeats::new();

/// The longest time between two looks: a schedule added, changed or resumed is seen within it.
const RELOAD: Duration = Duration::from_secs(1);

/// What the looks learned of one schedule, kept from one look to the next, so that a look
/// reads a rule again only when its definition changed, and computes the instants again
/// only when the schedule fired, moved or reached the instant found last time. A cron rule
/// of no date costs the parser tens of milliseconds to refuse, one that fires every few
/// years a few: read at every look, a thousand of them took a daemon's thread for seconds.
struct Known {
    /// The cron expression, the period and the zone the rule was read from.
    definition: (Option<String>, Option<Duration>, String),
    rule: Result<Rule, String>,
    /// Nothing was due after `.0` (the schedule's base, [`Schedule::base`]) up to the look,
    /// and `.1` is its first instant after the look (`None`: it never fires again).
    quiet: Option<(DateTime<Utc>, Option<DateTime<Utc>>)>,
}

impl Known {
    fn definition(schedule: &Schedule) -> (Option<String>, Option<Duration>, String) {
        (
            schedule.cron.clone(),
            schedule.every_duration,
            schedule.tz.clone(),
        )
    }

    /// Whether nothing of `schedule` is due at `now`, as far as the last look knew.
    fn quiet_at(&self, schedule: &Schedule, now: DateTime<Utc>) -> bool {
        matches!(self.quiet, Some((base, next))
            if base == schedule.base() && next.is_none_or(|next| next > now))
    }
}

/// Look at the schedules until `stop` fires.
pub async fn run(pool: Pool, stop: CancellationToken) {
    // The schedules whose rule the daemons cannot read, warned about once per definition, and
    // those whose fire the database refused, once per error.
    let mut warned: HashSet<(String, String)> = HashSet::new();
    let mut known: HashMap<String, Known> = HashMap::new();
    loop {
        let looked = tokio::select! {
            _ = stop.cancelled() => return,
            looked = look(&pool, &mut known, &mut warned) => looked,
        };
        let wait = match looked {
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
async fn look(
    pool: &Pool,
    known: &mut HashMap<String, Known>,
    warned: &mut HashSet<(String, String)>,
) -> Result<Duration, DbError> {
    if warned.len() > 10_000 {
        warned.clear();
    }
    let (schedules, now) = {
        let client = pool.get().await?;
        client.bounded(store::list_to_fire(&client)).await?
    };
    // Only the schedules of this look are kept: one removed is forgotten.
    let mut before = std::mem::take(known);
    let mut wait = RELOAD;
    let mut due = Vec::new();
    for schedule in schedules {
        if schedule.paused {
            continue;
        }
        let definition = Known::definition(&schedule);
        let kept = before
            .remove(&schedule.name)
            .filter(|kept| kept.definition == definition);
        match kept {
            Some(kept) if kept.quiet_at(&schedule, now) => {
                if let Some((_, Some(next))) = kept.quiet {
                    wait = wait.min(until(next, now));
                }
                known.insert(schedule.name.clone(), kept);
            }
            kept => due.push((schedule, definition, kept.map(|kept| kept.rule))),
        }
    }
    let client = pool.get().await?;
    for (schedule, definition, rule) in due {
        // Read and planned on a blocking thread, one schedule at a time: the daemon's claims
        // and heartbeats go on meanwhile, and a stop waits for one schedule at most.
        let (rule, planned) = tokio::task::spawn_blocking({
            let schedule = schedule.clone();
            move || {
                let rule = rule.unwrap_or_else(|| schedule.rule());
                let planned = rule
                    .as_ref()
                    .ok()
                    .map(|rule| plan(rule, schedule.missed_rule(), schedule.base(), now));
                (rule, planned)
            }
        })
        .await
        .unwrap_or_else(|panicked| (Err(format!("reading the rule failed: {panicked}")), None));
        let quiet = match (&rule, planned) {
            (Err(reason), _) => {
                let definition =
                    format!("{:?} {:?} {}", schedule.cron, schedule.every, schedule.tz);
                if warned.insert((schedule.name.clone(), definition)) {
                    tracing::warn!(schedule = %schedule.name, %reason, "schedule not fired: its rule cannot be read");
                }
                None
            }
            (Ok(_), Some(planned)) => {
                if let Some(next) = planned.next {
                    wait = wait.min(until(next, now));
                }
                match client.bounded(fire(&client, &schedule, &planned)).await {
                    Ok(()) => {}
                    Err(err) if err.is_unavailable() => return Err(err),
                    // This schedule's fire was refused (a trigger or a constraint of the
                    // site's refused its task, say): the others fire all the same.
                    Err(err) => {
                        if warned.insert((schedule.name.clone(), err.to_string())) {
                            tracing::warn!(schedule = %schedule.name, error = %err, "schedule not fired: the database refused its fire; trying again at each look");
                        }
                    }
                }
                // Nothing was due: until its next instant, or until it fires or moves, the
                // next looks need not plan it again.
                planned
                    .up_to
                    .is_none()
                    .then(|| (schedule.base(), planned.next))
            }
            (Ok(_), None) => None,
        };
        known.insert(
            schedule.name.clone(),
            Known {
                definition,
                rule,
                quiet,
            },
        );
    }
    Ok(wait)
}

/// How long from `now` until `next` (nothing, when it has passed).
fn until(next: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (next - now).to_std().unwrap_or(Duration::ZERO)
}

async fn fire(
    client: &tokio_postgres::Client,
    schedule: &Schedule,
    planned: &Plan,
) -> Result<(), DbError> {
    match store::fire_planned(client, schedule, planned).await? {
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
