//! Limits that hold across every daemon (docs/limits.md): the most tasks of a queue RUNNING
//! at once, the most per concurrency key, the most starts in a window. Counted by the handlers
//! themselves, each writing when it starts and ends, with three daemons of concurrency 4 and,
//! in the second run of each, one of them killed with -9 while it runs a task.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Barrier;
use tokio_postgres::Client;

use crate::handlers::Scratch;
use crate::support::{count, eventually, wait_count, within, DaemonProcess, TestDb, WAIT};

/// A handler that writes `start <ns> <id>` and `end <ns> <id>` around `seconds` of sleep.
fn recording_handler(scratch: &Scratch, seconds: &str) -> std::path::PathBuf {
    let log = scratch.path("runs.log");
    scratch.script(
        "record.sh",
        &format!(
            "echo \"start $(date +%s%N) $PGTASKD_TASK_ID\" >> {log}\n\
             sleep {seconds}\n\
             echo \"end $(date +%s%N) $PGTASKD_TASK_ID\" >> {log}",
            log = log.display()
        ),
    )
}

/// Three daemons of concurrency 4 serving `lim` with `handler`; leases of 2 s, so that the
/// tasks of a killed daemon come back within the test.
fn three_daemons(db: &TestDb, handler: &std::path::Path) -> Vec<DaemonProcess> {
    let config = format!(
        "[worker]\nqueues = [\"lim\"]\nconcurrency = 4\nlease = \"2s\"\npoll_interval = \"500ms\"\n\n\
         [queues.lim]\nhandler = \"exec\"\ncommand = [\"{}\"]\nretry_backoff = \"100ms\"\n",
        handler.display()
    );
    (0..3)
        .map(|_| DaemonProcess::start(db, &config, &[]))
        .collect()
}

async fn set_queue(client: &Client, settings: &str) {
    within(
        WAIT,
        "set_queue",
        client.execute(
            "SELECT pgtaskd.set_queue('lim', $1::text::jsonb)",
            &[&settings],
        ),
    )
    .await
    .unwrap();
}

