//! A full disk (docs/operations.md, "A full disk"): the server refuses finishes for want of
//! room (SQLSTATE 53100) while claims still fit in their pages. A trigger answers every
//! finish (and, where a test says so, every heartbeat) with `disk_full` while a flag is set, as a full tablespace does, without filling a
//! disk; a sequence (not rolled back with the error) counts the refusals.

use pgtaskd::queue::TaskStatus;
use reqwest::StatusCode;

use crate::support::probe::{get, wait_answer};
use crate::support::{count, eventually, free_port, wait_status, DaemonProcess, TestDb, WAIT};

/// Finishes end a claim with a terminal status.
const FINISHES: &str = "NEW.status IN ('SUCCEEDED', 'FAILED', 'CANCELED')";

/// Heartbeats write a RUNNING row again.
const HEARTBEATS: &str = "OLD.status = 'RUNNING' AND NEW.status = 'RUNNING'";

/// The trigger that answers the updates of the state rows (`pgtaskd.task_state`, the daemon's
/// writes since schema 36) matching `writes` (a condition on `OLD` and `NEW`) with
/// `disk_full` while `full_disk.refusing` is set.
fn refuse(writes: &str) -> String {
    format!(
        "
CREATE TABLE full_disk (refusing boolean NOT NULL);
INSERT INTO full_disk VALUES (true);
CREATE SEQUENCE full_disk_refusals;
CREATE FUNCTION full_disk_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ({writes}) AND (SELECT refusing FROM full_disk) THEN
        PERFORM nextval('full_disk_refusals');
        RAISE EXCEPTION 'could not extend file \"base/1/2\": No space left on device'
              USING ERRCODE = 'disk_full';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER full_disk_refuse BEFORE UPDATE ON pgtaskd.task_state
    FOR EACH ROW EXECUTE FUNCTION full_disk_refuse();
"
    )
}

/// While finishes are refused for want of room, the results are held (the gauge counts
/// them), `/readyz` says why it is not ready, and the daemon claims no more than one round of
/// its permits; once there is room, every result is written, none run again, and `/readyz`
/// is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_refused_for_want_of_room_are_held_said_by_readyz_and_written_once_there_is_room() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute(&refuse(FINISHES)).await.unwrap();
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload)
             SELECT 'word ' || g FROM generate_series(1, 2) AS g",
        )
        .await
        .unwrap();
    let port = free_port();
    let mut daemon = DaemonProcess::start(
        &db,
        &format!(
            "[worker]\nconcurrency = 2\npoll_interval = \"100ms\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
        &[],
    );
    let reason = eventually(WAIT, "/readyz to say why", || async {
        let (status, body) = get(port, "/readyz").await?;
        let reason = body["reason"].as_str()?.to_string();
        (status == StatusCode::SERVICE_UNAVAILABLE && reason.contains("want of room"))
            .then_some(reason)
    })
    .await;
    assert!(reason.contains("No space left on device"), "{reason}");
    eventually(WAIT, "two results held", || async {
        let (_, metrics) = get(port, "/metrics").await?;
        let text = metrics.as_str()?.to_string();
        text.contains("pgtaskd_results_held_for_room 2")
            .then_some(())
    })
    .await;
    // Held results stop the claims: tasks enqueued now wait, through many polls.
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload)
             SELECT 'word ' || g FROM generate_series(3, 20) AS g",
        )
        .await
        .unwrap();
    let refused_before = count(&client, "SELECT last_value FROM full_disk_refusals").await;
    eventually(WAIT, "more refused tries", || async {
        let refused = count(&client, "SELECT last_value FROM full_disk_refusals").await;
        (refused >= refused_before + 3).then_some(())
    })
    .await;
    let claimed = count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status <> 'QUEUED'",
    )
    .await;
    assert_eq!(
        claimed, 2,
        "tasks claimed while 2 results were held for room"
    );

    client
        .batch_execute("UPDATE full_disk SET refusing = false")
        .await
        .unwrap();
    for id in 1..=20 {
        let task = wait_status(&client, id, TaskStatus::Succeeded).await;
        assert_eq!((task.attempt, task.words), (1, 2), "task {id}");
    }
    wait_answer(
        port,
        "/readyz",
        StatusCode::OK,
        "/readyz once there is room",
    )
    .await;
    daemon.stop_cleanly().await;
}

