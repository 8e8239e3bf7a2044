//! The upgrade to schema 36 (release 0.2.0, docs/upgrading.md): the state of every task
//! leaves `pgtaskd.tasks` for `pgtaskd.task_state`. From schema 29 with tasks of every state
//! a daemon may leave behind, none is lost, none runs twice, none runs early; the roles the
//! grant functions gave before keep their rights; a reader of the old columns fails loudly.

use std::time::Duration;

use pgtaskd::events::ANALYZER_RUN;
use tokio_postgres::error::SqlState;

use crate::migrate::database_at;
use crate::support::daemon::DaemonProcess;
use crate::support::{connect, eventually, texts, within, WAIT};

/// The columns the view had at schema 29, in its order: what the upgrade keeps, row by row.
const VIEW_29: &str = "SELECT (id, queue, payload, status, priority, run_at, attempt, max_attempts,
        cancel_requested, words, bytes, runes, error, lease_owner, lease_expires_at, created_at,
        started_at, finished_at, idempotency_key, claim_token, output, traceparent)::text
   FROM pgtaskd.task_view ORDER BY id";

/// Tasks of queue `up` as daemons of schema 29 leave them, by id:
/// 1 QUEUED; 2 a retry waiting an hour with its error; 3 RUNNING under a live lease of a
/// crashed daemon; 4 RUNNING under an expired lease; 5 SUCCEEDED; 6 FAILED; 7 CANCELED;
/// 8 RUNNING under an expired lease with its result parked by a daemon that stopped.
const EVERY_STATE: &str = "
INSERT INTO pgtaskd.tasks (payload, queue, idempotency_key)
SELECT 'p' || n || ' two words', 'up', CASE WHEN n = 5 THEN 'kept-key' END
  FROM generate_series(1, 8) AS n;
UPDATE pgtaskd.tasks SET run_at = now() + interval '1 hour', attempt = 1,
       error = 'exited with status 3' WHERE id = 2;
UPDATE pgtaskd.tasks SET status = 'RUNNING', attempt = 1, lease_owner = 'crashed',
       lease_expires_at = now() + interval '1 hour', started_at = now(), claim_token = 77
 WHERE id = 3;
UPDATE pgtaskd.tasks SET status = 'RUNNING', attempt = 1, lease_owner = 'crashed',
       lease_expires_at = now() - interval '1 minute', started_at = now() - interval '2 minutes',
       claim_token = 78 WHERE id = 4;
UPDATE pgtaskd.tasks SET status = 'SUCCEEDED', attempt = 1, words = 3, bytes = 13, runes = 13,
       started_at = now(), finished_at = now(), output = 'done' WHERE id = 5;
UPDATE pgtaskd.tasks SET status = 'FAILED', attempt = 3, error = 'bad', finished_at = now()
 WHERE id = 6;
UPDATE pgtaskd.tasks SET status = 'CANCELED', cancel_requested = true, finished_at = now()
 WHERE id = 7;
UPDATE pgtaskd.tasks SET status = 'RUNNING', attempt = 1, lease_owner = 'stopped',
       lease_expires_at = now() - interval '1 minute', started_at = now() - interval '2 minutes',
       claim_token = 79 WHERE id = 8;
INSERT INTO pgtaskd.parked_results (task_id, claim_token, status, words, bytes, runes)
VALUES (8, 79, 'SUCCEEDED', 42, 43, 44);";

