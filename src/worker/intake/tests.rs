//! The intake's unit tests: targets, claiming ahead, the byte budget, and the room that
//! the permits and bytes shared by a daemon's lanes leave.

use super::*;

const MIB: u64 = 1 << 20;

/// The tasks a reservation granted, 0 for none.
fn tasks(room: Option<Room>) -> usize {
    room.map_or(0, |room| room.tasks)
}

/// Reserve `most` tasks and settle the reservation as a claim of all of them, with no
/// payload bytes.
fn claim_all(intake: &Intake, most: usize) -> usize {
    let Some(room) = intake.reserve(most, 0) else {
        return 0;
    };
    intake.claimed(room, room.tasks, 0, Duration::from_millis(1));
    room.tasks
}

#[test]
fn claims_only_for_free_workers_until_measured() {
    let intake = Intake::new(8, MIB);
    assert_eq!(intake.target(), 8);
    assert_eq!(tasks(intake.reserve(100, 0)), 8);
    assert_eq!(tasks(intake.reserve(100, 0)), 0);
}

#[test]
fn a_claim_gives_back_the_room_it_did_not_use() {
    let intake = Intake::new(8, MIB);
    let room = intake.reserve(100, 0).unwrap();
    intake.claimed(room, 5, 0, Duration::from_secs(1));
    assert_eq!(tasks(intake.reserve(100, 0)), 3);
    for _ in 0..3 {
        intake.done(0);
    }
    assert_eq!(tasks(intake.reserve(100, 0)), 3);
}

#[test]
fn slow_tasks_add_nothing_ahead() {
    let intake = Intake::new(8, MIB);
    intake.claim_took(Duration::from_millis(1));
    intake.task_took(Duration::from_secs(1));
    assert_eq!(intake.target(), 8);
}

#[test]
fn fast_tasks_claim_what_the_workers_get_through_in_a_round_trip() {
    let intake = Intake::new(4, MIB);
    intake.claim_took(Duration::from_millis(1));
    intake.task_took(Duration::from_micros(100));
    // 4 workers * 1 ms / 0.1 ms = 40 tasks ahead.
    assert_eq!(intake.target(), 4 + 40);

    let intake = Intake::new(4, MIB);
    intake.claim_took(Duration::from_millis(1));
    intake.task_took(Duration::from_nanos(10));
    assert_eq!(intake.target(), 4 + MAX_AHEAD);
}

#[tokio::test(start_paused = true)]
async fn a_long_running_analysis_stops_the_claiming_ahead_before_it_ends() {
    let intake = Intake::new(4, MIB);
    intake.claim_took(Duration::from_millis(1));
    intake.task_took(Duration::from_nanos(10));
    assert_eq!(intake.target(), 4 + MAX_AHEAD);
    let slow = intake.analysis();
    // 4 workers * 1 ms / 50 ms rounds down to nothing ahead.
    tokio::time::advance(Duration::from_millis(50)).await;
    assert_eq!(intake.target(), 4);
    drop(slow);
    // Finished, its 50 ms weigh in the average: still nothing ahead.
    assert_eq!(intake.target(), 4);
}

#[test]
fn a_claim_that_brought_much_text_is_not_timed() {
    let intake = Intake::new(4, 1 << 40);
    intake.task_took(Duration::from_micros(100));
    let room = intake.reserve(4, 0).unwrap();
    // A second for 200 MiB: the transfer, not the round trip.
    intake.claimed(room, 1, 200 * MIB, Duration::from_secs(1));
    assert_eq!(intake.target(), 4);
    let room = intake.reserve(1, 0).unwrap();
    intake.claimed(room, 1, 1000, Duration::from_millis(1));
    assert_eq!(intake.target(), 4 + 40);
}

#[test]
fn reserve_never_exceeds_the_asked_for_batch() {
    let intake = Intake::new(8, MIB);
    assert_eq!(tasks(intake.reserve(5, 0)), 5);
    assert_eq!(tasks(intake.reserve(5, 0)), 3);
}

#[test]
fn a_claim_may_use_half_the_byte_budget_and_take_one_only_when_nothing_is_held() {
    let intake = Intake::new(8, 100 * MIB);
    let first = intake.reserve(1, 0).unwrap();
    assert_eq!(first.bytes, 50 * MIB);
    assert!(first.take_one);
    // A second claim on its way at once: the other half, and no task of any size.
    let second = intake.reserve(1, 0).unwrap();
    assert_eq!(second.bytes, 50 * MIB);
    assert!(!second.take_one);
    assert_eq!(intake.reserve(1, 0), None, "the budget is reserved");
    // The first took one payload of 200 MiB, larger than the whole budget.
    intake.claimed(first, 1, 200 * MIB, Duration::from_millis(1));
    intake.unreserve(second);
    assert_eq!(intake.bytes(), (200 * MIB, 0));
    assert_eq!(
        intake.reserve(1, 0),
        None,
        "over budget: nothing more is claimed"
    );
    intake.done(200 * MIB);
    assert_eq!(intake.bytes(), (0, 0));
    assert!(intake.reserve(1, 0).unwrap().take_one);
}

