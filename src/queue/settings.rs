//! A queue's limits and defaults (docs/limits.md): the row of `pgtaskd.queue_settings` that
//! every claim reads, written through `pgtaskd.set_queue(queue, settings jsonb)` (schema 33),
//! which merges the keys given, removes those given as JSON null, deletes a row left with
//! none and wakes the daemons. Used by `pgtaskd queue set|show`, `GET` and `PUT
//! /queues/{queue}/settings` and the statistics.
//!
//! It also owns what a setting may be, checked before any statement by the CLI and the HTTP
//! API alike, so that each refuses the same input with the same words: counts of at least 1
//! ([`check_count`]), a rate of 1 to 1,000,000 starts per period of 1 ms to 1 day
//! ([`parse_rate`]), a `retain` of at least a second. The table's constraints
//! (`queue_settings_*` in sql/0033_queue_limits.sql) hold the same rules for every other
//! writer.
//!
//! Durations are written and read as the CLI's ("1s", "500ms", "30days": humantime's), never
//! as PostgreSQL's interval text, so that what `GET` answers can be sent back as it is.

use std::time::Duration;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};

use crate::db::DbError;

/// The most starts a rate allows per period (the table's `queue_settings_rate`).
pub const MAX_RATE_LIMIT: i64 = 1_000_000;

/// The shortest and the longest period of a rate.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(24 * 3600);

/// The shortest `retain`.
pub const MIN_RETAIN: Duration = Duration::from_secs(1);

/// The keys of `pgtaskd.set_queue`, in the order they are shown.
pub const KEYS: [&str; 6] = [
    "max_running",
    "max_running_per_key",
    "rate_limit",
    "rate_period",
    "max_attempts",
    "retain",
];

/// Why a setting cannot be used; the same words for the CLI (exit 2) and the HTTP API (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSetting {
    #[error("{0} must be an integer from 1 to {max}, or none to remove it", max = i32::MAX)]
    Count(&'static str),
    #[error("the rate {0:?} must be N/DURATION, N from 1 to {MAX_RATE_LIMIT} starts in a period of 1ms to 1day (\"10/1s\"), or none to remove it")]
    Rate(String),
    #[error("rate_limit must be an integer from 1 to {MAX_RATE_LIMIT}")]
    RateLimit,
    #[error("rate_period {0:?} must be a duration from 1ms to 1day, such as \"1s\" or \"500ms\"")]
    RatePeriod(String),
    #[error("rate_limit and rate_period are set together, and removed together")]
    RateHalf,
    #[error(
        "retain {0:?} must be a duration of at least 1s, such as \"30days\", or none to remove it"
    )]
    Retain(String),
    #[error("unknown setting {0:?}: the settings are max_running, max_running_per_key, rate_limit with rate_period, max_attempts and retain")]
    Unknown(String),
    #[error("no setting given: name at least one of max_running, max_running_per_key, rate_limit with rate_period, max_attempts and retain")]
    Nothing,
}

/// One setting of a change: set to a value, or removed. A setting a change does not name
/// stays as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting<T> {
    Set(T),
    Remove,
}

/// What `pgtaskd queue set` and `PUT /queues/{queue}/settings` change; `None` keeps a setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub max_running: Option<Setting<i32>>,
    pub max_running_per_key: Option<Setting<i32>>,
    /// The most starts, and the period they are counted in.
    pub rate: Option<Setting<(i32, Duration)>>,
    pub max_attempts: Option<Setting<i32>>,
    pub retain: Option<Setting<Duration>>,
}

/// A count setting (`max_running`, `max_running_per_key`, `max_attempts`): 1 to `i32::MAX`.
///
/// # Errors
///
/// [`BadSetting::Count`] naming `name`.
pub fn check_count(name: &'static str, n: i64) -> Result<i32, BadSetting> {
    i32::try_from(n)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or(BadSetting::Count(name))
}

/// A rate's number of starts: 1 to [`MAX_RATE_LIMIT`].
fn check_rate_limit(n: i64) -> Result<i32, BadSetting> {
    if (1..=MAX_RATE_LIMIT).contains(&n) {
        Ok(n as i32)
    } else {
        Err(BadSetting::RateLimit)
    }
}