/// Insert a task of `lim` per key (None: no key); returns their ids in order.
async fn insert(client: &Client, keys: &[Option<&str>]) -> Vec<i64> {
    let mut ids = Vec::new();
    for key in keys {
        let row = within(
            WAIT,
            "an insert",
            client.query_one(
                "INSERT INTO pgtaskd.tasks (payload, queue, concurrency_key, max_attempts) \
                 VALUES ('x', 'lim', $1, 10) RETURNING id",
                &[key],
            ),
        )
        .await
        .unwrap();
        ids.push(row.get(0));
    }
    ids
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// One run of a handler: its task, when it started, and when it ended (a run whose daemon
/// was killed ends at the kill: its child is killed with it).
#[derive(Debug, Clone, Copy)]
struct Run {
    id: i64,
    start: i64,
    end: i64,
}

/// The runs the handlers wrote, each end paired with the latest start of its task before it
/// (a run of a killed daemon has no end; the task's next run, after the rescue, does).
fn runs(scratch: &Scratch, killed_at: Option<i64>) -> Vec<Run> {
    let mut open: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut runs = Vec::new();
    for line in scratch.lines("runs.log") {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (at, id): (i64, i64) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
        match parts[0] {
            "start" => open.entry(id).or_default().push(at),
            _ => {
                let starts = open.get_mut(&id).expect("an end after its start");
                let start = starts.pop().expect("a start for every end");
                runs.push(Run { id, start, end: at });
            }
        }
    }
    for (id, starts) in open {
        for start in starts {
            let killed = killed_at.expect("a run without an end only where a daemon was killed");
            // The killed daemon's child dies with it, a moment after the signal: it may write
            // its start in that moment.
            assert!(
                start <= killed + 1_000_000_000,
                "task {id} started at {start}, long after the kill at {killed}, and never ended"
            );
            runs.push(Run {
                id,
                start,
                end: start.max(killed),
            });
        }
    }
    runs
}

/// The most runs of `runs` at once.
fn most_at_once(runs: &[Run]) -> usize {
    let mut edges: Vec<(i64, i32)> = runs
        .iter()
        .flat_map(|r| [(r.start, 1), (r.end, -1)])
        .collect();
    // At one instant, an end before a start: the slot was freed first.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// Kill with -9 a daemon that holds a RUNNING task of `lim`, once one does; returns when.
async fn kill_one_running(client: &Client, daemons: &mut [DaemonProcess]) -> i64 {
    let owner: String = eventually(WAIT, "a daemon to run a task", || async move {
        client
            .query_opt(
                "SELECT lease_owner FROM pgtaskd.task_view \
                  WHERE queue = 'lim' AND status = 'RUNNING' LIMIT 1",
                &[],
            )
            .await
            .unwrap()
            .map(|row| row.get(0))
    })
    .await;
    let pid: i32 = owner.split(':').nth(1).unwrap().parse().unwrap();
    let daemon = daemons
        .iter_mut()
        .find(|d| d.pid() == pid)
        .expect("the owner is one of the three");
    daemon.signal(libc::SIGKILL);
    let at = now_ns();
    daemon.wait().await;
    at
}

async fn stop_all(daemons: &mut [DaemonProcess]) {
    for daemon in daemons.iter_mut() {
        daemon.signal(libc::SIGTERM);
    }
    for daemon in daemons.iter_mut() {
        daemon.wait().await;
    }
}

async fn max_running_two(kill: bool) {
    let db = TestDb::new().await;
    let client = db.client().await;
    set_queue(&client, r#"{"max_running": 2}"#).await;
    let scratch = Scratch::new();
    let handler = recording_handler(&scratch, "0.5");
    let mut daemons = three_daemons(&db, &handler);
    let began = Instant::now();
    insert(&client, &[None; 20]).await;
    let killed_at = if kill {
        Some(kill_one_running(&client, &mut daemons).await)
    } else {
        None
    };
    // The database's own count, sampled through the run, never passes the limit either.
    let mut most_running = 0;
    within(WAIT, "the 20 tasks to succeed", async {
        loop {
            let running = count(
                &client,
                "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'lim' AND status = 'RUNNING'",
            )
            .await;
            most_running = most_running.max(running);
            let done = count(
                &client,
                "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'lim' AND status = 'SUCCEEDED'",
            )
            .await;
            if done == 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let elapsed = began.elapsed();
    stop_all(&mut daemons).await;
    let runs = runs(&scratch, killed_at);
    println!(
        "max_running 2, 20 tasks of 0.5 s, three daemons{}: {:.2} s, {} runs",
        if kill { ", one killed" } else { "" },
        elapsed.as_secs_f64(),
        runs.len()
    );
    assert!(
        most_running <= 2,
        "{most_running} RUNNING at once in the table"
    );
    assert_eq!(
        most_at_once(&runs),
        2,
        "the handlers ran two at once, never three: {runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_running_two_across_three_daemons_never_runs_three_handlers_at_once() {
    max_running_two(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_running_holds_when_a_daemon_is_killed_mid_run_and_its_slot_comes_back_with_the_rescue()
{
    max_running_two(true).await;
}

async fn one_per_key(kill: bool) {
    let db = TestDb::new().await;
    let client = db.client().await;
    set_queue(&client, r#"{"max_running_per_key": 1}"#).await;
    let scratch = Scratch::new();
    let handler = recording_handler(&scratch, "0.3");
    let mut daemons = three_daemons(&db, &handler);
    let keys: Vec<Option<&str>> = (0..15)
        .map(|n| Some(["tenant-a", "tenant-b", "tenant-c"][n % 3]))
        .collect();
    let ids = insert(&client, &keys).await;
    let key_of: HashMap<i64, &str> = ids
        .iter()
        .zip(&keys)
        .map(|(id, key)| (*id, key.unwrap()))
        .collect();
    let killed_at = if kill {
        Some(kill_one_running(&client, &mut daemons).await)
    } else {
        None
    };
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'lim' AND status = 'SUCCEEDED'",
        15,
        "the 15 tasks to succeed",
    )
    .await;
    stop_all(&mut daemons).await;
    let runs = runs(&scratch, killed_at);
    for key in ["tenant-a", "tenant-b", "tenant-c"] {
        let of_key: Vec<Run> = runs
            .iter()
            .filter(|r| key_of[&r.id] == key)
            .copied()
            .collect();
        assert_eq!(most_at_once(&of_key), 1, "{key} ran alone: {of_key:?}");
    }
    assert!(
        most_at_once(&runs) >= 2,
        "the keys ran side by side: {runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_per_key_runs_each_key_alone_and_the_keys_side_by_side() {
    one_per_key(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_per_key_holds_when_a_daemon_is_killed_mid_run() {
    one_per_key(true).await;
}

async fn four_a_second(kill: bool) {
    let db = TestDb::new().await;
    let client = db.client().await;
    set_queue(&client, r#"{"rate_limit": 4, "rate_period": "1 second"}"#).await;
    // Every start the claims count, as they counted it (by the database clock).
    within(
        WAIT,
        "the audit of starts",
        client.batch_execute(
            "CREATE TABLE counted (at timestamptz NOT NULL);
             CREATE FUNCTION count_start() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO public.counted SELECT n.started_at FROM new_starts AS n; RETURN NULL; END $$;
             CREATE TRIGGER count_start AFTER INSERT ON pgtaskd.queue_starts
                 REFERENCING NEW TABLE AS new_starts
                 FOR EACH STATEMENT EXECUTE FUNCTION count_start();",
        ),
    )
    .await
    .unwrap();
    let scratch = Scratch::new();
    let handler = recording_handler(&scratch, "0.2");
    let mut daemons = three_daemons(&db, &handler);
    let began = Instant::now();
    insert(&client, &[None; 14]).await;
    let killed_at = if kill {
        Some(kill_one_running(&client, &mut daemons).await)
    } else {
        None
    };
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'lim' AND status = 'SUCCEEDED'",
        14,
        "the 14 tasks to succeed",
    )
    .await;
    let elapsed = began.elapsed();
    stop_all(&mut daemons).await;
    let mut handled: Vec<i64> = runs(&scratch, killed_at).iter().map(|r| r.start).collect();
    handled.sort();
    let rows = within(
        WAIT,
        "the starts counted",
        client.query(
            "SELECT (extract(epoch FROM at) * 1e9)::int8 FROM counted ORDER BY at",
            &[],
        ),
    )
    .await
    .unwrap();
    let counted: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    let closest = |starts: &[i64]| {
        starts
            .windows(5)
            .map(|w| Duration::from_nanos((w[4] - w[0]) as u64))
            .min()
    };
    println!(
        "rate 4/1s, 14 tasks, three daemons{}: {} claims counted, {} handler starts, in {:.2} s; \
         five starts at the closest within {:?} by the claims' clock, {:?} by the handlers'",
        if kill { ", one killed" } else { "" },
        counted.len(),
        handled.len(),
        elapsed.as_secs_f64(),
        closest(&counted),
        closest(&handled),
    );
    assert!(
        counted.len() >= 14 && handled.len() >= 14,
        "every start is counted: {counted:?}, {handled:?}"
    );
    // Five starts within less than a second would be five in one window.
    for window in counted.windows(5) {
        let spread = Duration::from_nanos((window[4] - window[0]) as u64);
        assert!(
            spread >= Duration::from_secs(1),
            "five starts within {spread:?}: {counted:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_of_four_a_second_never_starts_five_tasks_within_a_second() {
    four_a_second(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_holds_when_a_daemon_is_killed_mid_run() {
    four_a_second(true).await;
}

/// Claims racing from many sessions at once, round after round, never take more than the
/// limit between them: the decision is made under the queue's lock, never counted in one
/// transaction and claimed in another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_claiming_at_once_never_take_more_than_max_running() {
    const SESSIONS: usize = 8;
    let db = TestDb::new().await;
    let owner = db.client().await;
    set_queue(&owner, r#"{"max_running": 3}"#).await;
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(Arc::new(db.client().await));
    }
    for round in 0..30 {
        insert(&owner, &[None; 10]).await;
        let barrier = Arc::new(Barrier::new(SESSIONS));
        let mut claims = tokio::task::JoinSet::new();
        for session in &sessions {
            let (session, barrier) = (Arc::clone(session), Arc::clone(&barrier));
            claims.spawn(async move {
                barrier.wait().await;
                let claimed = pgtaskd::queue::claim(
                    &session,
                    "racer",
                    &["lim".to_string()],
                    10,
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
                claimed.len()
            });
        }
        let mut taken = 0;
        while let Some(claimed) = within(WAIT, "a racing claim", claims.join_next()).await {
            taken += claimed.unwrap();
        }
        let running = count(
            &owner,
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'lim' AND status = 'RUNNING'",
        )
        .await;
        assert!(
            taken <= 3 && running <= 3,
            "round {round}: {taken} claimed, {running} RUNNING"
        );
        // Every task ends, so that the next round starts with three free slots.
        within(
            WAIT,
            "the tasks to end",
            owner.batch_execute(
                "UPDATE pgtaskd.task_state SET status = 'CANCELED', cancel_requested = true, \
                        lease_owner = NULL, lease_expires_at = NULL, finished_at = now() \
                  WHERE queue = 'lim'",
            ),
        )
        .await
        .unwrap();
    }
}

/// A session holding a limited queue's lock (a hostile one, or a claim stuck on its way) holds
/// up neither the other queues of the same claim statement nor the limited queue for ever:
/// the claim passes over it and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_limit_lock_holds_up_no_other_queue() {
    let db = TestDb::new().await;
    let client = db.client().await;
    set_queue(&client, r#"{"max_running": 1}"#).await;
    let config = "[worker]\nqueues = [\"lim\", \"default\"]\npoll_interval = \"30s\"\n";
    let mut daemon = DaemonProcess::start(&db, config, &[]);
    let holder = db.client().await;
    within(
        WAIT,
        "the lock",
        holder.batch_execute("BEGIN; SELECT pg_advisory_xact_lock(1885828196, hashtext('lim'))"),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "inserts",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('held', 'lim'); \
             INSERT INTO pgtaskd.tasks (payload) SELECT 'free ' || g FROM generate_series(1, 5) AS g",
        ),
    )
    .await
    .unwrap();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'default' AND status = 'SUCCEEDED'",
        5,
        "the default queue's tasks, while the limited queue's lock is held",
    )
    .await;
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'lim' AND status = 'QUEUED'"
        )
        .await,
        1,
        "the limited queue waits for its lock"
    );
    within(WAIT, "the release", holder.batch_execute("COMMIT"))
        .await
        .unwrap();
    // Found again shortly, not at the 30 s poll tick.
    within(
        Duration::from_secs(10),
        "the limited queue's task once the lock is free",
        wait_count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'lim' AND status = 'SUCCEEDED'",
            1,
            "the limited task",
        ),
    )
    .await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}
