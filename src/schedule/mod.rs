//! Schedules: a task made at each instant of a rule, by whichever daemon looks first, with no
//! leader (docs/schedules.md).
//!
//! A rule is a cron expression read in an IANA time zone, or a period of whole seconds whose
//! instants are its multiples since 1970 UTC. The instants are computed here, by every daemon
//! alike; which daemon makes a fire is decided by the database (`pgtaskd.fire_schedule`, a
//! compare-and-set of the schedule's last fire in the transaction that inserts the fire's
//! task), and the fire's instant is also its task's idempotency key.
//!
//! | file | owns |
//! | --- | --- |
//! | `mod.rs` | what one look at a schedule fires ([`plan`]), missed fires, names and fire keys |
//! | `rule.rs` | a rule ([`Rule`]): cron in a zone or every N seconds, its instants, daylight saving |
//! | `store.rs` | the table `pgtaskd.schedules`: list, put, remove, pause and fire |

pub mod rule;
pub mod store;

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

pub use rule::{parse_cron, Rule, RuleError, MAX_CRON, MAX_EVERY};

/// The most missed instants `catch-up` makes tasks for: the latest of them.
pub const MAX_CATCH_UP: usize = 1000;

/// How late a single instant may be made and still count as on time: later than this, it
/// was missed (every daemon was down or stopped), and the schedule's `missed` rule decides.
pub const ON_TIME: Duration = Duration::from_secs(60);

/// What becomes of instants no daemon made at their time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// One task for all of them, at the latest.
    Coalesce,
    /// None.
    Skip,
    /// One per instant, the latest [`MAX_CATCH_UP`].
    CatchUp,
}

impl Missed {
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Coalesce => "coalesce",
            Missed::Skip => "skip",
            Missed::CatchUp => "catch-up",
        }
    }
}

impl FromStr for Missed {
    type Err = String;

    fn from_str(text: &str) -> Result<Missed, String> {
        match text {
            "coalesce" => Ok(Missed::Coalesce),
            "skip" => Ok(Missed::Skip),
            "catch-up" => Ok(Missed::CatchUp),
            other => Err(format!(
                "unknown missed-fire rule {other:?}: coalesce, skip or catch-up"
            )),
        }
    }
}

/// What one look at a schedule does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The instants to make a task for, ascending.
    pub fires: Vec<DateTime<Utc>>,
    /// Where the schedule's last fire moves (the latest instant due), when one is due.
    pub up_to: Option<DateTime<Utc>>,
    /// The first instant after `now`: when to look again.
    pub next: Option<DateTime<Utc>>,
}

/// What schedule `rule` fires at `now`, its instants counted after `base` (the later of its
/// last fire and the moment its definition took effect). One instant due, at most [`ON_TIME`]
/// late, is fired; more than one, or one later than that, were missed (no daemon looked at
/// their time), and `missed` decides.
pub fn plan(rule: &Rule, missed: Missed, base: DateTime<Utc>, now: DateTime<Utc>) -> Plan {
    let most = match missed {
        Missed::CatchUp => MAX_CATCH_UP,
        Missed::Coalesce | Missed::Skip => 2,
    };
    let due = rule.between(base, now, most);
    let next = rule.next_after(now.max(base));
    let Some(&latest) = due.last() else {
        return Plan {
            fires: Vec::new(),
            up_to: None,
            next,
        };
    };
    let late = now - latest > TimeDelta::from_std(ON_TIME).unwrap_or(TimeDelta::MAX);
    let fires = if due.len() == 1 && !late {
        due
    } else {
        match missed {
            Missed::Coalesce => vec![latest],
            Missed::Skip => Vec::new(),
            Missed::CatchUp => due,
        }
    };
    Plan {
        fires,
        up_to: Some(latest),
        next,
    }
}

/// The idempotency key of schedule `name`'s task for the fire at `instant`, as
/// `pgtaskd.fire_schedule` writes it.
pub fn fire_key(name: &str, instant: DateTime<Utc>) -> String {
    format!("schedule:{name}:{}", instant.format("%Y-%m-%dT%H:%M:%SZ"))
}

