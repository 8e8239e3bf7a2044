//! The table `pgtaskd.schedules` (schema 31): read, put, remove, pause and resume through its
//! SQL functions, and fire (`pgtaskd.fire_schedule`, the compare-and-set on the last fire
//! that makes each fire's task exactly once whatever the number of daemons).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};

use super::{Missed, Plan, Rule};
use crate::db::DbError;

/// One schedule as the table holds it, with when it fires next (by the database's clock at
/// the read), as `schedule list --json` and `GET /schedules` give it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    pub name: String,
    /// The cron expression, or `null` for an `every` schedule.
    pub cron: Option<String>,
    /// The period, as `1m 30s` (humantime), or `null` for a cron schedule.
    pub every: Option<String>,
    #[serde(skip)]
    pub every_duration: Option<Duration>,
    pub tz: String,
    pub queue: String,
    pub payload: String,
    pub priority: i16,
    /// `coalesce`, `skip` or `catch-up`.
    pub missed: String,
    pub no_overlap: bool,
    pub paused: bool,
    /// When the definition took effect: no fire is before it.
    pub since: DateTime<Utc>,
    pub last_fire: Option<DateTime<Utc>>,
    pub last_task: Option<i64>,
    pub created_at: DateTime<Utc>,
    /// The next instant it fires at, unless paused or its rule is invalid.
    pub next_fire: Option<DateTime<Utc>>,
    /// Why the daemons cannot fire it (a cron expression or zone written by hand that they
    /// cannot read).
    pub error: Option<String>,
}

impl Schedule {
    /// Its rule, or why it has none.
    ///
    /// # Errors
    ///
    /// The words of [`super::RuleError`].
    pub fn rule(&self) -> Result<Rule, String> {
        Rule::new(self.cron.as_deref(), self.every_duration, &self.tz).map_err(|e| e.to_string())
    }

    /// How it treats missed fires (`coalesce` for a value the table's constraint refuses).
    pub fn missed_rule(&self) -> Missed {
        self.missed.parse().unwrap_or(Missed::Coalesce)
    }

    /// Where its instants are counted from: its last fire, or when its definition took
    /// effect, whichever is later.
    pub fn base(&self) -> DateTime<Utc> {
        self.last_fire
            .map_or(self.since, |last| last.max(self.since))
    }

    /// The schedule of a row, its rule not yet read ([`Schedule::judged`] reads it).
    fn from_row(row: &Row) -> Schedule {
        let every_s: Option<i64> = row.get("every_s");
        let every_duration = every_s.map(|s| Duration::from_secs(s.max(0) as u64));
        Schedule {
            name: row.get("name"),
            cron: row.get("cron"),
            every: every_duration.map(|d| humantime::format_duration(d).to_string()),
            every_duration,
            tz: row.get("tz"),
            queue: row.get("queue"),
            payload: row.get("payload"),
            priority: row.get("priority"),
            missed: row.get("missed"),
            no_overlap: row.get("no_overlap"),
            paused: row.get("paused"),
            since: row.get("since"),
            last_fire: row.get("last_fire"),
            last_task: row.get("last_task"),
            created_at: row.get("created_at"),
            next_fire: None,
            error: None,
        }
    }

    /// With its next fire after `now`, or why its rule cannot be read. A cron rule of no date
    /// costs the parser tens of milliseconds to refuse, and one that fires every few years a
    /// few: call it off the runtime's threads ([`judge_all`]).
    fn judged(mut self, now: DateTime<Utc>) -> Schedule {
        match self.rule() {
            Ok(rule) if !self.paused => {
                self.next_fire = rule.next_after(now.max(self.base()));
            }
            Ok(_) => {}
            Err(err) => self.error = Some(err),
        }
        self
    }
}

/// [`Schedule::judged`] of each, on a blocking thread: a list of a thousand schedules of rare
/// rules must not hold up the daemon's claims and heartbeats.
async fn judge_all(schedules: Vec<Schedule>, now: DateTime<Utc>) -> Vec<Schedule> {
    let work = tokio::task::spawn_blocking(move || {
        schedules
            .into_iter()
            .map(|schedule| schedule.judged(now))
            .collect()
    });
    // The work panicking is a bug of the rule's parser: the list is then empty, not an
    // answer that never comes.
    work.await.unwrap_or_default()
}

