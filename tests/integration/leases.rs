//! Crash recovery with leases, and many daemons on one database (docs/design.md, "Nothing lost" and the
//! fencing of section 3), with real daemon processes. Retention and the daemon's vacuum are in
//! `retention`, an outage longer than the lease in `outages`.

use std::sync::Arc;
use std::time::Duration;

use pgtaskd::queue::{self, TaskStatus};
use tokio::sync::Barrier;

use crate::support::{
    assert_all_succeeded, audit, count, eventually, insert_payloads, wait_count, DaemonProcess,
    TestDb, WAIT,
};

const SHORT_LEASE: &str = "[worker]\nconcurrency = 4\nlease = \"1s\"\npoll_interval = \"500ms\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_a_killed_daemon_are_finished_by_another_after_the_lease_expires() {
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;
    audit::refuse_finishes_of_attempt(&client, 1).await;
    insert_payloads(&client, 3).await;

    let mut first = DaemonProcess::start(&db, SHORT_LEASE, &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'",
        3,
        "three claims",
    )
    .await;
    first.wait_for_log("finish failed; retrying").await;
    first.signal(libc::SIGKILL);
    first.wait().await;

    let mut second = DaemonProcess::start(&db, SHORT_LEASE, &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        3,
        "the rescue",
    )
    .await;
    assert_all_succeeded(&client, Some(2)).await;
    assert!(
        second.log_text().contains("task rescued"),
        "{}",
        second.log_text()
    );
    assert_eq!(audit::tasks_finished_twice(&client).await, 0);
    assert_eq!(audit::transitions_out_of_terminal(&client).await, 0);
    second.signal(libc::SIGTERM);
    assert_eq!(second.wait().await.code(), Some(0));
}

/// A claim writes its daemon's key as the lease owner, ten characters whatever the host's
/// name (schema 41); the view answers the daemon's whole instance id, and so does the error of
/// the lease it lost when another daemon takes the task back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holds_the_daemons_key_and_the_view_and_the_lost_lease_name_the_daemon() {
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;
    audit::refuse_finishes_of_attempt(&client, 1).await;
    insert_payloads(&client, 1).await;
    let id: i64 = client
        .query_one("SELECT id FROM pgtaskd.task_view", &[])
        .await
        .unwrap()
        .get(0);

    let mut first = DaemonProcess::start(&db, SHORT_LEASE, &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'",
        1,
        "the claim",
    )
    .await;
    let row = client
        .query_one(
            "SELECT s.lease_owner, v.lease_owner, d.instance
               FROM pgtaskd.task_state AS s
               JOIN pgtaskd.task_view AS v USING (id)
              CROSS JOIN pgtaskd.daemons AS d
              WHERE s.id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let (stored, shown, instance): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(stored.len(), 10, "{stored}");
    assert!(
        stored
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()),
        "{stored}"
    );
    assert_eq!(instance, format!("{}:{}:{stored}", hostname(), first.pid()));
    assert_eq!(shown, instance);
    // An owner no daemon's id ends with (a lease written before schema 41) is answered as it
    // is.
    let unknown: String = client
        .query_one("SELECT pgtaskd.lease_holder($1)", &[&"vm:1:00c0ffee42"])
        .await
        .unwrap()
        .get(0);
    assert_eq!(unknown, "vm:1:00c0ffee42");
    // Only a whole key names a daemon, not the end of its id.
    let tail = format!("{}:{stored}", first.pid());
    let named: String = client
        .query_one("SELECT pgtaskd.lease_holder($1)", &[&tail])
        .await
        .unwrap()
        .get(0);
    assert_eq!(named, tail);

    first.wait_for_log("finish failed; retrying").await;
    first.signal(libc::SIGKILL);
    first.wait().await;
    let mut second = DaemonProcess::start(&db, SHORT_LEASE, &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        1,
        "the rescue",
    )
    .await;
    let lost: String = client
        .query_one(
            "SELECT errors -> 0 ->> 'error' FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(lost, format!("lease lost (last held by {instance})"));
    second.signal(libc::SIGTERM);
    assert_eq!(second.wait().await.code(), Some(0));
}

