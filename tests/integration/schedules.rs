//! Schedules with no leader (docs/schedules.md): any daemon fires a due schedule, each fire is
//! one task whatever the number of daemons (the database's compare-and-set on the last fire,
//! and the fire's idempotency key), missed fires follow the schedule's rule, `no_overlap`
//! passes over a fire while the previous one's task is queued or running, and a paused
//! schedule makes nothing.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::Barrier;
use tokio_postgres::Client;

use crate::support::daemon::pgtaskd;
use crate::support::{eventually, within, DaemonProcess, TestDb, WAIT};

/// A daemon of one queue that no schedule here uses, so that the scheduled tasks stay QUEUED
/// where a test wants them to.
const CONFIG: &str =
    "[worker]\nqueues = [\"default\"]\nconcurrency = 4\npoll_interval = \"200ms\"\n";

/// The instants of schedule `name`'s tasks, ascending.
async fn fired(client: &Client, name: &str) -> Vec<DateTime<Utc>> {
    within(
        WAIT,
        "the schedule's tasks",
        client.query(
            "SELECT run_at FROM pgtaskd.task_view WHERE idempotency_key LIKE $1 ORDER BY run_at",
            &[&format!("schedule:{name}:%")],
        ),
    )
    .await
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect()
}

async fn add(db: &TestDb, args: &[&str]) {
    let mut all = vec!["schedule", "add"];
    all.extend_from_slice(args);
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &all).await;
    assert!(status.success(), "schedule add {args:?}: {stdout}{stderr}");
}

