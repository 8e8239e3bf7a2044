//! Idle flags (docs/design.md, "Idle flags"): inserts notify only while some daemon waits for
//! work. A daemon flags itself while it idles and clears the flag while it works; a killed
//! daemon's flag expires; an idle daemon is woken by the notification, a busy one finds the
//! task by itself, a producer transaction open while the daemon went idle is found when it
//! commits, a lost flag is covered by the poll tick; producers need no right on the flags;
//! `DISABLE TRIGGER tasks_notify` still stops every notification.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pgtaskd::analyzer::{AnalyzeError, Analyzer, Counts};
use pgtaskd::db::listen::{forward_messages, TASKS_CHANNEL};
use pgtaskd::queue::TaskStatus;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};
use tokio_util::sync::CancellationToken;

use crate::support::{
    count, enqueue, eventually, wait_status, within, Cluster, DaemonProcess, InProcessDaemon,
    TestDb, WAIT,
};

/// One worker, and a poll tick far longer than any wait of these tests: a task claimed within
/// [`PROMPT`] was found by a notification or by the daemon itself, never by the tick. The
/// byte budget is smaller than a held text ([`held`]), so that a daemon running one has no
/// room for another task however fast the others ran (it would otherwise claim ahead).
const LONG_POLL: &str =
    "[worker]\nconcurrency = 1\npoll_interval = \"30s\"\nmax_inflight_bytes = 16\n";
const LONG_POLL_INTERVAL: Duration = Duration::from_secs(30);
/// Well under the 30 s poll interval, with room for a loaded machine.
const PROMPT: Duration = Duration::from_secs(10);
const ROUNDS: usize = 20;

const LIVE_FLAGS: &str = "SELECT count(*) FROM pgtaskd.idle_daemons WHERE expires_at > now()";

/// A text the [`RoundGate`] holds, longer than the byte budget of [`LONG_POLL`].
fn held(round: usize) -> String {
    format!("hold-{round:02}-of-the-idle-notify-tests")
}

/// Holds the texts that start with `hold-` until the test releases them one by one (or all
/// at once, when dropped); every other text passes at once. Counts nothing: the tests read
/// the rows.
#[derive(Default)]
struct RoundGate {
    released: Mutex<(HashSet<String>, bool)>,
    changed: Condvar,
}

impl RoundGate {
    fn release(&self, text: &str) {
        self.released.lock().unwrap().0.insert(text.to_string());
        self.changed.notify_all();
    }

    fn release_all(&self) {
        self.released.lock().unwrap().1 = true;
        self.changed.notify_all();
    }
}

impl Analyzer for RoundGate {
    fn analyze(&self, text: &str, cancel: &CancellationToken) -> Result<Counts, AnalyzeError> {
        if text.starts_with("hold-") {
            let mut released = self.released.lock().unwrap();
            while !released.1 && !released.0.contains(text) {
                if cancel.is_cancelled() {
                    return Err(AnalyzeError::Canceled {
                        partial: Counts::default(),
                    });
                }
                released = self
                    .changed
                    .wait_timeout(released, Duration::from_millis(5))
                    .unwrap()
                    .0;
            }
        }
        Ok(pgtaskd::analyzer::analyze(text))
    }
}

/// Releases every held text when dropped, so that a failing test still stops its daemon.
struct ReleaseOnDrop(Arc<RoundGate>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release_all();
    }
}

/// A session of the test's own that LISTENs on `pgtaskd_tasks`, and its notifications.
async fn listening(url: &str) -> (Client, mpsc::Receiver<AsyncMessage>, impl Drop) {
    let (client, connection) = within(WAIT, "a connection", tokio_postgres::connect(url, NoTls))
        .await
        .unwrap();
    let (messages, guard) = forward_messages(connection);
    client
        .batch_execute(&format!("LISTEN {TASKS_CHANNEL}"))
        .await
        .unwrap();
    (client, messages, guard)
}