/// The host's name as the daemon reads it (its first 32 characters).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .chars()
        .take(32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_daemon_that_wakes_after_a_takeover_has_its_finish_refused() {
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;
    audit::refuse_finishes_of_attempt(&client, 1).await;
    insert_payloads(&client, 2).await;

    let mut frozen = DaemonProcess::start(&db, SHORT_LEASE, &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'",
        2,
        "two claims",
    )
    .await;
    frozen.wait_for_log("finish failed; retrying").await;
    frozen.signal(libc::SIGSTOP);

    let mut second = DaemonProcess::start(&db, SHORT_LEASE, &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        2,
        "the takeover",
    )
    .await;
    audit::accept_all_finishes(&client).await;
    frozen.signal(libc::SIGCONT);
    frozen
        .wait_for_log("claim lost before the finish; result dropped")
        .await;

    assert_all_succeeded(&client, Some(2)).await;
    assert_eq!(
        audit::tasks_finished_twice(&client).await,
        0,
        "each row was finished once"
    );
    assert_eq!(audit::transitions_out_of_terminal(&client).await, 0);
    for daemon in [&mut frozen, &mut second] {
        daemon.signal(libc::SIGTERM);
        assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_share_ten_thousand_tasks_each_finished_exactly_once() {
    let db = TestDb::new().await;
    let client = db.client().await;
    audit::install(&client).await;
    let config = "[worker]\nconcurrency = 8\n";
    let mut daemons: Vec<DaemonProcess> = (0..3)
        .map(|_| DaemonProcess::start(&db, config, &[]))
        .collect();
    crate::support::daemon::wait_listening(&db, 3).await;
    insert_payloads(&client, 10_000).await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        10_000,
        "10,000 tasks",
    )
    .await;
    assert_all_succeeded(&client, Some(1)).await;
    assert_eq!(audit::tasks_finished_twice(&client).await, 0);
    let shares = client
        .query(
            "SELECT old_owner, count(*) FROM public.audit WHERE new_status = 'SUCCEEDED' GROUP BY old_owner",
            &[],
        )
        .await
        .unwrap();
    let shares: Vec<(String, i64)> = shares.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        shares.len(),
        3,
        "all three daemons finished tasks: {shares:?}"
    );
    assert!(
        shares.iter().all(|(_, n)| *n >= 500),
        "the work is spread: {shares:?}"
    );
    for daemon in &mut daemons {
        daemon.signal(libc::SIGTERM);
        assert_eq!(daemon.wait().await.code(), Some(0));
    }
}

#[tokio::test]
async fn a_task_that_loses_every_lease_ends_failed_after_max_attempts() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id: i64 = client
        .query_one("SELECT pgtaskd.enqueue('doomed', max_attempts => 2)", &[])
        .await
        .unwrap()
        .get(0);
    let pool = db.pool(2);
    let queues = vec!["default".to_string()];
    for attempt in 1..=2 {
        let claimed = queue::claim(&client, "crashy", &queues, 1, Duration::from_millis(1))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "attempt {attempt} is claimable at once");
        assert_eq!(claimed[0].attempt, attempt);
        // Nobody extends the lease: it expires.
        eventually(WAIT, "the lease to be rescued", || {
            let pool = &pool;
            async move {
                (pgtaskd::maintenance::rescuer::run_once(pool, "rescuer", Duration::from_secs(30))
                    .await
                    .unwrap()
                    == 1)
                    .then_some(())
            }
        })
        .await;
    }
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.attempt, 2);
    assert_eq!((task.words, task.lease_owner), (0, None));
    let error = task.error.unwrap();
    assert!(error.contains("lease lost after 2 attempts"), "{error}");
    assert!(error.contains("crashy"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescuer_that_ends_a_task_failed_logs_one_info_line_for_it() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id: i64 = client
        .query_one(
            "SELECT pgtaskd.enqueue('doomed', queue => 'mail', max_attempts => 1)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let queues = vec!["mail".to_string()];
    let claimed = queue::claim(&client, "crashy", &queues, 1, Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    // A daemon that serves another queue: its rescuer takes the lease back, on its last
    // attempt, so the task ends FAILED.
    let mut daemon = DaemonProcess::start_with_env(
        &db.url,
        "[worker]\nlease = \"1s\"\n",
        &[],
        &[("RUST_LOG", "pgtaskd=info")],
    );
    daemon.wait_for_log("task failed").await;
    daemon.stop_cleanly().await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    let log = daemon.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("task failed")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    for field in [format!("id={id}"), "queue=mail".into(), "attempts=1".into()] {
        assert!(lines[0].contains(&field), "{field}: {}", lines[0]);
    }
    assert!(
        lines[0].contains("lease lost after 1 attempt"),
        "{}",
        lines[0]
    );
}

#[tokio::test]
async fn an_expired_lease_of_a_canceled_task_ends_canceled() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id: i64 = client
        .query_one("SELECT pgtaskd.enqueue('x')", &[])
        .await
        .unwrap()
        .get(0);
    queue::claim(
        &client,
        "gone",
        &["default".into()],
        1,
        Duration::from_millis(1),
    )
    .await
    .unwrap();
    queue::cancel(&client, id).await.unwrap();
    let pool = db.pool(1);
    eventually(WAIT, "the rescue", || {
        let pool = &pool;
        async move {
            (pgtaskd::maintenance::rescuer::run_once(pool, "r", Duration::from_secs(30))
                .await
                .unwrap()
                == 1)
                .then_some(())
        }
    })
    .await;
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!((task.status, task.error), (TaskStatus::Canceled, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_rescuers_take_back_each_expired_lease_once() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'r' || i FROM generate_series(1, 300) i",
            &[],
        )
        .await
        .unwrap();
    let claimed = queue::claim(
        &client,
        "gone",
        &["default".into()],
        300,
        Duration::from_millis(1),
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 300);
    tokio::time::sleep(Duration::from_millis(5)).await; // past the 1 ms lease
    let pool = db.pool(4);
    let barrier = Arc::new(Barrier::new(4));
    let rescuers: Vec<_> = (0..4)
        .map(|n| {
            let pool = pool.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                let client = pool.get().await.unwrap();
                barrier.wait().await;
                let mut mine = Vec::new();
                loop {
                    let rescued = queue::rescue(&client, 7 + n, "rescuer").await.unwrap();
                    if rescued.is_empty() {
                        return mine;
                    }
                    mine.extend(rescued.into_iter().map(|r| r.id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for rescuer in rescuers {
        all.extend(
            crate::support::within(WAIT, "a rescuer", rescuer)
                .await
                .unwrap(),
        );
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 300);
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'QUEUED' AND attempt = 1"
        )
        .await,
        300
    );
}

/// Work without a lease stops (docs/design.md, "Work without a lease stops"): a daemon whose
/// heartbeat does not reach the database (its session hangs, as behind a vanished peer) stops
/// its handler's child before the lease runs out, and gives the task back, so that the run of
/// the claim that follows never overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_heartbeat_hangs_stops_the_work_before_its_lease_runs_out() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // The first run waits for ever; the next one says whether the first is still alive.
    let twice = RunTwice::new("exec sleep 1000");
    let (proxy, url) = heartbeat_held(&db).await;
    let mut daemon = DaemonProcess::start_url(&url, &twice.config, &[]);
    let id = run_one_job(&client, "the task to succeed on its second run").await;
    assert!(proxy.triggered(), "a heartbeat was held");
    let ran = std::fs::read_to_string(&twice.runs).unwrap_or_default();
    assert_eq!(ran, "alone\n", "the second run overlapped the first");
    daemon
        .wait_for_log("leases ran out without a heartbeat")
        .await;
    let attempt: i32 = client
        .query_one(
            "SELECT attempt FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(attempt >= 1, "{attempt}");
    daemon.signal(libc::SIGTERM);
    let _ = daemon.wait().await;
}

/// Work without a lease stops before the lease runs out even for a child that ignores
/// SIGTERM: its SIGKILL (`kill_after` after the SIGTERM) lands before the lease runs out,
/// not after, so that another daemon's rescuer, which may claim the task the moment the lease
/// has expired, never runs it beside the first run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ignores_sigterm_is_killed_before_another_daemon_may_run_its_task() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let twice = RunTwice::new("trap '' TERM; while :; do sleep 0.1; done");
    let (_proxy, url) = heartbeat_held(&db).await;
    let config = &twice.config;
    let mut cut_off = DaemonProcess::start_url(&url, config, &[]);
    let id = enqueue_job(&client).await;
    eventually(WAIT, "the first run to start", || {
        let first = twice.first.clone();
        async move { first.exists().then_some(()) }
    })
    .await;
    // The other daemon reaches the database directly; its rescuer takes the lease back.
    let mut other = DaemonProcess::start(&db, config, &[]);
    wait_succeeded(&client, id, "the task to succeed on its second run").await;
    let ran = std::fs::read_to_string(&twice.runs).unwrap_or_default();
    assert_eq!(ran, "alone\n", "the second run overlapped the first");
    for daemon in [&mut other, &mut cut_off] {
        daemon.signal(libc::SIGTERM);
        let _ = daemon.wait().await;
    }
}

/// Work without a lease never starts: a claim answered after its lease ran out (here the
/// claim's statement is held three seconds by a trigger, with a lease of two; a daemon paused
/// between a claim and its start is the same) is given back without running its handler, and
/// the task runs once, under the claim that follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_after_its_lease_ran_out_is_given_back_unrun() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // The first claim's update waits three seconds, once, and records its token.
    client
        .batch_execute(
            "CREATE TABLE public.slowed (id bigint, token bigint);
             CREATE FUNCTION public.slow_first_claim() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NOT EXISTS (SELECT 1 FROM public.slowed) THEN
                     INSERT INTO public.slowed VALUES (NEW.id, NEW.claim_token);
                     PERFORM pg_sleep(3);
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER slow_first_claim BEFORE UPDATE ON pgtaskd.task_state FOR EACH ROW
                 WHEN (OLD.status = 'QUEUED' AND NEW.status = 'RUNNING')
                 EXECUTE FUNCTION public.slow_first_claim();",
        )
        .await
        .unwrap();
    let scratch = crate::handlers::Scratch::new();
    let runs = scratch.path("runs");
    let handler = scratch.script(
        "record.sh",
        &format!(
            "echo \"$PGTASKD_CLAIM\" >> {runs}\necho done",
            runs = runs.display()
        ),
    );
    let mut daemon = DaemonProcess::start(&db, &jobs_config(&handler, ""), &[]);
    let id = run_one_job(&client, "the task to succeed").await;
    let late: i64 = client
        .query_one("SELECT token FROM public.slowed", &[])
        .await
        .unwrap()
        .get(0);
    let ran = std::fs::read_to_string(&runs).unwrap_or_default();
    let tokens: Vec<i64> = ran.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(tokens.len(), 1, "the handler ran once: {ran:?}");
    assert_ne!(
        tokens[0], late,
        "the handler ran under the claim answered after its lease"
    );
    let (attempt, token): (i32, i64) = {
        let row = client
            .query_one(
                "SELECT attempt, claim_token FROM pgtaskd.task_view WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (attempt, token),
        (1, tokens[0]),
        "given back without counting an attempt"
    );
    daemon
        .wait_for_log("leases ran out without a heartbeat")
        .await;
    daemon.signal(libc::SIGTERM);
    let _ = daemon.wait().await;
}

/// An `exec` handler whose first run records its pid and then runs `first_run` (which never
/// ends by itself), and whose next runs record whether the first one is still alive
/// ("overlap" or "alone" in `runs`); with a daemon configuration serving it, `kill_after` 1 s.
struct RunTwice {
    _scratch: crate::handlers::Scratch,
    first: std::path::PathBuf,
    runs: std::path::PathBuf,
    config: String,
}

impl RunTwice {
    fn new(first_run: &str) -> RunTwice {
        let scratch = crate::handlers::Scratch::new();
        let first = scratch.path("first");
        let runs = scratch.path("runs");
        let handler = scratch.script(
            "twice.sh",
            &format!(
                "if [ ! -e {first} ]; then echo $$ > {first}; {first_run}; fi\n\
                 if kill -0 \"$(cat {first})\" 2>/dev/null; then echo overlap >> {runs}; else echo alone >> {runs}; fi\n\
                 echo done",
                first = first.display(),
                runs = runs.display()
            ),
        );
        let config = jobs_config(&handler, "kill_after = \"1s\"\n");
        RunTwice {
            _scratch: scratch,
            first,
            runs,
            config,
        }
    }
}

/// A proxy to the server that holds only the heartbeat's statement (claims, finishes and the
/// rescuer go through), and the connection string through it to `db`.
async fn heartbeat_held(db: &TestDb) -> (crate::support::proxy::Proxy, String) {
    use crate::support::proxy::{Fault, Proxy};
    let proxy = Proxy::start(
        crate::support::server_addr(),
        Fault::HalfOpen,
        "FROM pgtaskd.heartbeat(",
    )
    .await;
    let url = proxy.conninfo(&crate::support::server_user(), &db.name);
    (proxy, url)
}

/// A daemon serving only the queue `jobs` with `handler` as its `exec` command (and the
/// section's `extra` keys), a lease of two seconds.
fn jobs_config(handler: &std::path::Path, extra: &str) -> String {
    format!(
        "[worker]\nqueues = [\"jobs\"]\nlease = \"2s\"\npoll_interval = \"200ms\"\n\
         [queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\n{extra}",
        handler.display()
    )
}

/// Enqueue one task of `jobs` and wait until it is SUCCEEDED (`what` names the wait); its id.
async fn run_one_job(client: &tokio_postgres::Client, what: &str) -> i64 {
    let id = enqueue_job(client).await;
    wait_succeeded(client, id, what).await;
    id
}

/// Enqueue one task of `jobs`; its id.
async fn enqueue_job(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('jobs', 'x') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Wait until task `id` is SUCCEEDED (`what` names the wait).
async fn wait_succeeded(client: &tokio_postgres::Client, id: i64, what: &str) {
    wait_count(
        client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        what,
    )
    .await;
}

/// Test-only SQL: every park counted, and the lease heartbeat's extension held, with the
/// rows it extends locked, while the test holds advisory lock 4242.
const HOLD_THE_HEARTBEAT: &str = "
CREATE TABLE public.parks (task_id bigint NOT NULL);
CREATE FUNCTION public.count_park() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.parks VALUES (NEW.task_id);
    RETURN NEW;
END $$;
CREATE TRIGGER count_park AFTER INSERT ON pgtaskd.parked_results
    FOR EACH ROW EXECUTE FUNCTION public.count_park();
CREATE FUNCTION public.hold_extension() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'RUNNING' AND NEW.status = 'RUNNING' THEN
        PERFORM pg_advisory_xact_lock_shared(4242);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_extension BEFORE UPDATE ON pgtaskd.task_state
    FOR EACH ROW EXECUTE FUNCTION public.hold_extension();
";

/// A finish that finds its row locked by its own daemon's heartbeat (whose statement locks
/// the rows it extends) waits for that heartbeat and writes, and parks nothing: a park is for
/// someone else's lock. Before, it took the heartbeat's lock for another's and parked its
/// result; a park a rescue then could not write held back every rescue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_that_meets_its_own_heartbeats_lock_waits_for_it_and_parks_nothing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute(HOLD_THE_HEARTBEAT).await.unwrap();
    client
        .execute("SELECT pg_advisory_lock(4242)", &[])
        .await
        .unwrap();
    let scratch = crate::handlers::Scratch::new();
    let gate = scratch.path("gate");
    let path = std::ffi::CString::new(gate.to_str().unwrap()).unwrap();
    // SAFETY: a plain system call on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o666) }, 0, "mkfifo");
    let handler = scratch.script(
        "gated.sh",
        &format!(
            "echo $$ >> {}\ncat {} > /dev/null\necho finished",
            scratch.path("started").display(),
            gate.display()
        ),
    );
    // A lease long enough that the claim's work is not stopped while its heartbeat is held.
    let config = format!(
        "[worker]\nqueues = [\"jobs\"]\nlease = \"9s\"\n\n[queues.jobs]\nhandler = \"exec\"\n\
         command = [\"{}\"]\nkill_after = \"100ms\"\n",
        handler.display()
    );
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('jobs', 'x') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    scratch.pids("started", 1).await;
    wait_count(
        &client,
        "SELECT count(*) FROM pg_stat_activity
          WHERE wait_event = 'advisory' AND query LIKE '%pgtaskd.heartbeat%'",
        1,
        "the heartbeat to be held with the row locked",
    )
    .await;
    // The handler ends; its batched finish skips the row the heartbeat holds.
    let gate_open = tokio::task::spawn_blocking(move || std::fs::write(gate, ""));
    crate::support::within(WAIT, "the gate to open", gate_open)
        .await
        .unwrap()
        .expect("open the gate");
    daemon
        .wait_for_log(&format!(
            "row locked by another transaction; finishing the task alone id={id} "
        ))
        .await;
    client
        .execute("SELECT pg_advisory_unlock(4242)", &[])
        .await
        .unwrap();
    wait_count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.task_view
              WHERE id = {id} AND status = 'SUCCEEDED' AND attempt = 1"
        ),
        1,
        "the task to finish",
    )
    .await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM public.parks").await,
        0,
        "no result was parked:\n{}",
        daemon.log_text()
    );
    daemon.stop_cleanly().await;
}