/// Consecutive instants one second apart, each once.
fn assert_one_per_second(instants: &[DateTime<Utc>]) {
    for pair in instants.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_milliseconds(),
            1000,
            "one task per second, none twice, none left out: {instants:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_every_second_schedule_makes_one_task_a_second_across_three_daemons_and_a_kill() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut daemons: Vec<DaemonProcess> = (0..3)
        .map(|_| DaemonProcess::start(&db, CONFIG, &[]))
        .collect();
    for daemon in &mut daemons {
        daemon.wait_for_log("listening for notifications").await;
    }
    add(&db, &["tick", "--every", "1s", "--queue", "ticks", "hello"]).await;
    eventually(WAIT, "four fires", || async {
        (fired(&client, "tick").await.len() >= 4).then_some(())
    })
    .await;
    // One daemon dies mid-run; the others go on.
    daemons[0].signal(libc::SIGKILL);
    daemons[0].wait().await;
    eventually(WAIT, "ten fires", || async {
        (fired(&client, "tick").await.len() >= 10).then_some(())
    })
    .await;
    let instants = fired(&client, "tick").await;
    assert_one_per_second(&instants);
    // Each fire landed within a second of its instant (one slow look allowed on a busy
    // machine).
    let late: i64 = within(
        WAIT,
        "the fires' delays",
        client.query_one(
            "SELECT count(*) FROM pgtaskd.task_view \
              WHERE idempotency_key LIKE 'schedule:tick:%' AND created_at - run_at > interval '1 second'",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    assert!(late <= 1, "{late} fires more than a second late");
    for daemon in &mut daemons[1..] {
        daemon.signal(libc::SIGTERM);
        assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    }
}

/// Every daemon down for the six instants before the restart: what the first look makes.
async fn after_an_outage(missed: &[&str]) -> (Vec<DateTime<Utc>>, DateTime<Utc>) {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut args = vec!["tick", "--every", "1s", "--queue", "ticks", "--missed"];
    args.extend_from_slice(missed);
    args.push("x");
    add(&db, &args).await;
    // As every daemon stopped for six seconds leaves it: the last fire six instants ago.
    let last: DateTime<Utc> = within(
        WAIT,
        "the outage",
        client.query_one(
            "UPDATE pgtaskd.schedules \
                SET since = date_trunc('second', now()) - interval '1 hour', \
                    last_fire = date_trunc('second', now()) - interval '6 seconds' \
             RETURNING last_fire",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let mut daemon = DaemonProcess::start(&db, CONFIG, &[]);
    // Two looks after the restart: the first one's fires and the next instant's.
    eventually(WAIT, "two looks", || async {
        let moved: Option<DateTime<Utc>> = client
            .query_one("SELECT last_fire FROM pgtaskd.schedules", &[])
            .await
            .ok()?
            .get(0);
        (moved? >= last + chrono::TimeDelta::seconds(8)).then_some(())
    })
    .await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    (fired(&client, "tick").await, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_fires_coalesce_into_one_task_by_default() {
    let (instants, last) = after_an_outage(&["coalesce"]).await;
    let first = instants[0];
    assert!(
        first - last >= chrono::TimeDelta::seconds(6),
        "the six missed instants made one task, at the latest: {instants:?} after {last}"
    );
    assert_one_per_second(&instants);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_fires_catch_up_one_task_each() {
    let (instants, last) = after_an_outage(&["catch-up"]).await;
    assert_eq!(
        instants[0] - last,
        chrono::TimeDelta::seconds(1),
        "the first missed instant has its task: {instants:?}"
    );
    assert!(instants.len() >= 8, "{instants:?}");
    assert_one_per_second(&instants);
}

/// With `--no-overlap`, the missed instants' fire makes one task, the earliest's: each later
/// one would overlap it, and so do the fires after it while it stays QUEUED (queue `ticks`
/// is served by no daemon here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_fires_caught_up_without_overlap_make_one_task() {
    let (instants, last) = after_an_outage(&["catch-up", "--no-overlap"]).await;
    assert_eq!(
        instants,
        [last + chrono::TimeDelta::seconds(1)],
        "one task, the first missed instant's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_fires_are_skipped_with_skip() {
    let (instants, last) = after_an_outage(&["skip"]).await;
    assert!(
        instants[0] - last > chrono::TimeDelta::seconds(6),
        "no task for the missed instants: {instants:?} after {last}"
    );
    assert_one_per_second(&instants);
}

/// Many firers of one instant at once, each through its own session: exactly one makes the
/// fire's task, whatever the interleaving (repeated).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_many_daemons_firing_one_instant_at_once_exactly_one_makes_its_task() {
    let db = TestDb::new().await;
    let setup = db.client().await;
    add(&db, &["race", "--every", "1s", "--queue", "race", "x"]).await;
    let firers = 4;
    let clients: Vec<Arc<Client>> =
        futures_util::future::join_all((0..firers).map(|_| db.client()))
            .await
            .into_iter()
            .map(Arc::new)
            .collect();
    let base: DateTime<Utc> = within(
        WAIT,
        "the base",
        setup.query_one("SELECT date_trunc('second', now()) - interval '1 day'", &[]),
    )
    .await
    .unwrap()
    .get(0);
    within(
        WAIT,
        "the start",
        setup.execute(
            "UPDATE pgtaskd.schedules SET since = $1::timestamptz - interval '1 hour', last_fire = $1",
            &[&base],
        ),
    )
    .await
    .unwrap();
    let since: DateTime<Utc> = within(
        WAIT,
        "the definition's start",
        setup.query_one("SELECT since FROM pgtaskd.schedules", &[]),
    )
    .await
    .unwrap()
    .get(0);
    for round in 1..=50i64 {
        let previous = base + chrono::TimeDelta::seconds(round - 1);
        let instant = base + chrono::TimeDelta::seconds(round);
        let barrier = Arc::new(Barrier::new(firers));
        let tries = clients.iter().map(|client| {
            let client = Arc::clone(client);
            let barrier = Arc::clone(&barrier);
            async move {
                barrier.wait().await;
                pgtaskd::schedule::store::fire(
                    &client,
                    "race",
                    pgtaskd::schedule::store::Previous {
                        last_fire: Some(previous),
                        since,
                    },
                    &[instant],
                    instant,
                )
                .await
                .unwrap()
            }
        });
        let outcomes = within(
            WAIT,
            "a round of fires",
            futures_util::future::join_all(tries),
        )
        .await;
        let made: Vec<_> = outcomes
            .iter()
            .filter(|o| matches!(o, pgtaskd::schedule::store::Fired::Made(ids) if ids.len() == 1))
            .collect();
        let moved = outcomes
            .iter()
            .filter(|o| matches!(o, pgtaskd::schedule::store::Fired::Moved))
            .count();
        assert_eq!(
            (made.len(), moved),
            (1, firers - 1),
            "round {round}: one fire, the others told it moved: {outcomes:?}"
        );
    }
    let instants = fired(&setup, "race").await;
    assert_eq!(instants.len(), 50);
    assert_one_per_second(&instants);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_overlap_passes_over_fires_while_the_last_task_waits_and_a_paused_schedule_makes_none() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut daemon = DaemonProcess::start(&db, CONFIG, &[]);
    // Queue `idle` is served by no daemon: its first task stays QUEUED.
    add(
        &db,
        &[
            "lonely",
            "--every",
            "1s",
            "--queue",
            "idle",
            "--no-overlap",
            "x",
        ],
    )
    .await;
    let first_fire = eventually(WAIT, "the first fire", || async {
        fired(&client, "lonely").await.first().copied()
    })
    .await;
    eventually(WAIT, "three more instants", || async {
        let last: Option<DateTime<Utc>> = client
            .query_one("SELECT last_fire FROM pgtaskd.schedules", &[])
            .await
            .ok()?
            .get(0);
        (last? >= first_fire + chrono::TimeDelta::seconds(3)).then_some(())
    })
    .await;
    assert_eq!(
        fired(&client, "lonely").await,
        [first_fire],
        "no second task while the first is QUEUED"
    );
    assert!(daemon.log_text().contains("schedule fire passed over"));
    // Its task ends: the next fire makes one again.
    within(
        WAIT,
        "the first task canceled",
        client.execute(
            "SELECT pgtaskd.cancel(id) FROM pgtaskd.task_view WHERE idempotency_key LIKE 'schedule:lonely:%'",
            &[],
        ),
    )
    .await
    .unwrap();
    eventually(WAIT, "a second task", || async {
        (fired(&client, "lonely").await.len() == 2).then_some(())
    })
    .await;

    // Paused: no fire; resumed: from now on, nothing made for the paused time.
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["schedule", "pause", "lonely"]).await;
    assert!(status.success(), "{stderr}");
    let paused_at: DateTime<Utc> = within(WAIT, "now", client.query_one("SELECT now()", &[]))
        .await
        .unwrap()
        .get(0);
    within(
        WAIT,
        "the tasks canceled",
        client.execute(
            "SELECT pgtaskd.cancel(id) FROM pgtaskd.task_view WHERE idempotency_key LIKE 'schedule:lonely:%'",
            &[],
        ),
    )
    .await
    .unwrap();
    let (status, stdout, _) = pgtaskd(Some(&db.url), &["schedule", "list"]).await;
    assert!(status.success());
    assert!(stdout.contains("paused"), "{stdout}");
    let before = fired(&client, "lonely").await.len();
    // A look of the daemon after the pause makes nothing: wait for its log's next second by
    // the database's clock, twice over.
    eventually(WAIT, "two seconds paused", || async {
        let now: DateTime<Utc> = client.query_one("SELECT now()", &[]).await.ok()?.get(0);
        (now >= paused_at + chrono::TimeDelta::seconds(2)).then_some(())
    })
    .await;
    assert_eq!(fired(&client, "lonely").await.len(), before, "paused");
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["schedule", "resume", "lonely"]).await;
    assert!(status.success(), "{stderr}");
    eventually(WAIT, "a fire after the resume", || async {
        (fired(&client, "lonely").await.len() == before + 1).then_some(())
    })
    .await;
    let instants = fired(&client, "lonely").await;
    assert!(
        instants[before] > paused_at + chrono::TimeDelta::seconds(2),
        "nothing made for the paused time: {instants:?}"
    );
    // Unknown names are exit 3.
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["schedule", "remove", "nope"]).await;
    assert_eq!(status.code(), Some(3), "{stderr}");
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_added_read_paused_and_removed_over_http() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let config = format!("{CONFIG}\n[http]\nlisten = \"127.0.0.1:0\"\n");
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("HTTP server listening").await;
    let base = format!("http://{}", daemon.http_addr().await);
    let http = reqwest::Client::new();
    let send = |request: reqwest::RequestBuilder| async move {
        within(WAIT, "an HTTP answer", async {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap();
            (status, body)
        })
        .await
    };
    let put = |name: &str, body: serde_json::Value| {
        http.put(format!("{base}/schedules/{name}")).json(&body)
    };
    let (status, body) = send(put(
        "tick",
        serde_json::json!({"every": "1s", "queue": "ticks", "payload": {"report": "daily"}}),
    ))
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["every"], "1s");
    assert_eq!(
        body["payload"], "{\"report\":\"daily\"}",
        "a JSON payload as its text"
    );
    assert!(body["next_fire"].is_string(), "{body}");
    eventually(WAIT, "a fire", || async {
        (!fired(&client, "tick").await.is_empty()).then_some(())
    })
    .await;
    let (status, body) = send(put(
        "tick",
        serde_json::json!({"cron": "0 9 * * MON-FRI", "tz": "Europe/Berlin", "payload": "x", "paused": true}),
    ))
    .await;
    assert_eq!(status, 200, "replaced: {body}");
    assert_eq!(body["paused"], true);
    assert_eq!(body["next_fire"], serde_json::Value::Null);
    let (status, body) = send(http.get(format!("{base}/schedules"))).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["schedules"].as_array().map(Vec::len),
        Some(1),
        "{body}"
    );
    assert_eq!(body["schedules"][0]["cron"], "0 9 * * MON-FRI");
    for (name, definition, words) in [
        (
            "tick",
            serde_json::json!({"cron": "61 * * * *", "payload": "x"}),
            "invalid cron expression",
        ),
        (
            "tick",
            serde_json::json!({"cron": "* * * * *", "tz": "Mars/Base", "payload": "x"}),
            "unknown time zone",
        ),
        (
            "tick",
            serde_json::json!({"every": "1.5s", "payload": "x"}),
            "whole seconds",
        ),
        (
            "tick",
            serde_json::json!({"every": "1s", "cron": "* * * * *", "payload": "x"}),
            "not both",
        ),
        (
            "tick",
            serde_json::json!({"every": "1s", "payload": 5}),
            "\"payload\" must be",
        ),
        (
            "tick",
            serde_json::json!({"every": "1s", "payload": "x", "colour": "red"}),
            "unknown field",
        ),
        (
            "bad name",
            serde_json::json!({"every": "1s", "payload": "x"}),
            "invalid schedule name",
        ),
    ] {
        let (status, body) = send(put(name, definition.clone())).await;
        assert_eq!(status, 400, "{definition}: {body}");
        assert!(
            body["error"].as_str().unwrap_or("").contains(words),
            "{definition}: {body}"
        );
    }
    let (status, _) = send(
        http.put(format!("{base}/schedules/tick"))
            .header("content-type", "text/plain")
            .body("every 1s"),
    )
    .await;
    assert_eq!(status, 400);
    let (status, body) = send(http.get(format!("{base}/schedules/nope"))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("no such schedule"))
    );
    let (status, body) = send(http.delete(format!("{base}/schedules/tick"))).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = send(http.delete(format!("{base}/schedules/tick"))).await;
    assert_eq!(status, 404);
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

/// What would make a schedule fire nothing, or stall the others, is refused or passed over:
/// a rule that never fires, a producer's key of a future fire, a payload over 64 KiB, a
/// schedule row held in someone's open transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_would_stall_or_forge_a_schedule_is_refused_or_passed_over() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // A rule with no date at all: refused before anything is written.
    let (status, _, stderr) = pgtaskd(
        Some(&db.url),
        &[
            "schedule",
            "add",
            "never",
            "--cron",
            "0 0 31 4,6,9,11 *",
            "x",
        ],
    )
    .await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("never fires"), "{stderr}");
    // A field of no values: refused at once (its search for a fire ran for 90 s).
    let (status, _, stderr) = within(
        WAIT,
        "an empty list element refused",
        pgtaskd(
            Some(&db.url),
            &["schedule", "add", "empty", "--cron", ", * * * *", "x"],
        ),
    )
    .await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("empty list element"), "{stderr}");
    let big = "x".repeat(64 * 1024 + 1);
    let (status, _, stderr) = pgtaskd(
        Some(&db.url),
        &["schedule", "add", "big", "--every", "1s", &big],
    )
    .await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("at most 65536 bytes"), "{stderr}");
    // A producer's key of a fire: refused by the CLI and by the table, for a producer role.
    let (status, _, stderr) = pgtaskd(
        Some(&db.url),
        &[
            "enqueue",
            "--queue",
            "ticks",
            "--key",
            "schedule:tick:2099-01-01T00:00:00Z",
            "evil",
        ],
    )
    .await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    let producer = format!("sched_producer_{:08x}", fastrand::u32(..));
    within(
        WAIT,
        "a producer role",
        client.batch_execute(&format!(
            "CREATE ROLE {producer}; SELECT pgtaskd.grant_producer('{producer}');"
        )),
    )
    .await
    .unwrap();
    let refused = within(
        WAIT,
        "a producer's insert of a fire's key",
        client.batch_execute(&format!(
            "SET ROLE {producer}; \
             INSERT INTO pgtaskd.tasks (payload, queue, idempotency_key) \
             VALUES ('evil', 'ticks', 'schedule:tick:2099-01-01T00:00:00Z');"
        )),
    )
    .await
    .expect_err("the table refuses it");
    assert!(
        format!("{refused:?}").contains("kept for the fires of schedules"),
        "{refused:?}"
    );
    within(WAIT, "back", client.batch_execute("RESET ROLE"))
        .await
        .unwrap();
    // The site id is kept.
    let deleted = within(
        WAIT,
        "a delete",
        client.batch_execute("DELETE FROM pgtaskd.site"),
    )
    .await;
    assert!(
        format!("{deleted:?}").contains("first part of every task key"),
        "{deleted:?}"
    );

    // One schedule's row held in an open transaction; the other keeps firing every second.
    add(&db, &["held", "--every", "1s", "--queue", "ticks", "x"]).await;
    add(&db, &["tick", "--every", "1s", "--queue", "ticks", "x"]).await;
    let mut daemon = DaemonProcess::start(&db, CONFIG, &[]);
    eventually(WAIT, "both firing", || async {
        (!fired(&client, "held").await.is_empty() && !fired(&client, "tick").await.is_empty())
            .then_some(())
    })
    .await;
    let mut holder = db.client().await;
    let hold = within(WAIT, "a transaction", holder.transaction())
        .await
        .unwrap();
    within(
        WAIT,
        "the row held",
        hold.batch_execute("SELECT * FROM pgtaskd.schedules WHERE name = 'held' FOR UPDATE"),
    )
    .await
    .unwrap();
    let before = fired(&client, "tick").await.len();
    eventually(WAIT, "four more fires of the other", || async {
        (fired(&client, "tick").await.len() >= before + 4).then_some(())
    })
    .await;
    drop(hold);
    assert_one_per_second(&fired(&client, "tick").await);
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

