//! Crash recovery with leases, and many daemons on one database (docs/design.md, "Nothing lost" and the
//! fencing of section 3), with real daemon processes.

use std::sync::Arc;
use std::time::Duration;

use pgtaskd::queue::{self, TaskStatus};
use tokio::sync::Barrier;

use crate::support::{
    assert_all_succeeded, audit, count, eventually, hold_snapshot, insert_payloads,
    statistics_say_empty, wait_count, within, DaemonProcess, TestDb, WAIT,
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'RUNNING'",
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'RUNNING'",
        2,
        "two claims",
    )
    .await;
    frozen.wait_for_log("finish failed; retrying").await;
    frozen.signal(libc::SIGSTOP);

    let mut second = DaemonProcess::start(&db, SHORT_LEASE, &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
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
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
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
                (pgtaskd::maintenance::rescuer::run_once(pool, "rescuer")
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
            (pgtaskd::maintenance::rescuer::run_once(pool, "r")
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
            "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'QUEUED' AND attempt = 1"
        )
        .await,
        300
    );
}

#[tokio::test]
async fn retention_deletes_only_finished_rows_older_than_the_setting() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'old ' || i FROM generate_series(1, 2500) i;
             INSERT INTO pgtaskd.tasks (payload) VALUES ('recent'), ('queued'), ('running');
             UPDATE pgtaskd.tasks SET status = 'CANCELED', cancel_requested = true, finished_at = now() - interval '2 days'
              WHERE payload LIKE 'old %';
             UPDATE pgtaskd.tasks SET status = 'CANCELED', cancel_requested = true, finished_at = now() WHERE payload = 'recent';",
        )
        .await
        .unwrap();
    queue::claim(
        &client,
        "me",
        &["default".into()],
        1,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let pool = db.pool(1);
    let deleted = pgtaskd::maintenance::retention::run_once(&pool, Duration::from_secs(86_400))
        .await
        .unwrap();
    assert_eq!(deleted, 2500);
    let left: Vec<String> = client
        .query("SELECT payload FROM pgtaskd.tasks ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["recent", "queued", "running"]);
}

/// `rows` CANCELED rows that finished two days ago, a millisecond apart, in id order.
async fn insert_finished_two_days_ago(client: &tokio_postgres::Client, rows: i64) {
    within(
        WAIT,
        "finished rows to be inserted",
        client.execute(
            "INSERT INTO pgtaskd.tasks (payload, status, cancel_requested, finished_at)
             SELECT 'old ' || i, 'CANCELED', true, now() - interval '2 days' + i * interval '1 ms'
               FROM generate_series(1, $1::int8) i",
            &[&rows],
        ),
    )
    .await
    .unwrap();
}

/// Under a held snapshot the index entries of deleted rows stay at the front of
/// `tasks_finished_idx`: a batch of a retention pass starts where the previous one ended and
/// reads past none of them, where a batch from the start reads them all.
#[tokio::test]
async fn under_a_held_snapshot_a_prune_batch_starts_after_the_rows_the_pass_deleted() {
    const ROWS: i64 = 8_000;
    const BATCH: i64 = 1_000;
    let db = TestDb::new().await;
    let client = db.client().await;
    let holder = hold_snapshot(&db).await;
    insert_finished_two_days_ago(&client, ROWS).await;
    let old = Duration::from_secs(86_400);
    let prune = |from| {
        let client = &client;
        async move {
            within(
                WAIT,
                "a prune batch",
                queue::prune(client, old, BATCH, from),
            )
            .await
            .unwrap()
        }
    };
    let mut from = None;
    for _ in 0..(ROWS / BATCH) / 2 {
        let pruned = prune(from).await;
        assert_eq!(pruned.deleted, BATCH as u64);
        assert!(pruned.last >= from, "positions only move on");
        from = pruned.last;
    }
    // What one more batch reads of the index, from the start and from the position (each in
    // a transaction rolled back, so that both see the same rows). The session's counter also
    // holds what earlier statements read until it is flushed, which never happens inside a
    // transaction: the batch's own is the difference.
    let entries_read = |from| {
        let client = &client;
        async move {
            const READ: &str =
                "SELECT pg_stat_get_xact_tuples_returned('pgtaskd.tasks_finished_idx'::regclass)";
            client.batch_execute("BEGIN").await.unwrap();
            let before = count(client, READ).await;
            let pruned = prune(from).await;
            let read = count(client, READ).await - before;
            client.batch_execute("ROLLBACK").await.unwrap();
            assert_eq!(pruned.deleted, BATCH as u64);
            read
        }
    };
    let from_start = entries_read(None).await;
    let after = entries_read(from).await;
    let deleted = ROWS / 2;
    assert!(
        from_start >= deleted,
        "from the start, the {deleted} entries of deleted rows are read ({from_start})"
    );
    assert!(
        after <= BATCH + 10,
        "from the position, only the batch's own ({after} entries read, {from_start} from the start)"
    );
    holder.batch_execute("COMMIT").await.unwrap();
    let rest = within(
        WAIT,
        "the rest of the pass",
        pgtaskd::maintenance::retention::run_once(&db.pool(1), old),
    )
    .await
    .unwrap();
    assert_eq!(
        rest,
        (ROWS - deleted) as u64,
        "a pass deletes every row left"
    );
}

/// A queue emptied and vacuumed has statistics that say "no rows" until its next analyze
/// (never, with autovacuum off). A burst of finished rows then must not make the prune's plan
/// walk the whole table once per row picked: the batches still take milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_a_grown_table_whose_statistics_say_it_is_empty() {
    const ROWS: i64 = 20_000;
    let db = TestDb::new().await;
    let client = db.client().await;
    statistics_say_empty(&client).await;
    insert_finished_two_days_ago(&client, ROWS).await;
    assert_eq!(
        count(
            &client,
            "SELECT reltuples::int8 FROM pg_class WHERE oid = 'pgtaskd.tasks'::regclass"
        )
        .await,
        0,
        "the statistics still say the table is empty"
    );
    // Milliseconds a batch; the semi-join plan took minutes for a table of this size.
    let deleted = within(
        Duration::from_secs(60),
        "retention to prune a table its statistics call empty",
        pgtaskd::maintenance::retention::run_once(&db.pool(1), Duration::from_secs(86_400)),
    )
    .await
    .unwrap();
    assert_eq!(deleted, ROWS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_vacuums_the_table_once_it_pruned_enough_rows() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let rows = pgtaskd::maintenance::vacuum::VACUUM_AFTER as i64 + 10;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, status, cancel_requested, finished_at)
             SELECT 'old ' || i, 'CANCELED', true, now() - interval '2 days'
               FROM generate_series(1, $1::int8) i",
            &[&rows],
        )
        .await
        .unwrap();
    let vacuums =
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pgtaskd.tasks'::regclass";
    let before = count(&client, vacuums).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let pruned = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let retention = tokio::spawn(pgtaskd::maintenance::retention::run(
        db.pool(1),
        Duration::from_secs(86_400),
        std::sync::Arc::clone(&pruned),
        stop.clone(),
    ));
    // No claims: the rows retention deleted alone make the vacuum due.
    let settings = pgtaskd::db::ConnectSettings::new(&db.config("").database, "test").unwrap();
    let vacuum = tokio::spawn(pgtaskd::maintenance::vacuum::run(
        db.pool(1),
        settings,
        pruned,
        std::sync::Arc::new(pgtaskd::metrics::Metrics::new()),
        stop.clone(),
    ));
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.tasks",
        0,
        "the rows pruned",
    )
    .await;
    eventually(WAIT, "retention's vacuum", || {
        let client = &client;
        async move { (count(client, vacuums).await > before).then_some(()) }
    })
    .await;
    stop.cancel();
    within(WAIT, "retention to stop", retention).await.unwrap();
    within(WAIT, "the vacuum to stop", vacuum).await.unwrap();
}

