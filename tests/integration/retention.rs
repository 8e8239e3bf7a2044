//! Retention's deletes and the daemon's vacuum of the tasks' state rows (`pgtaskd.task_state`
//! since schema 36; docs/design.md, "Vacuum"): only finished rows older than the setting are
//! deleted, in batches that start after the rows the pass deleted and stay fast on a table
//! whose statistics say it is empty;
//! the daemon vacuums the table once it pruned enough rows, vacuums it itself while
//! autovacuum is off for it, and leaves it to autovacuum where that covers it.

use std::time::Duration;

use pgtaskd::queue;

use crate::support::{
    count, eventually, hold_snapshot, insert_payloads, statistics_say_empty, wait_count, within,
    DaemonProcess, TestDb, WAIT,
};

#[tokio::test]
async fn retention_deletes_only_finished_rows_older_than_the_setting() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'old ' || i FROM generate_series(1, 2500) i;
             INSERT INTO pgtaskd.tasks (payload) VALUES ('recent'), ('queued'), ('running');
             UPDATE pgtaskd.task_state SET status = 'CANCELED', cancel_requested = true, finished_at = now() - interval '2 days'
              WHERE id IN (SELECT id FROM pgtaskd.tasks WHERE payload LIKE 'old %');
             UPDATE pgtaskd.task_state SET status = 'CANCELED', cancel_requested = true, finished_at = now()
              WHERE id IN (SELECT id FROM pgtaskd.tasks WHERE payload = 'recent');",
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
        .query("SELECT payload FROM pgtaskd.task_view ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["recent", "queued", "running"]);
}

/// `rows` CANCELED rows that finished two days ago, a millisecond apart, in id order: the
/// tasks inserted, then their state rows (`pgtaskd.task_state`, schema 36) set finished, in
/// one transaction (its join kept from a nested loop where the statistics say "no rows").
async fn insert_finished_two_days_ago(client: &tokio_postgres::Client, rows: i64) {
    within(
        WAIT,
        "finished rows to be inserted",
        client.batch_execute(&format!(
            "BEGIN;
             SET LOCAL enable_nestloop = off;
             INSERT INTO pgtaskd.tasks (payload)
             SELECT 'old ' || i FROM generate_series(1, {rows}::int8) i;
             UPDATE pgtaskd.task_state AS s
                SET status = 'CANCELED', cancel_requested = true,
                    finished_at = now() - interval '2 days'
                                  + split_part(t.payload, ' ', 2)::int8 * interval '1 ms'
               FROM pgtaskd.tasks AS t
              WHERE t.id = s.id AND t.payload LIKE 'old %' AND s.status = 'QUEUED';
             COMMIT;"
        )),
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
            "SELECT max(reltuples)::int8 FROM pg_class
              WHERE oid IN ('pgtaskd.tasks'::regclass, 'pgtaskd.task_state'::regclass)"
        )
        .await,
        0,
        "the statistics still say the tables are empty"
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
    // The daemon's vacuum is the only one: an autovacuum of the table at the same moment
    // (the inserts and the deletes below make one due) would make it skip (SKIP_LOCKED),
    // and the count of vacuums it ran would never move (failed once in five full runs).
    // The table the daemon vacuums is the state rows' (`pgtaskd.task_state`, schema 36).
    client
        .batch_execute("ALTER TABLE pgtaskd.task_state SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let rows = pgtaskd::maintenance::vacuum::VACUUM_AFTER as i64 + 10;
    insert_finished_two_days_ago(&client, rows).await;
    let vacuums =
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pgtaskd.task_state'::regclass";
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
        "SELECT count(*) FROM pgtaskd.task_view",
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

/// Vacuums of the state rows' table (`pgtaskd.task_state`, schema 36): the one the daemon's
/// claims and finishes churn, and the one it vacuums.
const MANUAL_VACUUMS: &str =
    "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pgtaskd.task_state'::regclass";

/// Drain `n` tasks with a daemon of default settings (no retention), and return the table's
/// manual vacuum count, read a few of the vacuum's checks after the last finish.
async fn drain_without_retention(db: &TestDb, n: usize) -> i64 {
    let client = db.client().await;
    insert_payloads(&client, n).await;
    let mut daemon = DaemonProcess::start(db, "", &[]);
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
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
        .batch_execute("ALTER TABLE pgtaskd.task_state SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    // Two dead versions a task: this many make one vacuum due.
    let n = pgtaskd::maintenance::vacuum::VACUUM_AFTER as usize / 2 + 100;
    let vacuums = drain_without_retention(&db, n).await;
    assert!(
        vacuums >= 1,
        "the daemon vacuumed the table ({vacuums} vacuums)"
    );
    // Counted in the heap itself: the statistics' `n_dead_tup` also adds what a backend had
    // not yet reported when the vacuum ran (reports wait up to a second, longer on a busy
    // machine), dead versions the vacuum had already removed.
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .await
        .unwrap();
    let dead = count(
        &client,
        "SELECT dead_tuple_count FROM pgstattuple('pgtaskd.task_state')",
    )
    .await;
    assert!(
        dead < pgtaskd::maintenance::vacuum::VACUUM_AFTER as i64,
        "the daemon's vacuum removed the dead versions ({dead} left)"
    );
}

/// Where autovacuum covers the table, the daemon without retention leaves vacuuming to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_leaves_vacuuming_to_autovacuum_where_it_covers_the_table() {
    let cluster = crate::support::Cluster::start_with(&[("autovacuum", "on")], &[]);
    let db = TestDb::on(&cluster).await;
    let n = pgtaskd::maintenance::vacuum::VACUUM_AFTER as usize / 2 + 100;
    assert_eq!(drain_without_retention(&db, n).await, 0, "no manual vacuum");
}
