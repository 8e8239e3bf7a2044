//! A schedule's rule: a cron expression read in an IANA time zone, or a period of whole
//! seconds whose instants are its multiples since 1970 UTC; its instants, and what daylight
//! saving makes of a cron expression's wall-clock times (docs/schedules.md, "Rules",
//! "Daylight saving").

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use chrono::{
    DateTime, Datelike, LocalResult, NaiveDateTime, Offset, TimeDelta, TimeZone, Timelike, Utc,
};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// The longest cron expression, the longest zone name and the longest period kept.
pub const MAX_CRON: usize = 256;
pub const MAX_EVERY: Duration = Duration::from_secs(366 * 24 * 3600);

/// When a schedule fires.
#[derive(Debug, Clone)]
pub enum Rule {
    /// A cron expression, read in `tz`.
    Cron { cron: Box<Cron>, tz: chrono_tz::Tz },
    /// Every `seconds`, at its multiples since 1970 UTC.
    Every { seconds: i64 },
}

/// Why a rule cannot be used; each names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("a schedule takes --cron or --every, not both and not neither")]
    OneRule,
    #[error("invalid cron expression {expr:?}: {reason} (five fields, an optional leading seconds field, or @hourly, @daily, @weekly, @monthly, @yearly)")]
    Cron { expr: String, reason: String },
    #[error(
        "unknown time zone {0:?}: name an IANA zone such as UTC, Europe/Berlin or America/New_York"
    )]
    Zone(String),
    #[error("--every must be whole seconds from 1s to 366 days, not {0}")]
    Every(String),
    #[error("--tz applies to --cron only: an --every schedule fires at multiples of its period since 1970 UTC")]
    ZoneWithEvery,
    #[error("cron expression {0:?} never fires (no such date: a 31st of a 30-day month, a 30th of February...)")]
    Never(String),
}

impl Rule {
    /// The rule of a cron expression in zone `tz`, or of a period.
    ///
    /// # Errors
    ///
    /// [`RuleError`], naming what is wrong.
    pub fn new(cron: Option<&str>, every: Option<Duration>, tz: &str) -> Result<Rule, RuleError> {
        match (cron, every) {
            (Some(expr), None) => {
                let tz = zone(tz).ok_or_else(|| RuleError::Zone(tz.to_string()))?;
                let cron = parse_cron(expr)?;
                if !fires_at_all(expr, &cron) {
                    return Err(RuleError::Never(expr.to_string()));
                }
                Ok(Rule::Cron {
                    cron: Box::new(cron),
                    tz,
                })
            }
            (None, Some(every)) => {
                // Any name of UTC itself, in any case: the instants are multiples of the
                // period since 1970 UTC.
                if !zone(tz).is_some_and(|zone| UTC_NAMES.contains(&zone.name())) {
                    return Err(RuleError::ZoneWithEvery);
                }
                if every.subsec_nanos() != 0 || every < Duration::from_secs(1) || every > MAX_EVERY
                {
                    return Err(RuleError::Every(
                        humantime::format_duration(every).to_string(),
                    ));
                }
                Ok(Rule::Every {
                    seconds: every.as_secs() as i64,
                })
            }
            _ => Err(RuleError::OneRule),
        }
    }

    /// The first instant strictly after `t`, if the rule has one.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Rule::Cron { cron, tz } => {
                // Wall-clock occurrences from `t`'s own wall time on, each made an instant
                // ([`instant`]); one that is not after `t` (a time of the repeated hour
                // fired at its first pass) is passed over.
                let mut from = t.with_timezone(tz).naive_local();
                let mut inclusive = true;
                for _ in 0..MAX_STEPS {
                    let naive = cron.find_next_occurrence(&from, inclusive).ok()?;
                    let at = instant(tz, naive);
                    if at > t {
                        return Some(at);
                    }
                    from = naive;
                    inclusive = false;
                }
                None
            }
            Rule::Every { seconds } => {
                let k = t.timestamp().div_euclid(*seconds) + 1;
                DateTime::from_timestamp(k * seconds, 0)
            }
        }
    }

    /// The instants after `after` up to `up_to` (included), ascending: the latest `most` of
    /// them.
    pub fn between(
        &self,
        after: DateTime<Utc>,
        up_to: DateTime<Utc>,
        most: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut found: Vec<DateTime<Utc>> = Vec::new();
        if up_to <= after || most == 0 {
            return found;
        }
        match self {
            Rule::Cron { cron, tz } => {
                // How far the clocks went back from `from` to `to`, if they did.
                let went_back = |from: DateTime<Utc>, to: DateTime<Utc>| {
                    let offset = |at: DateTime<Utc>| {
                        tz.offset_from_utc_datetime(&at.naive_utc())
                            .fix()
                            .local_minus_utc()
                    };
                    TimeDelta::seconds(i64::from((offset(from) - offset(to)).max(0)))
                };
                // Backwards through the wall-clock occurrences. Right after the clocks went
                // back, an instant of the repeated hour's first pass has a wall time later
                // than `up_to`'s: start that much later.
                let mut from = up_to.with_timezone(tz).naive_local()
                    + went_back(up_to - TimeDelta::hours(3), up_to);
                // Instants after `after` have wall times from `after`'s less the clocks'
                // going back in between: within a day, at most the difference of the two
                // ends' offsets (no zone goes back and forth within a day); over a longer
                // span, any of its changes, each under 3 hours. A rule that fires every
                // second steps through that margin alone, not through 3 hours at each look.
                let margin = if up_to - after < TimeDelta::days(1) {
                    went_back(after, up_to)
                } else {
                    TimeDelta::hours(3)
                };
                let floor = after.with_timezone(tz).naive_local() - margin;
                let mut inclusive = true;
                for _ in 0..MAX_STEPS {
                    let Ok(naive) = cron.find_previous_occurrence(&from, inclusive) else {
                        break;
                    };
                    if naive < floor {
                        break;
                    }
                    let at = instant(tz, naive);
                    // Several wall times map to one instant in a skipped hour: once.
                    if at > after && at <= up_to && found.last() != Some(&at) {
                        found.push(at);
                        if found.len() == most {
                            break;
                        }
                    }
                    from = naive;
                    inclusive = false;
                }
                found.sort_unstable();
                found.dedup();
                let excess = found.len().saturating_sub(most);
                found.drain(..excess);
            }
            Rule::Every { seconds } => {
                let last = up_to.timestamp().div_euclid(*seconds);
                let first = after.timestamp().div_euclid(*seconds) + 1;
                let first = first.max(last - most as i64 + 1);
                found.extend(
                    (first..=last).filter_map(|k| DateTime::from_timestamp(k * seconds, 0)),
                );
            }
        }
        found
    }
}