const MANUAL_VACUUMS: &str =
    "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pgtaskd.tasks'::regclass";

/// Drain `n` tasks with a daemon of default settings (no retention), and return the table's
/// manual vacuum count, read a few of the vacuum's checks after the last finish.
async fn drain_without_retention(db: &TestDb, n: usize) -> i64 {
    let client = db.client().await;
    insert_payloads(&client, n).await;
    let mut daemon = DaemonProcess::start(db, "", &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
        n as i64,
        "the drain",
    )
    .await;
    // An observation window for something that must not happen, not a synchronization:
    // the vacuum looks every second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let vacuums = count(&client, MANUAL_VACUUMS).await;
    daemon.signal(libc::SIGTERM);
    within(WAIT, "the daemon to stop", daemon.wait()).await;
    vacuums
}

/// With autovacuum off for the table (as on servers that turn it off), nothing else would ever
/// vacuum it: every claim's and finish's old row version, and the claims' index entry for it,
/// would stay for good. The daemon, as the table's owner, vacuums it itself, retention or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_vacuums_the_table_itself_while_autovacuum_is_off_for_it() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE pgtaskd.tasks SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    // Two dead versions a task: this many make one vacuum due.
    let n = pgtaskd::maintenance::vacuum::VACUUM_AFTER as usize / 2 + 100;
    let vacuums = drain_without_retention(&db, n).await;
    assert!(
        vacuums >= 1,
        "the daemon vacuumed the table ({vacuums} vacuums)"
    );
    eventually(WAIT, "the dead versions to be gone", || {
        let client = &client;
        async move {
            let dead = count(
                client,
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgtaskd.tasks'::regclass",
            )
            .await;
            (dead < pgtaskd::maintenance::vacuum::VACUUM_AFTER as i64).then_some(())
        }
    })
    .await;
}