/// Whether `producer`'s earlier commits sent `pgtaskd_tasks`: `producer` sends a marker
/// notification of its own, and notifications arrive in commit order, so whatever came
/// before the marker was sent before it.
async fn notified_before_marker(
    producer: &Client,
    messages: &mut mpsc::Receiver<AsyncMessage>,
    marker: &str,
) -> bool {
    producer
        .batch_execute(&format!("NOTIFY {TASKS_CHANNEL}, '{marker}'"))
        .await
        .unwrap();
    let mut notified = false;
    loop {
        match within(WAIT, "the marker notification", messages.recv()).await {
            Some(AsyncMessage::Notification(n)) if n.payload() == marker => return notified,
            Some(AsyncMessage::Notification(n)) if n.channel() == TASKS_CHANNEL => notified = true,
            Some(_) => {}
            None => panic!("the listening session closed"),
        }
    }
}

async fn wait_flags(client: &Client, want: i64, what: &str) {
    eventually(WAIT, what, || async move {
        (count(client, LIVE_FLAGS).await == want).then_some(())
    })
    .await;
}

/// Wait until `want` daemons (of a poll interval of `poll`) are flagged idle by flags written
/// after the latest claim: a flag written before it may still be on its way out.
async fn wait_idle(client: &Client, want: i64, poll: Duration) {
    let ttl = pgtaskd::worker::idle_flag_ttl(poll).as_secs_f64();
    eventually(WAIT, "the daemons to flag themselves idle", || async move {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pgtaskd.idle_daemons
                  WHERE expires_at > now()
                    AND expires_at > coalesce((SELECT max(started_at) FROM pgtaskd.tasks),
                                              '-infinity') + $1 * interval '1 second'",
                &[&ttl],
            )
            .await
            .unwrap()
            .get(0);
        (n == want).then_some(())
    })
    .await;
}

/// Insert `payload` and check, with a marker, whether the insert notified.
async fn insert_notifies(
    producer: &Client,
    messages: &mut mpsc::Receiver<AsyncMessage>,
    payload: &str,
) -> (i64, bool) {
    let id = enqueue(producer, payload).await;
    let notified = notified_before_marker(producer, messages, &format!("marker {payload}")).await;
    (id, notified)
}

/// Once `idle` daemons are flagged, insert the round's held task: the insert notifies, and
/// a daemon starts the task, whose analyzer then waits at the gate. Returns its text and id.
async fn start_held_task(
    owner: &Client,
    producer: &Client,
    messages: &mut mpsc::Receiver<AsyncMessage>,
    round: usize,
    idle: i64,
) -> (String, i64) {
    wait_idle(owner, idle, LONG_POLL_INTERVAL).await;
    let held = held(round);
    let (busy, notified) = insert_notifies(producer, messages, &held).await;
    assert!(
        notified,
        "round {round}: the first insert finds {idle} daemon(s) flagged idle"
    );
    within(
        PROMPT,
        "the held task to start",
        wait_status(owner, busy, TaskStatus::Running),
    )
    .await;
    (held, busy)
}