/// A fire the database refuses (here a site's trigger refusing the schedule's payload) is
/// that schedule's alone: the schedules after it fire all the same, and the refusal is logged
/// with the schedule's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_whose_fire_the_database_refuses_leaves_the_others_firing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    within(
        WAIT,
        "a site's trigger",
        client.batch_execute(
            "CREATE FUNCTION public.refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'refused by a site rule'; END $$;
             CREATE TRIGGER refuse_boom BEFORE INSERT ON pgtaskd.tasks FOR EACH ROW
                 WHEN (NEW.payload = 'boom') EXECUTE FUNCTION public.refuse_boom();",
        ),
    )
    .await
    .unwrap();
    // Looked at first: the names are read in order.
    add(
        &db,
        &["aaa-boom", "--every", "1s", "--queue", "ticks", "boom"],
    )
    .await;
    add(&db, &["tick", "--every", "1s", "--queue", "ticks", "x"]).await;
    let mut daemon = DaemonProcess::start(&db, CONFIG, &[]);
    eventually(WAIT, "three fires of the other schedule", || async {
        (fired(&client, "tick").await.len() >= 3).then_some(())
    })
    .await;
    assert_one_per_second(&fired(&client, "tick").await);
    assert!(fired(&client, "aaa-boom").await.is_empty());
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(
        log.contains("the database refused its fire") && log.contains("aaa-boom"),
        "{log}"
    );
}

