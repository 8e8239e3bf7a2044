//! The rules' instants: cron fields, zones, daylight saving in two zones, periods.

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
fn cron_takes_five_fields_six_with_seconds_and_nicknames() {
    let five = cron("30 2 * * *", "UTC");
    assert_eq!(
        five.next_after(utc("2026-12-06T00:00:00Z")),
        Some(utc("2026-12-06T02:30:00Z"))
    );
    let six = cron("15 30 2 * * *", "UTC");
    assert_eq!(
        six.next_after(utc("2026-12-06T00:00:00Z")),
        Some(utc("2026-12-06T02:30:15Z"))
    );
    let hourly = cron("@hourly", "UTC");
    assert_eq!(
        hourly.next_after(utc("2026-12-06T00:10:00Z")),
        Some(utc("2026-12-06T01:00:00Z"))
    );
    for bad in ["", "* * *", "61 * * * *", "* * * * * * 2026", "nonsense"] {
        assert!(
            matches!(
                Rule::new(Some(bad), None, "UTC"),
                Err(RuleError::Cron { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        Rule::new(Some("* * * * *"), None, "Mars/Olympus"),
        Err(RuleError::Zone(_))
    ));
    for never in ["0 0 31 4,6,9,11 *", "0 0 30 2 *", "* * * 31 2 *"] {
        assert!(
            matches!(
                Rule::new(Some(never), None, "UTC"),
                Err(RuleError::Never(_))
            ),
            "{never}"
        );
    }
    assert!(
        Rule::new(Some("0 0 29 2 *"), None, "UTC").is_ok(),
        "leap days happen"
    );
    assert_eq!(
        Rule::new(None, None, "UTC").unwrap_err(),
        RuleError::OneRule
    );
    assert!(matches!(
        Rule::new(None, Some(Duration::from_millis(1500)), "UTC"),
        Err(RuleError::Every(_))
    ));
    assert_eq!(
        Rule::new(None, Some(Duration::from_secs(60)), "Europe/Berlin").unwrap_err(),
        RuleError::ZoneWithEvery
    );
}

#[test]
fn a_zone_moves_the_instants() {
    let rule = cron("0 9 * * *", "America/New_York");
    // 09:00 EST is 14:00 UTC.
    assert_eq!(
        rule.next_after(utc("2026-12-06T00:00:00Z")),
        Some(utc("2026-12-06T14:00:00Z"))
    );
}

/// A local time that happens twice (the clocks go back) fires once, in two zones.
#[test]
fn a_local_time_that_happens_twice_fires_once() {
    for (zone, day, first) in [
        // Europe/Berlin: 2026-10-25 03:00 CEST -> 02:00 CET; 02:30 CEST is 00:30 UTC.
        ("Europe/Berlin", (2026, 10, 25), "2026-10-25T00:30:00Z"),
        // America/New_York: 2026-11-01 02:00 EDT -> 01:00 EST; 01:30 EDT is 05:30 UTC.
        ("America/New_York", (2026, 11, 1), "2026-11-01T05:30:00Z"),
    ] {
        let tz: chrono_tz::Tz = zone.parse().unwrap();
        let hour = if zone == "Europe/Berlin" { 2 } else { 1 };
        let rule = cron(&format!("30 {hour} * * *"), zone);
        let midnight = tz
            .with_ymd_and_hms(day.0, day.1, day.2, 0, 0, 0)
            .unwrap()
            .with_timezone(&Utc);
        let end = midnight + TimeDelta::hours(20);
        let fires = rule.between(midnight, end, 100);
        assert_eq!(fires, [utc(first)], "{zone}: once, at the first pass");
        // Forward from the first fire, the next is the next day's.
        let next = rule.next_after(utc(first)).unwrap();
        assert!(next - utc(first) > TimeDelta::hours(23), "{zone}: {next}");
    }
}

/// A local time that does not happen (the clocks go forward) fires at the next valid
/// instant, in two zones.
#[test]
fn a_local_time_that_does_not_happen_fires_at_the_next_valid_instant() {
    for (zone, day, hour, expected) in [
        // Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC).
        ("Europe/Berlin", (2026, 3, 29), 2, "2026-03-29T01:00:00Z"),
        // America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC).
        ("America/New_York", (2026, 3, 8), 2, "2026-03-08T07:00:00Z"),
    ] {
        let tz: chrono_tz::Tz = zone.parse().unwrap();
        let rule = cron(&format!("30 {hour} * * *"), zone);
        let midnight = tz
            .with_ymd_and_hms(day.0, day.1, day.2, 0, 0, 0)
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            rule.next_after(midnight),
            Some(utc(expected)),
            "{zone}: the first instant after the gap"
        );
        let fires = rule.between(midnight, midnight + TimeDelta::hours(20), 100);
        assert_eq!(fires, [utc(expected)], "{zone}: once that day");
    }
}

/// The same rules whatever the hour field: a list, a range, a step, a wildcard.
#[test]
fn daylight_saving_holds_for_hour_lists_ranges_and_steps() {
    let day = |zone: &str, y, m, d| {
        let tz: chrono_tz::Tz = zone.parse().unwrap();
        let midnight = tz
            .with_ymd_and_hms(y, m, d, 0, 0, 0)
            .unwrap()
            .with_timezone(&Utc);
        (midnight, midnight + TimeDelta::hours(24))
    };
    // Berlin, 25 October 2026: 02:00-02:59 happens twice (CEST 00:00-00:59 UTC, then CET
    // 01:00-01:59 UTC).
    let (from, to) = day("Europe/Berlin", 2026, 10, 25);
    let fires = cron("30 2,3 * * *", "Europe/Berlin").between(from, to, 100);
    assert_eq!(
        fires,
        [utc("2026-10-25T00:30:00Z"), utc("2026-10-25T02:30:00Z")],
        "02:30 once, at its first pass, and 03:30"
    );
    let fires = cron("*/20 2 * * *", "Europe/Berlin").between(from, to, 100);
    assert_eq!(
        fires,
        [
            utc("2026-10-25T00:00:00Z"),
            utc("2026-10-25T00:20:00Z"),
            utc("2026-10-25T00:40:00Z")
        ],
        "each wall time of the repeated hour once"
    );
    // The 24 hours from local midnight end at 23:00 local: 00:30 to 22:30, 02:30 once.
    let hourly = cron("30 * * * *", "Europe/Berlin").between(from, to, 100);
    assert_eq!(hourly.len(), 23, "one fire per wall time");
    // Forward search agrees with the backward one.
    let rule = cron("30 1-3 * * *", "Europe/Berlin");
    let mut forward = Vec::new();
    let mut at = from;
    while let Some(next) = rule.next_after(at).filter(|next| *next < to) {
        forward.push(next);
        at = next;
    }
    assert_eq!(forward, rule.between(from, to, 100));
    assert_eq!(forward.len(), 3, "01:30, 02:30 once, 03:30: {forward:?}");

    // Berlin, 29 March 2026: 02:00-02:59 does not happen (01:00 UTC is 03:00 CEST).
    let (from, to) = day("Europe/Berlin", 2026, 3, 29);
    let fires = cron("30 2,3 * * *", "Europe/Berlin").between(from, to, 100);
    assert_eq!(
        fires,
        [utc("2026-03-29T01:00:00Z"), utc("2026-03-29T01:30:00Z")],
        "02:30 at 03:00, then 03:30"
    );
    let fires = cron("*/20 2 * * *", "Europe/Berlin").between(from, to, 100);
    assert_eq!(
        fires,
        [utc("2026-03-29T01:00:00Z")],
        "the skipped hour's three at 03:00, once"
    );
    // New York, 8 March 2026: 02:00-02:59 does not happen (07:00 UTC is 03:00 EDT).
    let (from, to) = day("America/New_York", 2026, 3, 8);
    let fires = cron("0,30 1-3 * * *", "America/New_York").between(from, to, 100);
    assert_eq!(
        fires,
        [
            utc("2026-03-08T06:00:00Z"),
            utc("2026-03-08T06:30:00Z"),
            utc("2026-03-08T07:00:00Z"),
            utc("2026-03-08T07:30:00Z"),
            utc("2026-03-09T05:00:00Z")
        ],
        "01:00, 01:30, the skipped 02:00 and 02:30 once at 03:00 (with 03:00's own), 03:30; \
         the 24 hours from local midnight end at 01:00 of the next day"
    );
}

#[test]
fn every_fires_at_multiples_of_its_period() {
    let rule = every(60);
    assert_eq!(
        rule.next_after(utc("2026-12-06T03:16:48Z")),
        Some(utc("2026-12-06T03:17:00Z"))
    );
    assert_eq!(
        rule.next_after(utc("2026-12-06T03:17:00Z")),
        Some(utc("2026-12-06T03:18:00Z"))
    );
    assert_eq!(
        rule.between(utc("2026-12-06T03:00:00Z"), utc("2026-12-06T03:03:30Z"), 10),
        [
            utc("2026-12-06T03:01:00Z"),
            utc("2026-12-06T03:02:00Z"),
            utc("2026-12-06T03:03:00Z")
        ]
    );
    assert_eq!(
        rule.between(utc("2026-12-06T03:00:00Z"), utc("2026-12-06T03:03:30Z"), 2),
        [utc("2026-12-06T03:02:00Z"), utc("2026-12-06T03:03:00Z")],
        "the latest ones"
    );
}

#[test]
fn an_empty_list_element_is_refused_before_any_search() {
    // Read by the parser as a field of no values, each made the check of whether the rule
    // fires at all search to the year 5000 (90 s for the first).
    for bad in [
        ", * * * *",
        "0 , * * *",
        "0 0 , * *",
        "1,,2 * * * *",
        "0 0 * * 1,",
    ] {
        match Rule::new(Some(bad), None, "UTC") {
            Err(RuleError::Cron { reason, .. }) => {
                assert!(reason.contains("empty list element"), "{bad:?}: {reason}")
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(Rule::new(Some("1,2 * * * *"), None, "UTC").is_ok());
}

#[test]
fn a_span_from_the_first_pass_into_the_second_finds_the_first_pass_alone() {
    // Europe/Berlin, 2026-10-25: 02:40 CEST (00:40 UTC), first pass, to 02:20 CET (01:20
    // UTC), second pass. Every minute fires once, at its first pass: 02:41 to 02:59 CEST.
    let rule = cron("* * * * *", "Europe/Berlin");
    let fires = rule.between(
        utc("2026-10-25T00:40:00Z"),
        utc("2026-10-25T01:20:00Z"),
        1000,
    );
    let expected: Vec<DateTime<Utc>> = (41..60)
        .map(|minute| utc(&format!("2026-10-25T00:{minute}:00Z")))
        .collect();
    assert_eq!(fires, expected);
    // From within the second pass, the next new wall time is 03:00 CET.
    let fires = rule.between(
        utc("2026-10-25T01:20:00Z"),
        utc("2026-10-25T02:01:00Z"),
        1000,
    );
    assert_eq!(
        fires,
        [utc("2026-10-25T02:00:00Z"), utc("2026-10-25T02:01:00Z")]
    );
}

#[test]
fn a_zone_is_read_in_any_case_and_every_takes_any_name_of_utc() {
    assert_eq!(
        cron("0 9 * * *", "europe/berlin").next_after(utc("2026-12-06T00:00:00Z")),
        Some(utc("2026-12-06T08:00:00Z"))
    );
    assert!(Rule::new(Some("0 9 * * *"), None, "utc").is_ok());
    for name in ["UTC", "utc", "Etc/UTC", "etc/utc", "Zulu"] {
        assert!(
            Rule::new(None, Some(Duration::from_secs(60)), name).is_ok(),
            "{name}"
        );
    }
    assert_eq!(
        Rule::new(None, Some(Duration::from_secs(60)), "GMT+1").unwrap_err(),
        RuleError::ZoneWithEvery
    );
}