async fn wait_done_promptly(client: &Client, id: i64, what: &str) {
    within(PROMPT, what, wait_status(client, id, TaskStatus::Succeeded)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_while_the_daemon_idles_notifies_and_is_claimed_at_once() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let (producer, mut messages, _guard) = listening(&db.url).await;
    let gate = Arc::new(RoundGate::default());
    let _release = ReleaseOnDrop(gate.clone());
    let daemon = InProcessDaemon::start(&db, db.config(LONG_POLL), gate).await;
    for round in 0..ROUNDS {
        wait_idle(&owner, 1, LONG_POLL_INTERVAL).await;
        let started = Instant::now();
        let (id, notified) =
            insert_notifies(&producer, &mut messages, &format!("idle {round}")).await;
        assert!(
            notified,
            "round {round}: an insert while the daemon idles notifies"
        );
        wait_done_promptly(&owner, id, "the idle daemon to run the task").await;
        assert!(
            started.elapsed() < PROMPT,
            "round {round}: claimed through the notification, not the 30 s poll tick"
        );
    }
    daemon.stop().await;
    assert_eq!(
        count(&owner, "SELECT count(*) FROM pgtaskd.idle_daemons").await,
        0,
        "a stopping daemon removes its flag"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_daemon_clears_its_flag_and_finds_inserts_without_a_notification() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let (producer, mut messages, _guard) = listening(&db.url).await;
    let gate = Arc::new(RoundGate::default());
    let _release = ReleaseOnDrop(gate.clone());
    let daemon = InProcessDaemon::start(&db, db.config(LONG_POLL), gate.clone()).await;
    for round in 0..ROUNDS {
        let (held, busy) = start_held_task(&owner, &producer, &mut messages, round, 1).await;
        // Its one worker is taken: the claim loop waits for room, its flag is gone.
        wait_flags(&owner, 0, "the busy daemon to clear its flag").await;
        let (later, notified) =
            insert_notifies(&producer, &mut messages, &format!("while busy {round}")).await;
        assert!(
            !notified,
            "round {round}: an insert while every daemon is busy does not notify"
        );
        gate.release(&held);
        wait_done_promptly(&owner, busy, "the held task to finish").await;
        wait_done_promptly(
            &owner,
            later,
            "the busy daemon to find the later task by itself",
        )
        .await;
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_daemon_is_woken_while_another_is_busy() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let (producer, mut messages, _guard) = listening(&db.url).await;
    let gate = Arc::new(RoundGate::default());
    let _release = ReleaseOnDrop(gate.clone());
    let first = InProcessDaemon::start(&db, db.config(LONG_POLL), gate.clone()).await;
    let second = InProcessDaemon::start(&db, db.config(LONG_POLL), gate.clone()).await;
    crate::support::daemon::wait_listening(&db, 2).await;
    for round in 0..ROUNDS / 2 {
        let (held, busy) = start_held_task(&owner, &producer, &mut messages, round, 2).await;
        wait_flags(&owner, 1, "the busy daemon to clear its flag").await;
        let started = Instant::now();
        let (id, notified) =
            insert_notifies(&producer, &mut messages, &format!("other {round}")).await;
        assert!(
            notified,
            "round {round}: the other daemon idles, so the insert notifies"
        );
        wait_done_promptly(&owner, id, "the idle daemon to run the task").await;
        assert!(
            started.elapsed() < PROMPT,
            "round {round}: not left to the poll tick"
        );
        gate.release(&held);
        wait_done_promptly(&owner, busy, "the held task to finish").await;
    }
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_open_when_the_daemon_went_idle_is_found_when_it_commits() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let (producer, mut messages, _guard) = listening(&db.url).await;
    let long = db.client().await;
    let gate = Arc::new(RoundGate::default());
    let _release = ReleaseOnDrop(gate.clone());
    let daemon = InProcessDaemon::start(&db, db.config(LONG_POLL), gate.clone()).await;
    for round in 0..ROUNDS / 2 {
        let (held, busy) = start_held_task(&owner, &producer, &mut messages, round, 1).await;
        wait_flags(&owner, 0, "the busy daemon to clear its flag").await;
        // A producer's transaction inserts while the daemon is busy (its trigger sees no
        // flag), and stays open while the daemon finishes, finds nothing and goes idle.
        long.batch_execute("BEGIN").await.unwrap();
        let late: i64 = long
            .query_one(
                "INSERT INTO pgtaskd.tasks (payload) VALUES ($1) RETURNING id",
                &[&format!("late {round}")],
            )
            .await
            .unwrap()
            .get(0);
        gate.release(&held);
        wait_done_promptly(&owner, busy, "the held task to finish").await;
        wait_idle(&owner, 1, LONG_POLL_INTERVAL).await;
        long.batch_execute("COMMIT").await.unwrap();
        assert!(
            !notified_before_marker(&long, &mut messages, &format!("marker late {round}")).await,
            "round {round}: the insert read the flags while the daemon was busy: no notification"
        );
        wait_done_promptly(
            &owner,
            late,
            "the daemon, watching the transactions open when it went idle, to find the task",
        )
        .await;
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_flag_leaves_the_task_to_the_poll_tick() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let (producer, mut messages, _guard) = listening(&db.url).await;
    let config = "[worker]\nconcurrency = 1\npoll_interval = \"1s\"\n";
    let daemon =
        InProcessDaemon::start(&db, db.config(config), Arc::new(RoundGate::default())).await;
    for round in 0..3 {
        wait_idle(&owner, 1, Duration::from_secs(1)).await;
        // As a crash of the server would: the unlogged table is emptied behind its back.
        owner
            .batch_execute("DELETE FROM pgtaskd.idle_daemons")
            .await
            .unwrap();
        let (id, notified) =
            insert_notifies(&producer, &mut messages, &format!("unflagged {round}")).await;
        assert!(!notified, "round {round}: no live flag, no notification");
        wait_done_promptly(&owner, id, "the poll tick to find the task: nothing lost").await;
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemons_flag_expires() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let (producer, mut messages, _guard) = listening(&db.url).await;
    // A flag lives two poll intervals and a second: 3 s here.
    let mut daemon = DaemonProcess::start(&db, "[worker]\npoll_interval = \"1s\"\n", &[]);
    wait_flags(&owner, 1, "the daemon to flag itself idle").await;
    daemon.signal(libc::SIGKILL);
    daemon.wait().await;
    assert_eq!(
        count(&owner, "SELECT count(*) FROM pgtaskd.idle_daemons").await,
        1,
        "a killed daemon leaves its flag behind"
    );
    within(
        Duration::from_secs(10),
        "the stale flag to expire",
        wait_flags(&owner, 0, "expiry"),
    )
    .await;
    let (_, notified) = insert_notifies(&producer, &mut messages, "after the expiry").await;
    assert!(!notified, "an expired flag makes no insert notify");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_the_trigger_still_stops_every_notification() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let (producer, mut messages, _guard) = listening(&db.url).await;
    let daemon =
        InProcessDaemon::start(&db, db.config(LONG_POLL), Arc::new(RoundGate::default())).await;
    wait_flags(&owner, 1, "the daemon to flag itself idle").await;
    owner
        .batch_execute("ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify")
        .await
        .unwrap();
    let (unnotified, notified) =
        insert_notifies(&producer, &mut messages, "trigger disabled").await;
    assert!(!notified, "a disabled trigger notifies nobody, idle or not");
    owner
        .batch_execute("ALTER TABLE pgtaskd.tasks ENABLE TRIGGER tasks_notify")
        .await
        .unwrap();
    // The daemon may find that task by itself at any moment (its watch of the transactions
    // open cluster-wide when it went idle scans again at any of their commits), and a claim
    // then would take its flag away from the next insert: the task is cancelled, and has
    // ended, before the daemon is seen idle again.
    owner
        .execute("SELECT pgtaskd.cancel($1)", &[&unnotified])
        .await
        .unwrap();
    eventually(WAIT, "the unnotified task to end", || async {
        pgtaskd::queue::get(&owner, unnotified)
            .await
            .unwrap()
            .filter(|t| t.status.is_terminal())
    })
    .await;
    wait_idle(&owner, 1, LONG_POLL_INTERVAL).await;
    let (id, notified) = insert_notifies(&producer, &mut messages, "trigger enabled").await;
    assert!(notified, "enabled again, it notifies");
    wait_done_promptly(&owner, id, "the task").await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_with_only_insert_on_the_table_notifies_an_idle_daemon() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    owner
        .batch_execute(
            "CREATE ROLE inserter LOGIN;
             GRANT USAGE ON SCHEMA pgtaskd TO inserter;
             GRANT INSERT (payload) ON pgtaskd.tasks TO inserter;",
        )
        .await
        .unwrap();
    let url = db.url.replace("user=postgres", "user=inserter");
    assert_ne!(url, db.url, "the test URL names the user");
    let (producer, mut messages, _guard) = listening(&url).await;
    let denied = producer
        .query("SELECT count(*) FROM pgtaskd.idle_daemons", &[])
        .await
        .expect_err("a producer cannot read the flags");
    assert_eq!(
        denied.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{denied:?}"
    );
    let daemon =
        InProcessDaemon::start(&db, db.config(LONG_POLL), Arc::new(RoundGate::default())).await;
    wait_flags(&owner, 1, "the daemon to flag itself idle").await;
    producer
        .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('no rights on the flags')")
        .await
        .unwrap();
    assert!(
        notified_before_marker(&producer, &mut messages, "marker").await,
        "the trigger reads the flags with its owner's rights"
    );
    let id = count(&owner, "SELECT max(id) FROM pgtaskd.tasks").await;
    wait_done_promptly(&owner, id, "the task").await;
    daemon.stop().await;
}

/// A daemon goes idle and busy up to once per task at some rates: its flag must not leave a
/// dead row version behind that only `VACUUM` takes away, since every INSERT's trigger reads
/// every page of the table. Autovacuum is off for the table here, as it is on some servers.
/// On a cluster of its own: a transaction that holds a transaction id anywhere on the server
/// (another test's database included) keeps every later row version from being pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_busy_turns_leave_the_flags_table_at_one_page() {
    const TURNS: usize = 5_000;
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    owner
        .batch_execute("ALTER TABLE pgtaskd.idle_daemons SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let daemon = db.client().await;
    let ttl = Duration::from_secs(5);
    within(WAIT * 6, "the idle and busy turns", async {
        for turn in 0..TURNS {
            pgtaskd::queue::flag_idle(&daemon, "turning-daemon", ttl)
                .await
                .unwrap();
            if turn == TURNS - 1 {
                assert_eq!(count(&owner, LIVE_FLAGS).await, 1, "flagged: live");
            }
            pgtaskd::queue::clear_idle(&daemon, "turning-daemon")
                .await
                .unwrap();
        }
    })
    .await;
    assert_eq!(count(&owner, LIVE_FLAGS).await, 0, "busy: not live");
    let pages = count(
        &owner,
        "SELECT pg_relation_size('pgtaskd.idle_daemons') / current_setting('block_size')::bigint",
    )
    .await;
    assert!(
        pages <= 2,
        "{TURNS} idle and busy turns left the flags table at {pages} pages"
    );
    pgtaskd::queue::remove_idle(&daemon, "turning-daemon")
        .await
        .unwrap();
    assert_eq!(
        count(&owner, "SELECT count(*) FROM pgtaskd.idle_daemons").await,
        0,
        "a stopping daemon's goodbye deletes its row"
    );
}

/// The trigger's function runs with its owner's rights and sets no search_path of its own
/// (schema 10: setting one on every call cost a fifth of the producers' commits), so it names
/// every function and operator it uses. A producer whose search_path puts its own `now()`,
/// `pg_notify` and `>` first must not get them called with the owner's rights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_search_path_cannot_reach_into_the_trigger() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    owner
        .batch_execute(
            "CREATE ROLE mallory LOGIN;
             SELECT pgtaskd.grant_producer('mallory');
             CREATE SCHEMA mallory AUTHORIZATION mallory;
             INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
             VALUES ('a-flagged-daemon', now() + interval '1 hour');",
        )
        .await
        .unwrap();
    let url = db.url.replace("user=postgres", "user=mallory");
    assert_ne!(url, db.url, "the test URL names the user");
    let (producer, mut messages, _guard) = listening(&url).await;
    producer
        .batch_execute(
            "CREATE FUNCTION mallory.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'now() hijacked as %', current_user; END $$;
             CREATE FUNCTION mallory.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'pg_notify hijacked as %', current_user; END $$;
             CREATE FUNCTION mallory.later(timestamptz, timestamptz) RETURNS boolean
             LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION '> hijacked as %', current_user; END $$;
             CREATE OPERATOR mallory.> (
                 LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = mallory.later);
             SET search_path = mallory, pg_catalog;",
        )
        .await
        .unwrap();
    // The traps are armed: unqualified names reach them in this session.
    for (sql, trap) in [
        ("SELECT now()", "now() hijacked"),
        ("SELECT pg_notify('x', '')", "pg_notify hijacked"),
        ("SELECT now() > now()", "hijacked"),
    ] {
        let err = producer
            .batch_execute(sql)
            .await
            .expect_err("the producer's own objects come first");
        assert!(format!("{err:?}").contains(trap), "{sql}: {err:?}");
    }
    producer
        .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('past the traps')")
        .await
        .expect("the trigger calls none of the producer's objects");
    assert!(
        notified_before_marker(&producer, &mut messages, "marker").await,
        "with a live flag, the insert notified through pg_catalog's pg_notify"
    );
}

/// How many times the trigger's function ran for one INSERT of `producer`'s, counted in a
/// transaction that is then rolled back (`track_functions`; the view also shows counts of
/// earlier transactions not yet reported, so the count is taken before and after).
async fn function_calls_of_an_insert(producer: &Client) -> i64 {
    const CALLS: &str = "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions
                          WHERE schemaname = 'pgtaskd' AND funcname = 'notify_tasks'";
    within(WAIT, "a counted insert", async {
        producer
            .batch_execute("BEGIN; SET LOCAL track_functions = 'pl'")
            .await
            .unwrap();
        let before = count(producer, CALLS).await;
        producer
            .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('counted')")
            .await
            .unwrap();
        let after = count(producer, CALLS).await;
        producer.batch_execute("ROLLBACK").await.unwrap();
        after - before
    })
    .await
}

const HOUR: Duration = Duration::from_secs(3600);

/// Flag each of `instances` idle for an hour, from `client`.
async fn flag_for_an_hour(client: &Client, instances: &[&str]) {
    within(WAIT, "the flags", async {
        for instance in instances {
            pgtaskd::queue::flag_idle(client, instance, HOUR)
                .await
                .unwrap();
        }
    })
    .await;
}

/// The starting point of each round: `daemon-b` idle (on `b`), `daemon-a` busy (on `a`).
async fn b_idle_a_busy(a: &Client, b: &Client) {
    flag_for_an_hour(b, &["daemon-b"]).await;
    within(
        WAIT,
        "daemon-a busy",
        pgtaskd::queue::clear_idle(a, "daemon-a"),
    )
    .await
    .unwrap();
}

/// Schema 14: the trigger's `WHEN` reads `pgtaskd.idle_until`, which every write of a flag
/// sets from the flags table, so the function runs only while some flag is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_calls_the_triggers_function_only_while_a_flag_is_live() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let daemon = db.client().await;
    assert_eq!(function_calls_of_an_insert(&owner).await, 0, "no flag yet");
    flag_for_an_hour(&daemon, &["daemon-a", "daemon-b"]).await;
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        1,
        "two live flags"
    );
    within(WAIT, "a cleared flag", async {
        pgtaskd::queue::clear_idle(&daemon, "daemon-a")
            .await
            .unwrap()
    })
    .await;
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        1,
        "the other flag still counts"
    );
    within(WAIT, "the other flag removed", async {
        pgtaskd::queue::remove_idle(&daemon, "daemon-b")
            .await
            .unwrap()
    })
    .await;
    assert_eq!(function_calls_of_an_insert(&owner).await, 0, "no live flag");
    // A flag that expires by itself (a killed daemon's) stops counting with no write.
    within(WAIT, "a short flag", async {
        pgtaskd::queue::flag_idle(&daemon, "daemon-a", Duration::from_secs(2))
            .await
            .unwrap()
    })
    .await;
    eventually(WAIT, "the short flag to expire", || async {
        (function_calls_of_an_insert(&owner).await == 0).then_some(())
    })
    .await;
    // An operator's DELETE counts as a write too.
    within(WAIT, "a flag, then the operator's delete", async {
        pgtaskd::queue::flag_idle(&daemon, "daemon-a", HOUR)
            .await
            .unwrap();
        assert_eq!(function_calls_of_an_insert(&owner).await, 1);
        owner
            .batch_execute("DELETE FROM pgtaskd.idle_daemons")
            .await
            .unwrap();
    })
    .await;
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        0,
        "flags deleted"
    );
}