/// The columns of a [`Schedule`], with `$payload` for the payload.
macro_rules! columns {
    ($payload:literal) => {
        concat!(
            "name, cron, extract(epoch FROM every)::bigint AS every_s, tz, queue, ",
            $payload,
            ", priority, missed, no_overlap, paused, since, last_fire, last_task, created_at"
        )
    };
}

const COLUMNS: &str = columns!("payload");

/// Every schedule, by name, with `$payload` for the payload, and the database's clock (one
/// row of nulls but the clock when there is none).
macro_rules! every_schedule {
    ($payload:literal) => {
        concat!(
            "SELECT ",
            columns!($payload),
            ", clock_timestamp() AS now FROM pgtaskd.schedules \
             RIGHT JOIN (SELECT) AS always ON true ORDER BY name"
        )
    };
}

/// Every schedule, by name, and the database's clock at the read.
///
/// # Errors
///
/// Database failures.
pub async fn list(client: &Client) -> Result<(Vec<Schedule>, DateTime<Utc>), DbError> {
    let (schedules, now) = read_all(client, every_schedule!("payload")).await?;
    Ok((judge_all(schedules, now).await, now))
}

/// Every schedule as [`list`] reads it, but without its payload, which a firer does not need
/// (`pgtaskd.fire_schedule` reads it from the row), and with its rule not yet read (the
/// scheduler keeps what it read of each from one look to the next): what the scheduler reads
/// once a second.
///
/// # Errors
///
/// Database failures.
pub async fn list_to_fire(client: &Client) -> Result<(Vec<Schedule>, DateTime<Utc>), DbError> {
    read_all(client, every_schedule!("''::text AS payload")).await
}

async fn read_all(client: &Client, sql: &str) -> Result<(Vec<Schedule>, DateTime<Utc>), DbError> {
    let rows = client.query_typed(sql, &[]).await?;
    let now: DateTime<Utc> = rows.first().map_or_else(Utc::now, |row| row.get("now"));
    let schedules = rows
        .iter()
        .filter(|row| row.get::<_, Option<String>>("name").is_some())
        .map(Schedule::from_row)
        .collect();
    Ok((schedules, now))
}

/// Schedule `name`, or `None`.
///
/// # Errors
///
/// Database failures.
pub async fn get(client: &Client, name: &str) -> Result<Option<Schedule>, DbError> {
    let sql = format!(
        "SELECT {COLUMNS}, clock_timestamp() AS now FROM pgtaskd.schedules WHERE name = $1"
    );
    let row = client.query_typed_opt(&sql, &[(&name, Type::TEXT)]).await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let now = row.get("now");
    Ok(judge_all(vec![Schedule::from_row(&row)], now).await.pop())
}

/// A schedule's definition, checked ([`NewSchedule::check`]) before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSchedule {
    pub name: String,
    pub cron: Option<String>,
    pub every: Option<Duration>,
    pub tz: String,
    pub queue: String,
    pub payload: String,
    pub priority: i16,
    pub missed: Missed,
    pub no_overlap: bool,
    /// Pause or resume it; `None` keeps its state (a new one is not paused).
    pub paused: Option<bool>,
}

/// The largest payload of a schedule: every daemon reads the schedules once a second.
pub const MAX_SCHEDULE_PAYLOAD: usize = 64 * 1024;

impl NewSchedule {
    /// Everything the table and the daemons will refuse, in words.
    ///
    /// # Errors
    ///
    /// The first thing wrong.
    pub fn check(&self) -> Result<(), String> {
        super::check_name(&self.name)?;
        Rule::new(self.cron.as_deref(), self.every, &self.tz).map_err(|e| e.to_string())?;
        crate::queue::enqueue::check_queue_name(&self.queue).map_err(|e| e.to_string())?;
        crate::queue::enqueue::check_payload(&self.payload).map_err(|e| e.to_string())?;
        if self.payload.len() > MAX_SCHEDULE_PAYLOAD {
            return Err(format!(
                "a schedule's payload is at most {MAX_SCHEDULE_PAYLOAD} bytes, not {} (every daemon reads the schedules once a second: put large input where the task can fetch it)",
                self.payload.len()
            ));
        }
        Ok(())
    }
}