/// The schedule and the instant of a task a schedule made, from its idempotency key.
pub fn fired_by(idempotency_key: &str) -> Option<(&str, &str)> {
    let rest = idempotency_key.strip_prefix("schedule:")?;
    // The instant is the last 20 characters (it holds colons itself), after a colon.
    let cut = rest.len().checked_sub(20)?;
    let (head, instant) = (rest.get(..cut)?, rest.get(cut..)?);
    let name = head.strip_suffix(':')?;
    if name.is_empty() || DateTime::parse_from_rfc3339(instant).is_err() {
        return None;
    }
    Some((name, instant))
}

/// A schedule name: letters, digits and `_ . : -`, starting with a letter or digit, 1 to 128
/// bytes (the table's `schedules_name`).
///
/// # Errors
///
/// What is wrong with it.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid schedule name {name:?}: 1 to 128 letters, digits and _ . : -, starting with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn cron(expr: &str, tz: &str) -> Rule {
        Rule::new(Some(expr), None, tz).unwrap()
    }

    fn every(seconds: u64) -> Rule {
        Rule::new(None, Some(Duration::from_secs(seconds)), "UTC").unwrap()
    }

    #[test]
    fn one_instant_on_time_fires_and_missed_ones_follow_the_rule() {
        let rule = every(1);
        let base = utc("2026-12-06T03:00:00Z");
        // On time: one instant due, a moment ago.
        let now = utc("2026-12-06T03:00:01.050Z");
        for missed in [Missed::Coalesce, Missed::Skip, Missed::CatchUp] {
            let plan = plan(&rule, missed, base, now);
            assert_eq!(plan.fires, [utc("2026-12-06T03:00:01Z")], "{missed:?}");
            assert_eq!(plan.up_to, Some(utc("2026-12-06T03:00:01Z")));
            assert_eq!(plan.next, Some(utc("2026-12-06T03:00:02Z")));
        }
        // Six instants missed (every daemon down for six seconds).
        let now = utc("2026-12-06T03:00:06.500Z");
        let coalesced = plan(&rule, Missed::Coalesce, base, now);
        assert_eq!(coalesced.fires, [utc("2026-12-06T03:00:06Z")]);
        assert_eq!(coalesced.up_to, Some(utc("2026-12-06T03:00:06Z")));
        let skipped = plan(&rule, Missed::Skip, base, now);
        assert!(skipped.fires.is_empty());
        assert_eq!(skipped.up_to, Some(utc("2026-12-06T03:00:06Z")));
        let caught_up = plan(&rule, Missed::CatchUp, base, now);
        assert_eq!(caught_up.fires.len(), 6);
        // One instant, but an hour late: missed.
        let hourly = cron("0 * * * *", "UTC");
        let late = plan(
            &hourly,
            Missed::Skip,
            utc("2026-12-06T02:30:00Z"),
            utc("2026-12-06T03:50:00Z"),
        );
        assert!(late.fires.is_empty());
        // Nothing due yet.
        let early = plan(&hourly, Missed::Coalesce, base, utc("2026-12-06T03:10:00Z"));
        assert_eq!(early.up_to, None);
        assert_eq!(early.next, Some(utc("2026-12-06T04:00:00Z")));
        // Catch-up keeps the latest thousand.
        let day = plan(&rule, Missed::CatchUp, base, base + TimeDelta::days(1));
        assert_eq!(day.fires.len(), MAX_CATCH_UP);
        assert_eq!(day.fires.last(), Some(&(base + TimeDelta::days(1))));
    }

    #[test]
    fn a_fires_key_names_its_schedule_and_instant() {
        let key = fire_key("nightly:db-1", utc("2026-12-06T03:00:00Z"));
        assert_eq!(key, "schedule:nightly:db-1:2026-12-06T03:00:00Z");
        assert_eq!(
            fired_by(&key),
            Some(("nightly:db-1", "2026-12-06T03:00:00Z"))
        );
        assert_eq!(fired_by("order-17"), None);
        assert_eq!(fired_by("schedule:x"), None);
        assert_eq!(fired_by("schedule:x:not-a-time-at-all-here"), None);
    }

    #[test]
    fn names_are_checked() {
        for good in ["nightly", "db-1:vacuum", "a", "A_b.c"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-x", "a b", "ü", &"x".repeat(129), "a/b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