#[tokio::test]
async fn schema_36_keeps_every_task_of_schema_29_and_a_daemon_runs_each_once_and_none_early() {
    let (db, mut owner) = database_at(29).await;
    within(
        WAIT,
        "tasks of every state",
        owner.batch_execute(EVERY_STATE),
    )
    .await
    .unwrap();
    let before = texts(&owner, VIEW_29).await;
    assert_eq!(before.len(), 8);
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    assert_eq!(
        texts(&owner, VIEW_29).await,
        before,
        "every task keeps every column of the view"
    );
    // The state is no longer a column of the table: a reader of it fails, never reads a
    // stale value.
    let err = within(
        WAIT,
        "reading status from the table",
        owner.query("SELECT status FROM pgtaskd.tasks", &[]),
    )
    .await
    .expect_err("the state columns left the table");
    assert_eq!(err.code(), Some(&SqlState::UNDEFINED_COLUMN), "{err}");
    // A producer's keyed insert still meets its key, and a new task gets its state.
    let (conflicts, new_id): (i64, i64) = {
        let row = within(
            WAIT,
            "producers' statements",
            owner.query_one(
                "WITH dup AS (INSERT INTO pgtaskd.tasks (payload, queue, idempotency_key)
                              VALUES ('again', 'up', 'kept-key')
                              ON CONFLICT (queue, idempotency_key)
                                 WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id),
                      new AS (INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('p9 new', 'up')
                              RETURNING id)
                 SELECT (SELECT count(*) FROM dup), (SELECT id FROM new)",
                &[],
            ),
        )
        .await
        .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(conflicts, 0, "the key of task 5 is still taken");

    // A daemon of this release on the upgraded database: it runs what is due, once; writes
    // the parked result without running its task; takes back the expired lease; leaves the
    // live lease and the waiting retry alone.
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 2\nqueues = [\"up\"]\nlease = \"2s\"\npoll_interval = \"200ms\"\n",
        &[],
    );
    let ended = eventually(Duration::from_secs(60), "the due tasks ended", || async {
        let ended = texts(
            &owner,
            &format!(
                "SELECT id || ' ' || status || ' ' || attempt || ' ' || words
                   FROM pgtaskd.task_view WHERE id IN (1, 4, 8, {new_id})
                    AND status = 'SUCCEEDED' ORDER BY id"
            ),
        )
        .await;
        (ended.len() == 4).then_some(ended)
    })
    .await;
    daemon.stop_cleanly().await;
    assert_eq!(
        ended,
        [
            "1 SUCCEEDED 1 3".to_string(),
            "4 SUCCEEDED 2 3".to_string(),
            "8 SUCCEEDED 1 42".to_string(),
            format!("{new_id} SUCCEEDED 1 2")
        ],
        "the queued and the new task at their first attempt, the expired lease at its \
         second, the parked result as it was parked"
    );
    let runs: Vec<i64> = daemon
        .log_text()
        .lines()
        .filter(|line| line.contains(ANALYZER_RUN))
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("id="))
                .and_then(|v| v.parse().ok())
        })
        .collect();
    let mut sorted = runs.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [1, 4, new_id],
        "each due task ran once; the parked one never"
    );
    let rest = texts(
        &owner,
        "SELECT id || ' ' || status || ' ' || coalesce(lease_owner, '-') || ' '
                || (run_at > now() + interval '50 minutes')
           FROM pgtaskd.task_view WHERE id IN (2, 3, 5, 6, 7) ORDER BY id",
    )
    .await;
    assert_eq!(
        rest,
        [
            "2 QUEUED - true",
            "3 RUNNING crashed false",
            "5 SUCCEEDED - false",
            "6 FAILED - false",
            "7 CANCELED - false"
        ],
        "the retry still waits, the live lease is still held, the ended stay ended"
    );
}