/// The names of UTC in the zone database.
const UTC_NAMES: [&str; 8] = [
    "UTC",
    "Etc/UTC",
    "Etc/UCT",
    "Etc/Universal",
    "Etc/Zulu",
    "UCT",
    "Universal",
    "Zulu",
];

/// The IANA zone `name`, its case as the database writes it or any other (`utc`,
/// `europe/berlin`).
fn zone(name: &str) -> Option<chrono_tz::Tz> {
    chrono_tz::Tz::from_str(name).ok().or_else(|| {
        chrono_tz::TZ_VARIANTS
            .iter()
            .copied()
            .find(|zone| zone.name().eq_ignore_ascii_case(name))
    })
}

/// The most wall-clock occurrences one search steps through (a search that finds nothing in
/// them, past a repeated hour of a rule that fires every second, gives up).
const MAX_STEPS: usize = 20_000;

/// The instant of wall time `naive` in zone `tz`: a wall time that happens twice (the clocks
/// go back) is its first pass; one that does not happen (the clocks go forward) is the first
/// instant after the skipped interval, where the new wall time starts (docs/schedules.md,
/// "Daylight saving").
fn instant(tz: &chrono_tz::Tz, naive: NaiveDateTime) -> DateTime<Utc> {
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(at) => at.with_timezone(&Utc),
        LocalResult::Ambiguous(first, _) => first.with_timezone(&Utc),
        LocalResult::None => {
            // The skipped interval ends at a whole minute: the first wall minute after
            // `naive` that happens is where the new wall time starts.
            let mut minute = naive
                .with_second(0)
                .and_then(|m| m.with_nanosecond(0))
                .unwrap_or(naive);
            for _ in 0..24 * 60 {
                minute += TimeDelta::minutes(1);
                match tz.from_local_datetime(&minute) {
                    LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => {
                        return at.with_timezone(&Utc);
                    }
                    LocalResult::None => {}
                }
            }
            // No zone skips a day; read as UTC rather than fail.
            naive.and_utc()
        }
    }
}

/// Whether `cron` (the expression `expr`) has any wall time at all. A pattern of no date (the
/// 31st of April) makes the parser search to the year 5000, tens of milliseconds each time:
/// the answer is kept per expression, the first [`KNOWN_EXPRESSIONS`] of them (about a
/// megabyte), so that a list of the schedules pays it once per expression. (The scheduler
/// keeps each schedule's rule from one look to the next besides.)
fn fires_at_all(expr: &str, cron: &Cron) -> bool {
    static KNOWN: LazyLock<Mutex<HashMap<String, bool>>> = LazyLock::new(Mutex::default);
    let lock = || {
        KNOWN
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    };
    if let Some(&fires) = lock().get(expr) {
        return fires;
    }
    // Searched without the lock: no other expression's check waits for this one.
    let start = NaiveDateTime::default().with_year(2000).unwrap_or_default();
    let fires = cron.find_next_occurrence(&start, true).is_ok();
    let mut known = lock();
    if known.len() < KNOWN_EXPRESSIONS {
        known.insert(expr.to_string(), fires);
    }
    fires
}

/// How many expressions [`fires_at_all`] keeps its answer for. Never emptied: emptied when
/// full, as it once was, a site of more expressions paid every check at every look.
const KNOWN_EXPRESSIONS: usize = 10_000;

/// A cron expression as schedules take it: five fields or six (a leading seconds field), or
/// a nickname (`@hourly`, `@daily`...); no year field.
///
/// # Errors
///
/// [`RuleError::Cron`] with the parser's reason.
pub fn parse_cron(expr: &str) -> Result<Cron, RuleError> {
    let wrong = |reason: String| RuleError::Cron {
        expr: expr.to_string(),
        reason,
    };
    if expr.len() > MAX_CRON {
        return Err(wrong(format!("longer than {MAX_CRON} bytes")));
    }
    // The parser reads an empty list element (`,`, `1,,2`, a trailing comma) as no value at
    // all, and the search for a field of no values runs to the year 5000: up to a minute
    // and a half on one core for `", * * * *"`. Refused here, before any search.
    if let Some(field) = expr
        .split_whitespace()
        .find(|field| field.split(',').any(str::is_empty))
    {
        return Err(wrong(format!(
            "the field {field:?} has an empty list element"
        )));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(expr.trim())
        .map_err(|err| wrong(err.to_string()))
}

#[cfg(test)]
mod tests;
