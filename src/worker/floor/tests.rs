//! The floor's unit tests: when claims go after a position, how long, what keeps and what
//! clears it, and what counts as a slow claim.

use super::*;

fn at(priority: i32, id: i64) -> Option<Position> {
    Some(Position { priority, id })
}

const POLL: Duration = Duration::from_secs(2);

/// A claim that took all it had room for.
const FULL: usize = 500;

#[test]
fn a_fast_claim_from_the_start_keeps_every_claim_at_the_start() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    floor.record(None, Duration::from_millis(3), t0, FULL, at(0, 500), false);
    assert_eq!(floor.next(t0, POLL), None);
}

#[test]
fn after_a_slow_claim_the_next_ones_start_after_its_last_task_for_a_hundred_times_its_duration() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    let slow = Duration::from_millis(9);
    floor.record(None, slow, t0, 3, at(0, 500), false);
    assert_eq!(floor.next(t0, POLL), at(0, 500));
    // A claim after it that came back full moves the position on.
    floor.record(
        at(0, 500),
        Duration::from_millis(2),
        t0,
        FULL,
        at(0, 1000),
        false,
    );
    assert_eq!(
        floor.next(t0 + slow * (AFTER_SLOW_CLAIM - 1), POLL),
        at(0, 1000)
    );
    assert_eq!(
        floor.next(t0 + slow * AFTER_SLOW_CLAIM, POLL),
        None,
        "then from the start"
    );
}

#[test]
fn the_claims_after_a_position_last_at_most_half_a_poll_interval() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    floor.record(None, Duration::from_secs(1), t0, FULL, at(0, 500), false);
    assert_eq!(
        floor.next(t0 + POLL / 2 - Duration::from_millis(1), POLL),
        at(0, 500)
    );
    assert_eq!(
        floor.next(t0 + POLL / 2, POLL),
        None,
        "an idle worker's next scan (half a poll interval or more later) claims from the start"
    );
}

#[test]
fn while_a_slow_claim_from_the_start_is_on_its_way_the_others_claim_after_the_position() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    let slow = Duration::from_millis(500);
    floor.record(None, slow, t0, FULL, at(0, 500), false);
    let later = t0 + POLL;
    assert_eq!(
        floor.next(later, POLL),
        None,
        "the window is over: one from the start"
    );
    assert_eq!(
        floor.next(later, POLL),
        at(0, 500),
        "the second claim slot does not walk the same entries"
    );
    floor.record(
        at(0, 500),
        Duration::from_millis(2),
        later,
        FULL,
        at(0, 1000),
        false,
    );
    assert_eq!(floor.next(later, POLL), at(0, 1000));
    // It came back, slow again: its window starts.
    let back = later + slow;
    floor.record(None, slow, back, FULL, at(0, 1200), false);
    assert_eq!(floor.next(back, POLL), at(0, 1200));
    // Past that window, one goes from the start; it fails: the next goes from the start.
    let past = back + POLL;
    assert_eq!(floor.next(past, POLL), None);
    floor.abandon(None);
    assert_eq!(floor.next(past, POLL), None);
}

#[test]
fn each_claim_from_the_start_on_its_way_counts_until_it_comes_back() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    let slow = Duration::from_millis(500);
    floor.record(None, slow, t0, FULL, at(0, 500), false);
    let later = t0 + POLL;
    // Past the window, one goes from the start; it fails, and the next does too.
    assert_eq!(floor.next(later, POLL), None);
    floor.abandon(None);
    assert_eq!(floor.next(later, POLL), None);
    assert_eq!(
        floor.next(later, POLL),
        at(0, 500),
        "one from the start is on its way"
    );
    floor.record(
        at(0, 500),
        Duration::from_millis(2),
        later,
        FULL,
        at(0, 1000),
        false,
    );
    // It comes back (slow, full): its window starts.
    floor.record(None, slow, later + slow, FULL, at(0, 1100), false);
    assert_eq!(floor.next(later + slow, POLL), at(0, 1100));
    let past = later + slow + POLL;
    assert_eq!(floor.next(past, POLL), None);
    assert_eq!(
        floor.next(past, POLL),
        at(0, 1100),
        "one from the start is still on its way"
    );
    floor.abandon(None);
    assert_eq!(floor.next(past, POLL), None, "now none is");
}