/// Add or replace a schedule (its fires count from now on); true when it is new.
///
/// # Errors
///
/// Database failures, a refusal of the table's constraints among them.
pub async fn put(client: &Client, schedule: &NewSchedule) -> Result<bool, DbError> {
    let every_s = schedule.every.map(|every| every.as_secs() as i64);
    let missed = schedule.missed.as_str();
    let row = client
        .query_typed_one(
            "SELECT pgtaskd.put_schedule($1, $2, $3 * interval '1 second', $4, $5, $6, $7, $8, $9, $10)",
            &[
                (&schedule.name, Type::TEXT),
                (&schedule.cron, Type::TEXT),
                (&every_s, Type::INT8),
                (&schedule.payload, Type::TEXT),
                (&schedule.queue, Type::TEXT),
                (&schedule.tz, Type::TEXT),
                (&missed, Type::TEXT),
                (&schedule.no_overlap, Type::BOOL),
                (&schedule.priority, Type::INT2),
                (&schedule.paused, Type::BOOL),
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// Remove schedule `name`; false when there is none.
///
/// # Errors
///
/// Database failures.
pub async fn remove(client: &Client, name: &str) -> Result<bool, DbError> {
    let row = client
        .query_typed_one("SELECT pgtaskd.remove_schedule($1)", &[(&name, Type::TEXT)])
        .await?;
    Ok(row.get(0))
}

/// Pause or resume schedule `name` (resumed, it fires from now on); false when there is none.
///
/// # Errors
///
/// Database failures.
pub async fn set_paused(client: &Client, name: &str, paused: bool) -> Result<bool, DbError> {
    let row = client
        .query_typed_one(
            "SELECT pgtaskd.pause_schedule($1, $2)",
            &[(&name, Type::TEXT), (&paused, Type::BOOL)],
        )
        .await?;
    Ok(row.get(0))
}

/// What a fire came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// The fire is this daemon's: these tasks were made (none for a `skip`, or for instants
    /// whose tasks existed already).
    Made(Vec<i64>),
    /// The previous fire's task is still QUEUED or RUNNING (`no_overlap`): none was made.
    Overlap,
    /// Another daemon fired first, or the schedule changed: read it again.
    Moved,
}

/// Fire what `plan` (of one look at `schedule`) says is due: `None` when nothing is.
///
/// # Errors
///
/// Database failures.
pub async fn fire_planned(
    client: &Client,
    schedule: &Schedule,
    plan: &Plan,
) -> Result<Option<Fired>, DbError> {
    let Some(up_to) = plan.up_to else {
        return Ok(None);
    };
    Ok(Some(
        fire(
            client,
            &schedule.name,
            Previous {
                last_fire: schedule.last_fire,
                since: schedule.since,
            },
            &plan.fires,
            up_to,
        )
        .await?,
    ))
}

/// What a firer read of a schedule: its last fire and when its definition took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Previous {
    pub last_fire: Option<DateTime<Utc>>,
    pub since: DateTime<Utc>,
}

/// Move schedule `name`'s last fire from `previous` to `up_to`, making a task at each of
/// `fires`, if no one moved it or changed its definition meanwhile.
///
/// # Errors
///
/// Database failures.
pub async fn fire(
    client: &Client,
    name: &str,
    previous: Previous,
    fires: &[DateTime<Utc>],
    up_to: DateTime<Utc>,
) -> Result<Fired, DbError> {
    let row = client
        .query_typed_one(
            "SELECT outcome, task_ids FROM pgtaskd.fire_schedule($1, $2, $3, $4, $5)",
            &[
                (&name, Type::TEXT),
                (&previous.last_fire, Type::TIMESTAMPTZ),
                (&previous.since, Type::TIMESTAMPTZ),
                (&fires, Type::TIMESTAMPTZ_ARRAY),
                (&up_to, Type::TIMESTAMPTZ),
            ],
        )
        .await?;
    let outcome: String = row.get(0);
    Ok(match outcome.as_str() {
        "fired" => Fired::Made(row.get::<_, Option<Vec<i64>>>(1).unwrap_or_default()),
        "overlap" => Fired::Overlap,
        _ => Fired::Moved,
    })
}