/// Two daemons, one going idle while the other goes busy, each a write of the flags whose
/// trigger sets `pgtaskd.idle_until` from the flags it sees: the idle one's flag must count
/// whichever commits last. Forced both ways (the later writer tries for the earlier one's
/// turn while its transaction is open), then raced freely behind a barrier, 30 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_going_idle_while_another_goes_busy_keeps_its_flag_counted() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let a = Arc::new(db.client().await);
    let b = Arc::new(db.client().await);
    // The turn is tried without waiting, every 10 ms for at most half a second.
    let waiting_for_its_turn = "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event = 'PgSleep'";
    for busy_first in [true, false] {
        b_idle_a_busy(&a, &b).await;
        // The first writer's transaction stays open with its turn taken.
        let (first, first_sql) = if busy_first {
            (&b, "UPDATE pgtaskd.idle_daemons SET expires_at = '-infinity' WHERE instance = 'daemon-b'")
        } else {
            (
                &a,
                "INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
                  VALUES ('daemon-a', now() + interval '1 hour')
                  ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at",
            )
        };
        within(WAIT, "the first write", async {
            first.batch_execute("BEGIN").await.unwrap();
            first.batch_execute(first_sql).await.unwrap();
        })
        .await;
        let second = if busy_first {
            let a = a.clone();
            tokio::spawn(async move {
                pgtaskd::queue::flag_idle(&a, "daemon-a", HOUR)
                    .await
                    .map(|_| ())
            })
        } else {
            let b = b.clone();
            tokio::spawn(async move { pgtaskd::queue::clear_idle(&b, "daemon-b").await })
        };
        eventually(WAIT, "the second writer to wait for its turn", || async {
            (count(&owner, waiting_for_its_turn).await == 1).then_some(())
        })
        .await;
        within(WAIT, "the first commit", first.batch_execute("COMMIT"))
            .await
            .unwrap();
        within(WAIT, "the second write", second)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            count(&owner, LIVE_FLAGS).await,
            1,
            "busy first: {busy_first}"
        );
        assert_eq!(
            function_calls_of_an_insert(&owner).await,
            1,
            "busy first: {busy_first}: the idle daemon's flag counts"
        );
    }
    for round in 0..30 {
        b_idle_a_busy(&a, &b).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let idle = {
            let (a, barrier) = (a.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                pgtaskd::queue::flag_idle(&a, "daemon-a", HOUR)
                    .await
                    .map(|_| ())
            })
        };
        let busy = {
            let (b, barrier) = (b.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                pgtaskd::queue::clear_idle(&b, "daemon-b").await
            })
        };
        within(WAIT, "both writes", async {
            idle.await.unwrap().unwrap();
            busy.await.unwrap().unwrap();
        })
        .await;
        assert_eq!(
            function_calls_of_an_insert(&owner).await,
            1,
            "round {round}: the idle daemon's flag counts"
        );
    }
}