/// Where autovacuum covers the table, the daemon without retention leaves vacuuming to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_leaves_vacuuming_to_autovacuum_where_it_covers_the_table() {
    let cluster = crate::support::Cluster::start_with(&[("autovacuum", "on")], &[]);
    let db = TestDb::on(&cluster).await;
    let n = pgtaskd::maintenance::vacuum::VACUUM_AFTER as usize / 2 + 100;
    assert_eq!(drain_without_retention(&db, n).await, 0, "no manual vacuum");
}

/// Settle before rescuing (docs/design.md): the database away for three leases while two
/// daemons hold claims and results. When it is back, each daemon extends its leases and
/// commits what it holds before any rescuer takes a lease back: no task's analyzer runs
/// twice, and every task ends SUCCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_lease_reruns_no_finished_work() {
    const TASKS: usize = 4_000;
    const CONFIG: &str = "[worker]\nconcurrency = 4\nlease = \"2s\"\npoll_interval = \"500ms\"\n\
                          [database]\nconnect_timeout = \"1s\"\n";
    let cluster = crate::support::Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    insert_payloads(&client, TASKS).await;
    let mut daemons = [
        DaemonProcess::start(&db, CONFIG, &[]),
        DaemonProcess::start(&db, CONFIG, &[]),
    ];
    eventually(WAIT, "a few hundred tasks to succeed", || {
        let client = &client;
        async move {
            let done = count(
                client,
                "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
            )
            .await;
            (done >= 300).then_some(())
        }
    })
    .await;
    cluster.stop_server(false);
    // The outage's length is the scenario, not a wait for anything: three leases.
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster.start_server();
    let client = db.client().await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.tasks WHERE status = 'SUCCEEDED'",
        TASKS as i64,
        "every task to succeed after the outage",
    )
    .await;
    for daemon in &mut daemons {
        daemon.signal(libc::SIGTERM);
        assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    }
    let mut runs: std::collections::HashMap<i64, usize> = Default::default();
    for daemon in &daemons {
        for line in daemon.log_text().lines() {
            if !line.contains(pgtaskd::events::ANALYZER_RUN) {
                continue;
            }
            let id = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("id=")?.parse::<i64>().ok());
            *runs.entry(id.expect("an id")).or_default() += 1;
        }
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} tasks ran more than once, e.g. {:?}",
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    let rescued: usize = daemons
        .iter()
        .map(|d| d.log_text().matches("lease expired; task rescued").count())
        .sum();
    assert_eq!(rescued, 0, "no live claim was rescued");
}