/// A rate's period: a duration of [`MIN_RATE_PERIOD`] to [`MAX_RATE_PERIOD`].
fn parse_rate_period(text: &str) -> Result<Duration, BadSetting> {
    humantime::parse_duration(text.trim())
        .ok()
        .filter(|d| (MIN_RATE_PERIOD..=MAX_RATE_PERIOD).contains(d))
        .ok_or_else(|| BadSetting::RatePeriod(text.to_string()))
}

/// `--rate N/DURATION`: at most N starts in any window of DURATION, such as "10/1s".
///
/// # Errors
///
/// [`BadSetting::Rate`] for anything else: no period, N out of 1 to 1,000,000, a period
/// outside 1 ms to 1 day.
pub fn parse_rate(text: &str) -> Result<(i32, Duration), BadSetting> {
    let bad = || BadSetting::Rate(text.to_string());
    let (n, period) = text.split_once('/').ok_or_else(bad)?;
    let n = n.trim().parse::<i64>().map_err(|_| bad())?;
    let n = check_rate_limit(n).map_err(|_| bad())?;
    let period = parse_rate_period(period).map_err(|_| bad())?;
    Ok((n, period))
}

/// A `retain`: a duration of at least [`MIN_RETAIN`], at most 100 years.
///
/// # Errors
///
/// [`BadSetting::Retain`].
pub fn parse_retain(text: &str) -> Result<Duration, BadSetting> {
    humantime::parse_duration(text.trim())
        .ok()
        .filter(|d| *d >= MIN_RETAIN && *d <= crate::config::DURATION_MAX)
        .ok_or_else(|| BadSetting::Retain(text.to_string()))
}

impl Change {
    /// Whether it names no setting.
    pub fn is_empty(&self) -> bool {
        *self == Change::default()
    }

    /// The change a JSON object asks for, with the keys of `pgtaskd.set_queue`: a JSON null
    /// removes a setting; `rate_limit` and `rate_period` come together; a duration is
    /// written as the CLI takes it ("1s", "500ms", "30days").
    ///
    /// # Errors
    ///
    /// The first key or value that cannot be used; an object naming nothing.
    pub fn from_json(object: &Map<String, Value>) -> Result<Change, BadSetting> {
        if let Some(unknown) = object.keys().find(|key| !KEYS.contains(&key.as_str())) {
            return Err(BadSetting::Unknown(unknown.clone()));
        }
        let count = |name: &'static str| -> Result<Option<Setting<i32>>, BadSetting> {
            match object.get(name) {
                None => Ok(None),
                Some(Value::Null) => Ok(Some(Setting::Remove)),
                Some(value) => {
                    let n = value.as_i64().ok_or(BadSetting::Count(name))?;
                    Ok(Some(Setting::Set(check_count(name, n)?)))
                }
            }
        };
        let rate = match (object.get("rate_limit"), object.get("rate_period")) {
            (None, None) => None,
            (Some(Value::Null), Some(Value::Null)) => Some(Setting::Remove),
            (Some(limit), Some(period)) if !limit.is_null() && !period.is_null() => {
                let limit = limit
                    .as_i64()
                    .ok_or(BadSetting::RateLimit)
                    .and_then(check_rate_limit)?;
                let period = match period {
                    Value::String(text) => parse_rate_period(text)?,
                    other => return Err(BadSetting::RatePeriod(other.to_string())),
                };
                Some(Setting::Set((limit, period)))
            }
            _ => return Err(BadSetting::RateHalf),
        };
        let retain = match object.get("retain") {
            None => None,
            Some(Value::Null) => Some(Setting::Remove),
            Some(Value::String(text)) => Some(Setting::Set(parse_retain(text)?)),
            Some(other) => return Err(BadSetting::Retain(other.to_string())),
        };
        let change = Change {
            max_running: count("max_running")?,
            max_running_per_key: count("max_running_per_key")?,
            rate,
            max_attempts: count("max_attempts")?,
            retain,
        };
        if change.is_empty() {
            return Err(BadSetting::Nothing);
        }
        Ok(change)
    }

    /// The JSON object `pgtaskd.set_queue` takes: the settings named, a removed one as null,
    /// a duration as an interval of whole days and microseconds.
    pub fn to_set_queue_json(&self) -> Value {
        // Whole days as days, as PostgreSQL shows a `retain` of "30d": "30 days".
        fn interval(duration: Duration) -> Value {
            let micros = duration.as_micros();
            let day = 86_400_000_000;
            Value::String(match (micros / day, micros % day) {
                (0, rest) => format!("{rest} microseconds"),
                (days, 0) => format!("{days} days"),
                (days, rest) => format!("{days} days {rest} microseconds"),
            })
        }
        fn put<T>(
            object: &mut Map<String, Value>,
            name: &str,
            setting: Option<Setting<T>>,
            value: impl Fn(T) -> Value,
        ) {
            match setting {
                None => {}
                Some(Setting::Remove) => {
                    object.insert(name.to_string(), Value::Null);
                }
                Some(Setting::Set(v)) => {
                    object.insert(name.to_string(), value(v));
                }
            }
        }
        let mut object = Map::new();
        put(&mut object, "max_running", self.max_running, Value::from);
        put(
            &mut object,
            "max_running_per_key",
            self.max_running_per_key,
            Value::from,
        );
        put(
            &mut object,
            "rate_limit",
            self.rate.map(|s| match s {
                Setting::Set((n, _)) => Setting::Set(n),
                Setting::Remove => Setting::Remove,
            }),
            Value::from,
        );
        put(
            &mut object,
            "rate_period",
            self.rate.map(|s| match s {
                Setting::Set((_, period)) => Setting::Set(period),
                Setting::Remove => Setting::Remove,
            }),
            interval,
        );
        put(&mut object, "max_attempts", self.max_attempts, Value::from);
        put(&mut object, "retain", self.retain, interval);
        Value::Object(object)
    }
}