#[test]
fn a_claim_dropped_before_it_was_recorded_is_no_longer_on_its_way() {
    let floor = std::sync::Mutex::new(Floor::default());
    let t0 = Instant::now();
    let slow = Duration::from_millis(500);
    floor
        .lock()
        .unwrap()
        .record(None, slow, t0, FULL, at(0, 500), false);
    let later = t0 + POLL;
    let after = floor.lock().unwrap().next(later, POLL);
    assert_eq!(after, None);
    drop(Pending {
        floor: &floor,
        after,
        recorded: false,
    });
    assert_eq!(floor.lock().unwrap().starting, 0);
    assert_eq!(floor.lock().unwrap().next(later, POLL), None);
}

#[test]
fn fast_claims_from_the_start_may_overlap() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    floor.record(None, Duration::from_millis(3), t0, FULL, at(0, 500), false);
    assert_eq!(floor.next(t0, POLL), None);
    assert_eq!(floor.next(t0, POLL), None);
}

#[test]
fn a_drained_queue_keeps_its_position_until_claims_from_the_start_are_fast_again() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    let slow = Duration::from_millis(8);
    // A claim of three tasks that walked a held horizon's entries: slow for three.
    floor.record(None, slow, t0, 3, at(0, 500), false);
    assert_eq!(floor.next(t0, POLL), at(0, 500));
    // Claims after it find one task, then none: the position stays where the last was.
    floor.record(
        at(0, 500),
        Duration::from_millis(1),
        t0,
        1,
        at(0, 501),
        false,
    );
    floor.record(at(0, 501), Duration::from_millis(1), t0, 0, None, false);
    assert_eq!(
        floor.next(t0 + slow * (AFTER_SLOW_CLAIM - 1), POLL),
        at(0, 501)
    );
    // A hundred times its duration later, one from the start; it finds nothing, slowly: the
    // position stays, and the next claims start after it again.
    let later = t0 + slow * AFTER_SLOW_CLAIM;
    assert_eq!(floor.next(later, POLL), None);
    floor.record(None, slow, later, 0, None, false);
    assert_eq!(floor.next(later, POLL), at(0, 501));
    // The horizon moved on: a claim from the start of one task in a millisecond is fast,
    // and every claim starts from the start again.
    let moved = later + slow * AFTER_SLOW_CLAIM;
    assert_eq!(floor.next(moved, POLL), None);
    floor.record(None, Duration::from_millis(1), moved, 1, at(0, 502), false);
    assert_eq!(floor.next(moved, POLL), None);
    assert_eq!(floor.next(moved, POLL), None);
}

#[test]
fn a_claim_is_slow_for_what_it_took() {
    let t0 = Instant::now();
    let took = Duration::from_millis(10);
    let mut floor = Floor::default();
    floor.record(None, took, t0, FULL, at(0, 500), false);
    assert_eq!(floor.next(t0, POLL), None, "10 ms for 500 tasks is fast");
    let mut floor = Floor::default();
    floor.record(None, took, t0, 1, at(0, 501), false);
    assert_eq!(floor.next(t0, POLL), at(0, 501), "10 ms for one is slow");
}

#[test]
fn a_long_round_trip_is_not_a_slow_claim() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    let trip = Duration::from_millis(6);
    // A server 6 ms away: the first claim has nothing to be measured against.
    floor.record(None, trip, t0, 1, at(0, 1), false);
    let later = t0 + POLL;
    assert_eq!(floor.next(later, POLL), None);
    floor.record(
        None,
        trip + Duration::from_millis(1),
        later,
        1,
        at(0, 2),
        false,
    );
    assert_eq!(floor.next(later, POLL), None, "7 ms where claims take 6");
    assert_eq!(floor.next(later, POLL), None);
    // A held horizon makes the claims from the start slower than that.
    floor.record(None, Duration::from_millis(30), later, 1, at(0, 3), false);
    assert_eq!(floor.next(later, POLL), at(0, 3));
}

#[test]
fn a_walk_growing_claim_by_claim_is_measured_against_the_fastest_claim() {
    let mut floor = Floor::default();
    let mut now = Instant::now();
    // Claims from the start, each 0.1 ms slower than the last (a held horizon's walk
    // growing), never slow against the one before it.
    let mut took = Duration::from_millis(1);
    let mut engaged_at = None;
    for n in 0..100 {
        assert_eq!(floor.next(now, POLL), None);
        floor.record(None, took, now, 2, at(0, n), false);
        if floor.next(now, POLL).is_some() {
            engaged_at = Some(took);
            break;
        }
        floor.abandon(None);
        took += Duration::from_micros(100);
        now += Duration::from_millis(3);
    }
    let engaged_at = engaged_at.expect("the walk was never judged slow");
    assert!(
        engaged_at >= Duration::from_millis(6) && engaged_at < Duration::from_millis(7),
        "slow from 5 ms over the fastest claim (1 ms): {engaged_at:?}"
    );
}

