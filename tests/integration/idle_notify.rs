//! Idle flags (docs/design.md, "Idle flags"): inserts notify only while some daemon waits for
//! work. A daemon flags itself while it idles and clears the flag while it works; a killed
//! daemon's flag expires; an idle daemon is woken by the notification, a busy one finds the
//! task by itself, a producer transaction open while the daemon went idle is found when it
//! commits, a lost flag is covered by the poll tick; `DISABLE TRIGGER tasks_notify` still
//! stops every notification. The flags table's own mechanics are in `idle_flags`, the
//! producers' rights against the trigger in `trigger_rights`; both use the helpers here.

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
    count, enqueue, eventually, wait_status, within, DaemonProcess, InProcessDaemon, TestDb, WAIT,
};

/// One worker, and a poll tick far longer than any wait of these tests: a task claimed within
/// [`PROMPT`] was found by a notification or by the daemon itself, never by the tick. The
/// byte budget is smaller than a held text ([`held`]), so that a daemon running one has no
/// room for another task however fast the others ran (it would otherwise claim ahead).
pub(crate) const LONG_POLL: &str =
    "[worker]\nconcurrency = 1\npoll_interval = \"30s\"\nmax_inflight_bytes = 16\n";
const LONG_POLL_INTERVAL: Duration = Duration::from_secs(30);
/// Well under the 30 s poll interval, with room for a loaded machine.
const PROMPT: Duration = Duration::from_secs(10);
const ROUNDS: usize = 20;

pub(crate) const LIVE_FLAGS: &str =
    "SELECT count(*) FROM pgtaskd.idle_daemons WHERE expires_at > now()";

/// A text the [`RoundGate`] holds, longer than the byte budget of [`LONG_POLL`].
fn held(round: usize) -> String {
    format!("hold-{round:02}-of-the-idle-notify-tests")
}

/// Holds the texts that start with `hold-` until the test releases them one by one (or all
/// at once, when dropped); every other text passes at once. Counts nothing: the tests read
/// the rows.
#[derive(Default)]
pub(crate) struct RoundGate {
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
pub(crate) async fn listening(url: &str) -> (Client, mpsc::Receiver<AsyncMessage>, impl Drop) {
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
pub(crate) async fn notified_before_marker(
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

pub(crate) async fn wait_flags(client: &Client, want: i64, what: &str) {
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
                    AND expires_at > coalesce((SELECT max(started_at) FROM pgtaskd.task_view),
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
pub(crate) async fn insert_notifies(
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

pub(crate) async fn wait_done_promptly(client: &Client, id: i64, what: &str) {
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