/// A queue's settings in force; every one unset (`null`) for a queue without any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub max_running: Option<i32>,
    pub max_running_per_key: Option<i32>,
    pub rate_limit: Option<i32>,
    #[serde(serialize_with = "duration_text")]
    pub rate_period: Option<Duration>,
    pub max_attempts: Option<i32>,
    #[serde(serialize_with = "duration_text")]
    pub retain: Option<Duration>,
}

/// A duration as the CLI takes it ("1s", "500ms", "30days").
#[allow(clippy::ref_option)]
fn duration_text<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(duration) => {
            serializer.serialize_str(&humantime::format_duration(*duration).to_string())
        }
        None => serializer.serialize_none(),
    }
}

impl Limits {
    /// Whether no setting is in force.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The settings on one line, as `stats` and `queue show` print them: "running 2, per key
    /// 1, rate 10/1s, attempts 10, retain 30days", or "-" for none.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.max_running {
            parts.push(format!("running {n}"));
        }
        if let Some(n) = self.max_running_per_key {
            parts.push(format!("per key {n}"));
        }
        if let (Some(n), Some(period)) = (self.rate_limit, self.rate_period) {
            parts.push(format!("rate {n}/{}", humantime::format_duration(period)));
        }
        if let Some(n) = self.max_attempts {
            parts.push(format!("attempts {n}"));
        }
        if let Some(retain) = self.retain {
            parts.push(format!("retain {}", humantime::format_duration(retain)));
        }
        if parts.is_empty() {
            "-".to_string()
        } else {
            parts.join(", ")
        }
    }

    /// The settings of a row holding the columns of [`limits_columns!`].
    pub(crate) fn from_row(row: &Row) -> Limits {
        let duration = |name: &str| {
            row.get::<_, Option<i64>>(name)
                .map(|us| Duration::from_micros(us.max(0).unsigned_abs()))
        };
        Limits {
            max_running: row.get("max_running"),
            max_running_per_key: row.get("max_running_per_key"),
            rate_limit: row.get("rate_limit"),
            rate_period: duration("rate_period_us"),
            max_attempts: row.get("max_attempts"),
            retain: duration("retain_us"),
        }
    }
}

/// The columns [`Limits::from_row`] reads, of `pgtaskd.queue_settings` as `$alias`: the
/// intervals in whole microseconds (a month is 30 days, as PostgreSQL counts it).
macro_rules! limits_columns {
    ($alias:literal) => {
        concat!(
            $alias,
            ".max_running, ",
            $alias,
            ".max_running_per_key, ",
            $alias,
            ".rate_limit, ",
            "(extract(epoch FROM ",
            $alias,
            ".rate_period) * 1000000)::int8 AS rate_period_us, ",
            $alias,
            ".max_attempts, ",
            "(extract(epoch FROM ",
            $alias,
            ".retain) * 1000000)::int8 AS retain_us"
        )
    };
}
pub(crate) use limits_columns;