#[test]
fn no_room_is_reserved_for_a_task_larger_than_the_bytes_left() {
    let intake = Intake::new(8, 100 * MIB);
    let room = intake.reserve(1, 0).unwrap();
    intake.claimed(room, 1, 80 * MIB, Duration::from_millis(1));
    // 20 MiB are left: a claim for a task of 30 MiB would find nothing to take.
    assert_eq!(intake.reserve(1, 30 * MIB), None);
    assert_eq!(intake.bytes(), (80 * MIB, 0), "nothing stays reserved");
    assert_eq!(intake.reserve(1, 20 * MIB).unwrap().bytes, 20 * MIB);
}

#[test]
fn bytes_held_leave_only_the_rest_of_the_budget() {
    let intake = Intake::new(8, 100 * MIB);
    let room = intake.reserve(1, 0).unwrap();
    intake.claimed(room, 1, 80 * MIB, Duration::from_millis(1));
    let room = intake.reserve(1, 0).unwrap();
    assert_eq!(room.bytes, 20 * MIB);
    assert!(!room.take_one);
}

#[tokio::test]
async fn done_wakes_a_waiting_claimer() {
    let intake = std::sync::Arc::new(Intake::new(1, MIB));
    assert_eq!(claim_all(&intake, 1), 1);
    let waiter = {
        let intake = std::sync::Arc::clone(&intake);
        tokio::spawn(async move {
            intake.freed().await;
            tasks(intake.reserve(1, 0))
        })
    };
    intake.done(0);
    let reserved = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken within 5 s")
        .expect("waiter did not panic");
    assert_eq!(reserved, 1);
}

/// Two lanes sharing two permits: tasks one lane claimed count against the other at once,
/// before they start; while they run, holding both permits, the other lane claims nothing
/// (its tasks could not start); one permit given back lets it claim one.
#[tokio::test]
async fn a_lane_claims_no_more_than_the_shared_permits_free_could_start() {
    let shared = Shared::new(2);
    let slow = Intake::sharing(2, 64 * MIB, Some(Arc::clone(&shared)));
    let other = Intake::sharing(2, 64 * MIB, Some(Arc::clone(&shared)));
    let room = other.reserve(10, 0).expect("both permits are free");
    assert_eq!(room.tasks, 2);
    other.unreserve(room);
    assert_eq!(claim_all(&slow, 2), 2);
    assert!(
        other.reserve(10, 0).is_none(),
        "the slow lane's claimed tasks will take both permits"
    );
    // They start: they hold both permits.
    let first = Arc::clone(shared.permits()).try_acquire_owned().unwrap();
    let _one = slow.analysis();
    let second = Arc::clone(shared.permits()).try_acquire_owned().unwrap();
    let _two = slow.analysis();
    assert!(
        other.reserve(10, 0).is_none(),
        "no permit could start a task"
    );
    assert!(!other.has_room());
    drop(first);
    assert_eq!(tasks(other.reserve(10, 0)), 1, "one permit is free");
    drop(second);
}

/// One lane at a time takes a task larger than its share of the budget: four lanes never
/// hold four of them; small tasks another lane holds do not keep it waiting.
#[test]
fn one_lane_at_a_time_takes_a_task_of_any_size() {
    let shared = Shared::new(4);
    let lanes: Vec<Intake> = (0..4)
        .map(|_| Intake::sharing(4, 16 * MIB, Some(Arc::clone(&shared))))
        .collect();
    let first = lanes[0]
        .reserve(1, 100 * MIB)
        .expect("nothing held: any size");
    assert!(first.take_one);
    lanes[0].claimed(first, 1, 100 * MIB, Duration::ZERO);
    for lane in &lanes[1..] {
        let room = lane.reserve(1, 100 * MIB);
        assert!(room.is_none(), "another lane holds one: {room:?}");
        let small = lane.reserve(1, MIB).expect("room for what fits its share");
        assert!(!small.take_one);
        lane.unreserve(small);
    }
    // A small task held by a third lane does not keep the second waiting.
    let small = lanes[2].reserve(1, MIB).unwrap();
    lanes[2].claimed(small, 1, MIB, Duration::ZERO);
    lanes[0].done(100 * MIB);
    let room = lanes[1]
        .reserve(1, 100 * MIB)
        .expect("the first lane let go of its task");
    assert!(room.take_one);
    // A claim that could take one but took a small task frees the exception at once.
    lanes[1].claimed(room, 1, MIB, Duration::ZERO);
    assert!(lanes[3]
        .reserve(1, 100 * MIB)
        .is_some_and(|room| room.take_one));
}