/// Two daemons, each holding results refused for room, the first one's heartbeats refused as
/// well (while the second's and a rescue, RUNNING to QUEUED, still fit, as on a nearly full
/// disk), for six leases: neither rescuer takes the other's claims back while its own writes are
/// refused, so once there is room every result is written under its first claim and no
/// task's work runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_writes_are_refused_for_room_no_rescuer_takes_back_another_daemons_computed_tasks() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(&refuse(&format!(
            "({FINISHES}) OR ({HEARTBEATS} AND OLD.id <= 2)"
        )))
        .await
        .unwrap();
    let lease_ms = 2_000;
    let mut daemons = Vec::new();
    for first in [1, 3] {
        client
            .batch_execute(&format!(
                "INSERT INTO pgtaskd.tasks (payload)
                 SELECT 'word ' || g FROM generate_series({first}, {}) AS g",
                first + 1
            ))
            .await
            .unwrap();
        let port = free_port();
        let daemon = DaemonProcess::start(
            &db,
            &format!(
                "[worker]\nconcurrency = 2\nlease = \"{lease_ms}ms\"\npoll_interval = \"100ms\"\n\
                 [http]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
            &[],
        );
        eventually(WAIT, "two results held by the daemon", || async {
            let (_, metrics) = get(port, "/metrics").await?;
            let text = metrics.as_str()?.to_string();
            text.contains("pgtaskd_results_held_for_room 2")
                .then_some(())
        })
        .await;
        daemons.push(daemon);
    }
    // Six leases by the database's clock, the first daemon's leases run out: time enough
    // for each rescuer to look many times, and for the second daemon's tries of its held
    // results to come further apart than a lease.
    let until: String = client
        .query_one(
            &format!(
                "SELECT (now() + interval '{} milliseconds')::text",
                6 * lease_ms
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    eventually(WAIT, "six leases to pass", || async {
        let passed = count(
            &client,
            &format!("SELECT count(*) WHERE clock_timestamp() > '{until}'::timestamptz"),
        )
        .await;
        (passed == 1).then_some(())
    })
    .await;
    let held = count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING' AND attempt = 1",
    )
    .await;
    assert_eq!(
        held, 4,
        "claims taken back while their daemons held results refused for room"
    );

    client
        .batch_execute("UPDATE full_disk SET refusing = false")
        .await
        .unwrap();
    for id in 1..=4 {
        let task = wait_status(&client, id, TaskStatus::Succeeded).await;
        assert_eq!(
            (task.attempt, task.words),
            (1, 2),
            "task {id}, taken back and run again while its result was held"
        );
    }
    for mut daemon in daemons {
        daemon.stop_cleanly().await;
    }
}

/// Results held for room in one lane stop that lane's claims only: a queue with a handler of
/// its own, whose finishes the database still takes, goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_held_for_room_in_one_lane_leave_the_other_lanes_claiming() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(&refuse(&format!("({FINISHES}) AND NEW.queue = 'default'")))
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload)
             SELECT 'word ' || g FROM generate_series(1, 2) AS g",
        )
        .await
        .unwrap();
    let port = free_port();
    let mut daemon = DaemonProcess::start(
        &db,
        &format!(
            "[worker]\nconcurrency = 2\npoll_interval = \"100ms\"\n\
             queues = [\"default\", \"echo\"]\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [queues.echo]\nhandler = \"exec\"\ncommand = [\"cat\"]\n"
        ),
        &[],
    );
    eventually(WAIT, "two results held", || async {
        let (_, metrics) = get(port, "/metrics").await?;
        let text = metrics.as_str()?.to_string();
        text.contains("pgtaskd_results_held_for_room 2")
            .then_some(())
    })
    .await;
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('echoed', 'echo') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let task = wait_status(&client, id, TaskStatus::Succeeded).await;
    assert_eq!(task.attempt, 1);

    client
        .batch_execute("UPDATE full_disk SET refusing = false")
        .await
        .unwrap();
    for id in 1..=2 {
        let task = wait_status(&client, id, TaskStatus::Succeeded).await;
        assert_eq!((task.attempt, task.words), (1, 2), "task {id}");
    }
    daemon.stop_cleanly().await;
}