#[tokio::test]
async fn schema_36_gives_the_roles_of_schema_35_the_state_they_read_and_write() {
    let tag = format!("{:08x}", fastrand::u32(..));
    let (daemon_role, ops_role, app_role) = (
        format!("st_daemon_{tag}"),
        format!("st_ops_{tag}"),
        format!("st_app_{tag}"),
    );
    let (_db, mut owner) = database_at(35).await;
    within(
        WAIT,
        "the roles of schema 35",
        owner.batch_execute(&format!(
            "CREATE ROLE {daemon_role}; SELECT pgtaskd.grant_daemon('{daemon_role}');
             CREATE ROLE {ops_role}; SELECT pgtaskd.grant_operator('{ops_role}');
             CREATE ROLE {app_role}; SELECT pgtaskd.grant_producer('{app_role}');"
        )),
    )
    .await
    .unwrap();
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    // The producer inserts and reads state through the view; the daemon claims and
    // finishes; the operator retries.
    let steps = [
        (
            &app_role,
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('one two') RETURNING id::text",
        ),
        (
            &app_role,
            "SELECT status FROM pgtaskd.task_view WHERE id = 1",
        ),
        (
            &daemon_role,
            "SELECT task_claim::text FROM pgtaskd.claim(ARRAY['default'], 1, 'me', 60000, \
             1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL",
        ),
    ];
    let mut answers = Vec::new();
    for (role, sql) in steps {
        within(
            WAIT,
            "acting as a role",
            owner.batch_execute(&format!("SET ROLE {role}")),
        )
        .await
        .unwrap();
        answers.push(
            texts(&owner, sql)
                .await
                .first()
                .cloned()
                .unwrap_or_default(),
        );
        within(WAIT, "back", owner.batch_execute("RESET ROLE"))
            .await
            .unwrap();
    }
    assert_eq!(answers[..2], ["1".to_string(), "QUEUED".to_string()]);
    let token: i64 = answers[2]
        .parse()
        .expect("the daemon role claimed the task");
    within(
        WAIT,
        "as the daemon",
        owner.batch_execute(&format!("SET ROLE {daemon_role}")),
    )
    .await
    .unwrap();
    let written = texts(
        &owner,
        &format!(
            "SELECT written FROM pgtaskd.finish(ARRAY[{token}]::bigint[], ARRAY[1]::bigint[], \
             ARRAY['FAILED'], ARRAY[0]::bigint[], ARRAY[0]::bigint[], ARRAY[0]::bigint[], \
             ARRAY['no'], ARRAY[NULL]::text[], ARRAY[NULL]::float8[], false)"
        ),
    )
    .await;
    assert_eq!(written, ["FAILED"]);
    within(
        WAIT,
        "as the operator",
        owner.batch_execute(&format!("RESET ROLE; SET ROLE {ops_role}")),
    )
    .await
    .unwrap();
    assert_eq!(texts(&owner, "SELECT pgtaskd.retry(1)").await, ["FAILED"]);
    assert_eq!(
        texts(&owner, "SELECT status FROM pgtaskd.task_view WHERE id = 1").await,
        ["QUEUED"]
    );
}

/// A daemon of the previous release still connected would claim through the new functions
/// and fail at every finish: the migration refuses while one is, naming it, and applies once
/// it is gone.
#[tokio::test]
async fn schema_36_refuses_to_apply_while_a_daemon_is_connected() {
    let (db, mut owner) = database_at(35).await;
    let daemon = connect(&format!("{} application_name=pgtaskd/old-daemon", db.url)).await;
    let err = within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .expect_err("a daemon is connected");
    let text = format!("{err:?}");
    assert!(
        text.contains("pgtaskd daemons are connected") && text.contains("pgtaskd/old-daemon"),
        "{text}"
    );
    assert_eq!(
        pgtaskd::db::migrate::current_version(&owner).await.unwrap(),
        Some(35),
        "nothing applied"
    );
    drop(daemon);
    eventually(WAIT, "the daemon's session gone", || async {
        let left: i64 = owner
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgtaskd/old-daemon'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (left == 0).then_some(())
    })
    .await;
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
}