/// A queue's settings, as `GET /queues/{queue}/settings` and `pgtaskd queue set` answer them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueSettings {
    pub queue: String,
    #[serde(flatten)]
    pub limits: Limits,
}

/// A queue's settings and its tasks now, as `pgtaskd queue show` prints them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shown {
    pub queue: String,
    #[serde(flatten)]
    pub limits: Limits,
    /// Its RUNNING tasks now.
    pub running: i64,
    /// Its QUEUED tasks now, due or not.
    pub queued: i64,
}

/// Set the settings `change` names through `pgtaskd.set_queue`, and read what is in force
/// after it, in the same statement. The function's answer is read back through its interval
/// text, in the session that wrote it.
const SET: &str = concat!(
    "WITH answer AS (SELECT pgtaskd.set_queue($1, $2::text::jsonb) AS j)
SELECT ",
    limits_columns!("s"),
    "
  FROM answer,
       LATERAL (SELECT (j ->> 'max_running')::int AS max_running,
                       (j ->> 'max_running_per_key')::int AS max_running_per_key,
                       (j ->> 'rate_limit')::int AS rate_limit,
                       (j ->> 'rate_period')::interval AS rate_period,
                       (j ->> 'max_attempts')::int AS max_attempts,
                       (j ->> 'retain')::interval AS retain) AS s"
);

/// Apply `change` to `queue`'s settings (a queue left with none loses its row) and wake every
/// daemon; answers the settings in force.
///
/// # Errors
///
/// Database failures, among them a role without EXECUTE on `pgtaskd.set_queue` (a producer).
pub async fn set(client: &Client, queue: &str, change: &Change) -> Result<QueueSettings, DbError> {
    let json = change.to_set_queue_json().to_string();
    let row = client
        .query_typed_one(SET, &[(&queue, Type::TEXT), (&json, Type::TEXT)])
        .await?;
    Ok(QueueSettings {
        queue: queue.to_string(),
        limits: Limits::from_row(&row),
    })
}

const GET: &str = concat!(
    "SELECT ",
    limits_columns!("s"),
    " FROM pgtaskd.queue_settings AS s WHERE s.queue = $1"
);

/// `queue`'s settings; every one unset for a queue without any (a queue need not exist to
/// have settings, nor to be asked).
///
/// # Errors
///
/// Database failures.
pub async fn get(client: &Client, queue: &str) -> Result<QueueSettings, DbError> {
    let row = client.query_typed_opt(GET, &[(&queue, Type::TEXT)]).await?;
    Ok(QueueSettings {
        queue: queue.to_string(),
        limits: row.as_ref().map(Limits::from_row).unwrap_or_default(),
    })
}

/// The settings, and the RUNNING and QUEUED tasks now, each count from its partial index.
const SHOW: &str = concat!(
    "SELECT ",
    limits_columns!("s"),
    ",
       (SELECT count(*) FROM pgtaskd.task_state AS t WHERE t.status = 'RUNNING' AND t.queue = $1) AS running,
       (SELECT count(*) FROM pgtaskd.task_state AS t WHERE t.status = 'QUEUED' AND t.queue = $1) AS queued
  FROM (SELECT) AS one
  LEFT JOIN pgtaskd.queue_settings AS s ON s.queue = $1"
);