/// The trigger's condition reads `pgtaskd.idle_until`, granted to PUBLIC. Where that grant
/// was revoked, a producer still inserts; its inserts just never notify (the daemons find
/// them at their poll tick), while a role that may read it still notifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_that_may_not_read_the_idle_hint_still_inserts() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    within(
        WAIT,
        "the role",
        owner.batch_execute(
            "CREATE ROLE unhinted LOGIN;
             SELECT pgtaskd.grant_producer('unhinted');
             REVOKE SELECT ON SEQUENCE pgtaskd.idle_until FROM PUBLIC;
             INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
             VALUES ('a-flagged-daemon', now() + interval '1 hour');",
        ),
    )
    .await
    .unwrap();
    let url = db.url.replace("user=postgres", "user=unhinted");
    assert_ne!(url, db.url, "the test URL names the user");
    let (producer, mut messages, _guard) = listening(&url).await;
    within(
        WAIT,
        "the unhinted insert",
        producer.batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('unhinted')"),
    )
    .await
    .expect("a role without SELECT on the sequence still inserts");
    assert!(
        !notified_before_marker(&producer, &mut messages, "marker unhinted").await,
        "its insert does not notify"
    );
    let (_, notified) = insert_notifies(&owner, &mut messages, "hinted").await;
    assert!(notified, "the owner's insert, with a live flag, notifies");
}