/// A schedule added again with the same definition (a deploy that adds its schedules at each
/// start) keeps its `since`, so its missed fires are not lost; a changed definition, or a
/// resume, counts from then.
#[tokio::test]
async fn adding_the_same_definition_again_keeps_its_fires_and_a_change_counts_from_then() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let since = || async {
        let since: DateTime<Utc> = within(
            WAIT,
            "since",
            client.query_one(
                "SELECT since FROM pgtaskd.schedules WHERE name = 'tick'",
                &[],
            ),
        )
        .await
        .unwrap()
        .get(0);
        since
    };
    add(&db, &["tick", "--every", "1m", "--queue", "ticks", "x"]).await;
    let first = since().await;
    add(&db, &["tick", "--every", "1m", "--queue", "ticks", "x"]).await;
    assert_eq!(since().await, first, "the same definition again");
    add(&db, &["tick", "--every", "1m", "--queue", "ticks", "y"]).await;
    let changed = since().await;
    assert!(changed > first, "a changed payload counts from then");
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["schedule", "pause", "tick"]).await;
    assert!(status.success(), "{stderr}");
    // `schedule add` keeps a paused schedule paused; the SQL function may resume it.
    add(&db, &["tick", "--every", "1m", "--queue", "ticks", "y"]).await;
    assert_eq!(since().await, changed, "still paused, unchanged");
    within(
        WAIT,
        "a resume through put_schedule",
        client.execute(
            "SELECT pgtaskd.put_schedule('tick', NULL, interval '1 minute', 'y', 'ticks', \
             paused => false)",
            &[],
        ),
    )
    .await
    .unwrap();
    assert!(since().await > changed, "a resume counts from then");
}