/// `queue`'s settings and its RUNNING and QUEUED tasks now, in one statement.
///
/// # Errors
///
/// Database failures.
pub async fn show(client: &Client, queue: &str) -> Result<Shown, DbError> {
    let row = client
        .query_typed_one(SHOW, &[(&queue, Type::TEXT)])
        .await?;
    Ok(Shown {
        queue: queue.to_string(),
        limits: Limits::from_row(&row),
        running: row.get("running"),
        queued: row.get("queued"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_n_per_a_period_of_one_ms_to_one_day() {
        assert_eq!(parse_rate("10/1s"), Ok((10, Duration::from_secs(1))));
        assert_eq!(parse_rate("1/500ms"), Ok((1, Duration::from_millis(500))));
        assert_eq!(parse_rate("1000000/1day"), Ok((1_000_000, MAX_RATE_PERIOD)));
        assert_eq!(parse_rate("5/1ms"), Ok((5, MIN_RATE_PERIOD)));
        for bad in [
            "10",
            "0/1s",
            "-1/1s",
            "10/",
            "/1s",
            "10/0s",
            "10/1us",
            "10/25h",
            "1000001/1s",
            "x/1s",
            "10/soon",
        ] {
            assert_eq!(
                parse_rate(bad),
                Err(BadSetting::Rate(bad.to_string())),
                "{bad}"
            );
        }
    }

    #[test]
    fn counts_are_one_to_i32_max() {
        assert_eq!(check_count("max_running", 1), Ok(1));
        assert_eq!(
            check_count("max_running", i64::from(i32::MAX)),
            Ok(i32::MAX)
        );
        for bad in [0, -1, 1 << 31] {
            assert_eq!(
                check_count("max_running", bad),
                Err(BadSetting::Count("max_running"))
            );
        }
        assert_eq!(parse_retain("30d"), Ok(Duration::from_secs(30 * 86400)));
        assert_eq!(parse_retain("30 days"), Ok(Duration::from_secs(30 * 86400)));
        assert_eq!(parse_rate("10/1 second"), Ok((10, Duration::from_secs(1))));
        assert!(parse_retain("500ms").is_err());
        assert!(parse_retain("forever").is_err());
    }

    #[test]
    fn a_json_change_names_the_keys_of_set_queue() {
        let object = |text: &str| serde_json::from_str::<Map<String, Value>>(text).unwrap();
        let change = Change::from_json(&object(
            r#"{"max_running": 2, "rate_limit": 10, "rate_period": "1s", "retain": null}"#,
        ))
        .unwrap();
        assert_eq!(change.max_running, Some(Setting::Set(2)));
        assert_eq!(
            change.rate,
            Some(Setting::Set((10, Duration::from_secs(1))))
        );
        assert_eq!(change.retain, Some(Setting::Remove));
        assert_eq!(change.max_attempts, None);
        assert_eq!(
            change.to_set_queue_json(),
            serde_json::json!({"max_running": 2, "rate_limit": 10,
                               "rate_period": "1000000 microseconds", "retain": null})
        );
        for (text, err) in [
            ("{}", BadSetting::Nothing),
            (
                r#"{"max_runing": 2}"#,
                BadSetting::Unknown("max_runing".into()),
            ),
            (r#"{"max_running": 0}"#, BadSetting::Count("max_running")),
            (r#"{"max_running": "2"}"#, BadSetting::Count("max_running")),
            (r#"{"max_running": 2.5}"#, BadSetting::Count("max_running")),
            (r#"{"rate_limit": 10}"#, BadSetting::RateHalf),
            (
                r#"{"rate_limit": 10, "rate_period": null}"#,
                BadSetting::RateHalf,
            ),
            (
                r#"{"rate_limit": 0, "rate_period": "1s"}"#,
                BadSetting::RateLimit,
            ),
            (
                r#"{"rate_limit": 1, "rate_period": "2days"}"#,
                BadSetting::RatePeriod("2days".into()),
            ),
            (r#"{"retain": 30}"#, BadSetting::Retain("30".into())),
        ] {
            assert_eq!(Change::from_json(&object(text)), Err(err), "{text}");
        }
        assert_eq!(
            Change::from_json(&object(r#"{"rate_limit": null, "rate_period": null}"#))
                .unwrap()
                .rate,
            Some(Setting::Remove)
        );
    }

    #[test]
    fn limits_are_described_on_one_line() {
        assert_eq!(Limits::default().describe(), "-");
        let limits = Limits {
            max_running: Some(2),
            max_running_per_key: Some(1),
            rate_limit: Some(10),
            rate_period: Some(Duration::from_secs(1)),
            max_attempts: Some(10),
            retain: Some(Duration::from_secs(30 * 86400)),
        };
        assert_eq!(
            limits.describe(),
            "running 2, per key 1, rate 10/1s, attempts 10, retain 30days"
        );
        let json = serde_json::to_value(&limits).unwrap();
        assert_eq!(json["rate_period"], "1s");
        assert_eq!(json["retain"], "30days");
        assert_eq!(
            serde_json::to_value(Limits::default()).unwrap()["retain"],
            Value::Null
        );
    }
}