#[test]
fn a_claim_never_sent_teaches_nothing() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    let trip = Duration::from_millis(6);
    floor.record(None, trip, t0, 1, at(0, 1), false);
    let later = t0 + POLL;
    assert_eq!(floor.next(later, POLL), None);
    floor.record(None, Duration::ZERO, later, 0, None, false);
    assert_eq!(floor.next(later, POLL), None);
    floor.record(
        None,
        trip + Duration::from_millis(1),
        later,
        1,
        at(0, 2),
        false,
    );
    assert_eq!(floor.next(later, POLL), None, "7 ms where claims take 6");
}

#[test]
fn a_server_further_away_is_learned_within_two_minutes() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    floor.record(None, Duration::from_millis(1), t0, 1, at(0, 1), false);
    // After a failover every claim takes 10 ms: slow against the old server's 1 ms...
    let mut now = t0 + POLL;
    assert_eq!(floor.next(now, POLL), None);
    floor.record(None, Duration::from_millis(10), now, 1, at(0, 2), false);
    assert_eq!(floor.next(now, POLL), at(0, 2));
    // ...until the old server's claims are over two minutes behind.
    for n in 3..200 {
        now += POLL;
        if floor.next(now, POLL).is_none() {
            floor.record(None, Duration::from_millis(10), now, 1, at(0, n), false);
        } else {
            floor.record(
                at(0, n - 1),
                Duration::from_millis(10),
                now,
                1,
                at(0, n),
                false,
            );
        }
    }
    assert!(now - t0 > USUAL_OVER * 2);
    assert_eq!(floor.next(now, POLL), None);
    assert_eq!(
        floor.next(now, POLL),
        None,
        "no position: claims are usual again"
    );
}

#[test]
fn a_task_the_budget_left_out_before_the_position_is_claimed_from_the_start() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    let slow = Duration::from_millis(8);
    floor.record(None, slow, t0, 3, at(0, 500), false);
    floor.record(
        at(0, 500),
        Duration::from_millis(1),
        t0,
        2,
        at(0, 502),
        false,
    );
    // A large task of a higher priority came in; the claim from the start found it first
    // and could not take it: the claim that waits for its room starts from the start.
    let later = t0 + slow * AFTER_SLOW_CLAIM;
    assert_eq!(floor.next(later, POLL), None);
    floor.record(None, slow, later, 0, None, true);
    // A claim after the old position, sent before, comes back after: it stays cleared.
    floor.record(
        at(0, 502),
        Duration::from_millis(1),
        later,
        1,
        at(0, 503),
        false,
    );
    assert_eq!(floor.next(later, POLL), None);
    // One that found nothing at all leaves the position.
    floor.record(None, slow, later, 1, at(5, 10), false);
    floor.record(None, slow, later, 0, None, false);
    assert_eq!(floor.next(later, POLL), at(5, 10));
}

#[test]
fn a_claim_from_the_start_replaces_the_position_with_its_own() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    floor.record(None, Duration::from_millis(50), t0, FULL, at(0, 500), false);
    floor.record(
        at(0, 500),
        Duration::from_millis(2),
        t0,
        FULL,
        at(0, 5000),
        false,
    );
    // Tasks of priority 5 were inserted since: the next claim from the start takes some.
    floor.record(None, Duration::from_millis(50), t0, FULL, at(5, 600), false);
    assert_eq!(
        floor.next(t0, POLL),
        at(5, 600),
        "the rest of priority 5 is not skipped"
    );
}

#[test]
fn concurrent_claims_keep_the_later_position_in_claim_order() {
    let mut floor = Floor::default();
    let t0 = Instant::now();
    floor.record(None, Duration::from_millis(50), t0, FULL, at(5, 900), false);
    // A lower priority is later in claim order than any id of a higher one.
    floor.record(
        at(5, 900),
        Duration::from_millis(2),
        t0,
        FULL,
        at(3, 10),
        false,
    );
    floor.record(
        at(5, 900),
        Duration::from_millis(2),
        t0,
        FULL,
        at(5, 1400),
        false,
    );
    assert_eq!(floor.next(t0, POLL), at(3, 10));
}