/// A transaction left open on the table does not hold every producer's insert behind the
/// migration's lock request for long: the migration gives up within its lock timeout, the
/// insert goes through, and the migration applies once the transaction ends.
#[tokio::test]
async fn schema_36_gives_up_on_a_lock_held_elsewhere_and_applies_later() {
    let (db, mut owner) = database_at(35).await;
    let holder = db.client().await;
    within(
        WAIT,
        "a transaction left open",
        holder.batch_execute("BEGIN; SELECT count(*) FROM pgtaskd.tasks"),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "a short lock timeout",
        owner.batch_execute("SET lock_timeout = '1s'"),
    )
    .await
    .unwrap();
    let err = within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .expect_err("the table is held");
    assert!(format!("{err:?}").contains("lock timeout"), "{err:?}");
    let producer = db.client().await;
    within(
        WAIT,
        "a producer's insert meanwhile",
        producer.execute(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('meanwhile')",
            &[],
        ),
    )
    .await
    .unwrap();
    within(WAIT, "the transaction ends", holder.batch_execute("COMMIT"))
        .await
        .unwrap();
    within(
        WAIT,
        "migrating again",
        pgtaskd::db::migrate::migrate(&mut owner),
    )
    .await
    .unwrap();
    let status: String = within(
        WAIT,
        "the task inserted meanwhile",
        owner.query_one(
            "SELECT status FROM pgtaskd.task_view WHERE payload = 'meanwhile'",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(status, "QUEUED");
}

/// From schema 29 the migrations before 36 take the task table's lock too: the whole
/// migration waits at most 10 s for any lock (not until the statement timeout, or for ever),
/// and fails with the lock timeout while a transaction holds the table.
#[tokio::test]
async fn a_migration_from_schema_29_waits_at_most_ten_seconds_for_a_held_table() {
    let (db, mut owner) = database_at(29).await;
    let holder = db.client().await;
    within(
        WAIT,
        "a row lock left open",
        holder.batch_execute("BEGIN; SELECT id FROM pgtaskd.tasks FOR UPDATE"),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let err = within(
        Duration::from_secs(30),
        "the migration to give up",
        pgtaskd::db::migrate::migrate(&mut owner),
    )
    .await
    .expect_err("the table is held");
    assert!(format!("{err:?}").contains("lock timeout"), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "gave up after {:?}",
        started.elapsed()
    );
    within(WAIT, "the transaction ends", holder.batch_execute("COMMIT"))
        .await
        .unwrap();
    within(
        WAIT,
        "migrating again",
        pgtaskd::db::migrate::migrate(&mut owner),
    )
    .await
    .unwrap();
}

/// A session's statement timeout does not cut a migration short: schema 36 copies every
/// task's state, which takes seconds on millions of rows.
#[tokio::test]
async fn a_migration_runs_whatever_the_sessions_statement_timeout() {
    let (_db, mut owner) = database_at(35).await;
    within(
        WAIT,
        "tasks and a statement timeout of a millisecond",
        owner.batch_execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'task ' || g FROM generate_series(1, 100000) AS g;
             SET statement_timeout = '100ms'",
        ),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(100),
        "the migration took {:?}: longer than the timeout, or this proves nothing",
        started.elapsed()
    );
    within(
        WAIT,
        "the timeout reset",
        owner.batch_execute("RESET statement_timeout"),
    )
    .await
    .unwrap();
    let states: i64 = within(
        WAIT,
        "the states",
        owner.query_one("SELECT count(*) FROM pgtaskd.task_state", &[]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(states, 100000);
}

/// Schema 36 copied every right to update or delete task rows onto the state rows; schema 46
/// takes back what the grant functions of 0.2.0 do not give: `DELETE` on the state from every
/// role, `UPDATE` on it from every role that may not claim. A daemon's role keeps `UPDATE`, a
/// role keeps `DELETE` on the task rows (deleting a task deletes its state through the
/// owner's trigger).
#[tokio::test]
async fn schema_46_takes_back_the_state_rights_that_schema_36_copied_beyond_the_grants() {
    let tag = format!("{:08x}", fastrand::u32(..));
    let (daemon_role, hand_role) = (format!("sr_daemon_{tag}"), format!("sr_hand_{tag}"));
    let (_db, mut owner) = database_at(35).await;
    within(
        WAIT,
        "the roles of schema 35",
        owner.batch_execute(&format!(
            "CREATE ROLE {daemon_role}; SELECT pgtaskd.grant_daemon('{daemon_role}');
             CREATE ROLE {hand_role};
             GRANT USAGE ON SCHEMA pgtaskd TO {hand_role};
             GRANT SELECT, UPDATE, DELETE ON pgtaskd.tasks TO {hand_role};"
        )),
    )
    .await
    .unwrap();
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    let may = |role: &str, table: &str, right: &str| {
        format!("SELECT has_table_privilege('{role}', 'pgtaskd.{table}', '{right}')::text")
    };
    let checks = [
        (may(&daemon_role, "task_state", "UPDATE"), "true"),
        (may(&daemon_role, "task_state", "DELETE"), "false"),
        (may(&hand_role, "task_state", "UPDATE"), "false"),
        (may(&hand_role, "task_state", "DELETE"), "false"),
        (may(&hand_role, "task_state", "SELECT"), "true"),
        (may(&hand_role, "tasks", "DELETE"), "true"),
    ];
    for (sql, expected) in checks {
        assert_eq!(
            texts(&owner, &sql).await,
            vec![expected.to_string()],
            "{sql}"
        );
    }
    // The hand role's delete of a task still takes its state with it.
    within(
        WAIT,
        "a task and its delete by the hand role",
        owner.batch_execute(&format!(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('gone');
             SET ROLE {hand_role};
             DELETE FROM pgtaskd.tasks WHERE payload = 'gone';
             RESET ROLE;"
        )),
    )
    .await
    .unwrap();
    assert_eq!(
        texts(&owner, "SELECT count(*)::text FROM pgtaskd.task_state").await,
        vec!["0".to_string()]
    );
}

/// A `created_at` that no reader can use (infinite, or past the year 262142) stopped every
/// claim of its queue and failed every read of the task through the view. Schema 47 gives
/// such rows the migration's time, and refuses them at the insert, naming the constraint.
#[tokio::test]
async fn schema_47_mends_a_creation_time_no_reader_could_use_and_refuses_new_ones() {
    let (_db, mut owner) = database_at(46).await;
    within(
        WAIT,
        "tasks of schema 46, three with a creation time no reader can use",
        owner.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload, created_at) VALUES
                 ('when', 'infinite', 'infinity'),
                 ('when', 'before all', '-infinity'),
                 ('when', 'far', '294000-01-01 00:00:00+00'),
                 ('when', 'now', now());",
        ),
    )
    .await
    .unwrap();
    let claim = "SELECT count(*)::text FROM pgtaskd.claim(ARRAY['when'], 10, 'k0123456789', \
                 60000, 1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL";
    let stopped = within(WAIT, "a claim at schema 46", owner.query(claim, &[]))
        .await
        .expect_err("schema 46 could not claim past an infinite creation time");
    assert_eq!(
        stopped.code(),
        Some(&SqlState::DATETIME_FIELD_OVERFLOW),
        "{stopped:?}"
    );

    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    assert_eq!(
        texts(
            &owner,
            "SELECT payload || ' ' || (created_at > now() - interval '1 hour' \
                                       AND created_at <= now())::text \
               FROM pgtaskd.task_view ORDER BY id"
        )
        .await,
        ["infinite true", "before all true", "far true", "now true"],
        "every creation time is one a reader can use, the mended ones the migration's"
    );
    assert_eq!(texts(&owner, claim).await, ["4"], "the queue claims again");

    for bad in ["infinity", "-infinity", "262142-01-01 00:00:00+00"] {
        let refused = within(
            WAIT,
            "an insert of a creation time no reader can use",
            owner.execute(
                "INSERT INTO pgtaskd.tasks (queue, payload, created_at) \
                 VALUES ('when', 'x', $1::text::timestamptz)",
                &[&bad],
            ),
        )
        .await
        .expect_err(bad);
        let message = refused.as_db_error().map(|e| e.message().to_string());
        assert_eq!(
            refused.code(),
            Some(&SqlState::CHECK_VIOLATION),
            "{bad}: {refused:?}"
        );
        assert!(
            message
                .as_deref()
                .unwrap_or("")
                .contains("tasks_created_at_range"),
            "{bad}: {message:?}"
        );
    }
    within(
        WAIT,
        "an insert of a creation time long ago",
        owner.execute(
            "INSERT INTO pgtaskd.tasks (queue, payload, created_at) \
             VALUES ('when', 'old', '0001-01-01 00:00:00+00 BC')",
            &[],
        ),
    )
    .await
    .expect("a finite time before 1970 is a time the key holds");
}