/// A hundred schedules written through SQL with rules of no date (the 30th of February): the
/// parser takes tens of milliseconds to refuse each, and a daemon that read them on its one
/// thread held its heartbeats up for seconds, long enough for its leases to run out and its
/// tasks to run twice. The rules are read off the runtime's thread: while the daemon reads
/// them, the lease of a task it runs never falls behind the database's clock.
#[tokio::test]
async fn a_hundred_rules_of_no_date_hold_up_no_lease_while_a_daemon_reads_them() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let config = "[worker]\nqueues = [\"slow\"]\nconcurrency = 1\npoll_interval = \"200ms\"\n\
                  lease = \"3s\"\n\
                  [queues.slow]\nhandler = \"exec\"\ncommand = [\"sleep\", \"600\"]\n";
    let mut daemon = DaemonProcess::start(&db, config, &[]);
    let id: i64 = within(
        WAIT,
        "a task that runs until the end",
        client.query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('slow', 'x') RETURNING id",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let running = "SELECT status = 'RUNNING' AND lease_expires_at > clock_timestamp() \
                   FROM pgtaskd.task_view WHERE id = $1";
    eventually(WAIT, "the task running", || async {
        let row = client.query_one(running, &[&id]).await.ok()?;
        row.get::<_, bool>(0).then_some(())
    })
    .await;
    within(
        WAIT,
        "a hundred rules of no date",
        client.execute(
            "SELECT count(pgtaskd.put_schedule('nodate-' || lpad(n::text, 3, '0'), \
                    (n % 60) || ' ' || (n / 60) || ' 30 2 *', NULL::interval, 'x', 'q', 'UTC')) \
               FROM generate_series(0, 99) AS n",
            &[],
        ),
    )
    .await
    .unwrap();
    // Until the daemon warned of the last of them (they are read in name order), the task's
    // lease is always ahead of the clock.
    let mut looks = 0;
    within(WAIT * 4, "the daemon reading every rule", async {
        while !daemon.log_text().contains("nodate-099") {
            let ahead: bool = client.query_one(running, &[&id]).await.unwrap().get(0);
            assert!(
                ahead,
                "after {looks} looks the lease of task {id} fell behind the clock:\n{}",
                daemon.log_text()
            );
            looks += 1;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        daemon.log_text().contains("never fires"),
        "{}",
        daemon.log_text()
    );
    within(
        WAIT,
        "the task canceled",
        client.execute("SELECT pgtaskd.cancel($1)", &[&id]),
    )
    .await
    .unwrap();
    daemon.stop_cleanly().await;
}