/// The turn is taken before any row is locked and never waited for long: an operator's
/// transaction that writes two flags does not deadlock with a daemon's write between them,
/// and one that holds the flags table's `SHARE UPDATE EXCLUSIVE` lock (an `ANALYZE` left open)
/// delays a daemon's flag by about half a second, not its lock timeout, and the flag still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_never_deadlocks_and_never_stalls_a_flag() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let operator = db.client().await;
    let daemon = Arc::new(db.client().await);
    flag_for_an_hour(&daemon, &["daemon-a", "daemon-b"]).await;
    within(
        WAIT,
        "the operator's first write",
        operator.batch_execute(
            "BEGIN; UPDATE pgtaskd.idle_daemons SET expires_at = now() + interval '2 hours'
                    WHERE instance = 'daemon-a'",
        ),
    )
    .await
    .unwrap();
    let busy = {
        let daemon = daemon.clone();
        tokio::spawn(async move { pgtaskd::queue::clear_idle(&daemon, "daemon-b").await })
    };
    within(
        WAIT,
        "the operator's second write",
        operator.batch_execute(
            "UPDATE pgtaskd.idle_daemons SET expires_at = now() + interval '2 hours'
              WHERE instance = 'daemon-b'; COMMIT",
        ),
    )
    .await
    .expect("no deadlock: the daemon's write holds no row while it tries for the turn");
    within(WAIT, "the daemon's write", busy)
        .await
        .unwrap()
        .expect("the daemon's write is not the deadlock's victim either");

    within(WAIT, "an analyze left open", async {
        operator
            .batch_execute("UPDATE pgtaskd.idle_daemons SET expires_at = '-infinity'")
            .await
            .unwrap();
        operator
            .batch_execute("BEGIN; ANALYZE pgtaskd.idle_daemons")
            .await
            .unwrap();
    })
    .await;
    assert_eq!(function_calls_of_an_insert(&owner).await, 0, "no live flag");
    let started = Instant::now();
    within(
        Duration::from_secs(20),
        "a flag while the turn is held by someone else",
        pgtaskd::queue::flag_idle(&daemon, "daemon-a", HOUR),
    )
    .await
    .expect("the flag is written without its turn");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the flag waited {:?}, about half a second expected",
        started.elapsed()
    );
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        1,
        "a flag written without the turn still raises the value"
    );
    within(WAIT, "the analyze's end", operator.batch_execute("COMMIT"))
        .await
        .unwrap();
}
