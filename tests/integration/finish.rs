//! Results with status, and Fenced finish (docs/design.md): results and status commit
//! together, and finishes are fenced.

use std::time::Duration;

use pgtaskd::analyzer::{analyze, Counts};
use pgtaskd::queue::{self, FinishError, Outcome, TaskStatus};
use tokio_postgres::Client;

use crate::support::{
    blocks_touched, count, eventually, statistics_say_empty, within, GatedAnalyzer,
    InProcessDaemon, TestDb, WAIT,
};

const OWNER: &str = "test-owner";

async fn claim_one(client: &Client, payload: &str) -> (i64, i64) {
    let id: i64 = client
        .query_one("SELECT pgtaskd.enqueue($1)", &[&payload])
        .await
        .unwrap()
        .get(0);
    let claimed = queue::claim(
        client,
        OWNER,
        &["default".into()],
        1,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, id);
    (id, claimed[0].token)
}

#[tokio::test]
async fn finish_commits_succeeded_with_the_three_counts() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let text = "naïve 日本語 text";
    let (id, attempt) = claim_one(&client, text).await;
    let status = queue::finish(
        &client,
        attempt,
        id,
        &Outcome::Succeeded(analyze(text)),
        true,
    )
    .await
    .unwrap();
    assert_eq!(status, TaskStatus::Succeeded);
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Succeeded);
    assert_eq!((task.words, task.bytes, task.runes), (3, 21, 14));
    assert_eq!(task.error, None);
    assert_eq!(task.lease_owner, None);
    assert_eq!(task.lease_expires_at, None);
    assert!(task.finished_at.is_some());
}

#[tokio::test]
async fn a_failed_analysis_with_partial_counts_commits_failed_with_zero_counts_and_the_error() {
    let db = TestDb::new().await;
    let config = db.config("[worker]\nconcurrency = 2\n");
    let analyzer = GatedAnalyzer::failing("the analyzer broke at byte 7");
    let daemon = InProcessDaemon::start(&db, config, analyzer.clone()).await;
    let client = db.client().await;
    let id: i64 = client
        .query_one("SELECT pgtaskd.enqueue('some words here')", &[])
        .await
        .unwrap()
        .get(0);
    let task = eventually(WAIT, "the task to fail", || {
        let client = &client;
        async move {
            queue::get(client, id)
                .await
                .unwrap()
                .filter(|t| t.status.is_terminal())
        }
    })
    .await;
    daemon.stop().await;
    assert_eq!(analyzer.calls_for("some words here"), 1);
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(
        (task.words, task.bytes, task.runes),
        (0, 0, 0),
        "partial counts are never stored"
    );
    assert_eq!(task.error.as_deref(), Some("the analyzer broke at byte 7"));
}

#[tokio::test]
async fn a_second_finish_is_not_running_and_the_first_result_stays() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (id, attempt) = claim_one(&client, "one two").await;
    queue::finish(
        &client,
        attempt,
        id,
        &Outcome::Succeeded(analyze("one two")),
        true,
    )
    .await
    .unwrap();
    let forged = Counts {
        words: 99,
        bytes: 99,
        runes: 99,
    };
    let second = queue::finish(&client, attempt, id, &Outcome::Succeeded(forged), true).await;
    assert!(
        matches!(
            second,
            Err(FinishError::NotRunning {
                status: TaskStatus::Succeeded
            })
        ),
        "{second:?}"
    );
    let failed = queue::finish(&client, attempt, id, &Outcome::Failed("late".into()), true).await;
    assert!(
        matches!(failed, Err(FinishError::NotRunning { .. })),
        "{failed:?}"
    );
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(
        (task.status, task.words, task.bytes, task.runes),
        (TaskStatus::Succeeded, 2, 7, 7)
    );
}

#[tokio::test]
async fn a_finish_of_an_unknown_id_is_not_found() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let result = queue::finish(&client, 1, 424242, &Outcome::Succeeded(analyze("x")), true).await;
    assert!(matches!(result, Err(FinishError::NotFound)), "{result:?}");
}

#[tokio::test]
async fn a_finish_under_any_other_claims_token_changes_nothing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (id, token) = claim_one(&client, "fenced").await;
    for other in [token + 1, token - 1, 0] {
        let result = queue::finish(
            &client,
            other,
            id,
            &Outcome::Succeeded(analyze("fenced")),
            true,
        )
        .await;
        assert!(
            matches!(
                result,
                Err(FinishError::NotRunning {
                    status: TaskStatus::Running
                })
            ),
            "token {other}: {result:?}"
        );
    }
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!((task.status, task.words), (TaskStatus::Running, 0));
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_the_row_running_and_a_real_finish_then_commits_once() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    let (id, attempt) = claim_one(&client, "rollback me").await;
    {
        let tx = client.transaction().await.unwrap();
        tx.execute(
            "UPDATE pgtaskd.task_state SET status = 'SUCCEEDED', words = 99, lease_owner = NULL, lease_expires_at = NULL WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
        let err = tx.execute("SELECT 1/0", &[]).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO)
        );
        tx.rollback().await.unwrap();
    }
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(
        (task.status, task.words, task.bytes, task.runes),
        (TaskStatus::Running, 0, 0, 0)
    );
    let status = queue::finish(
        &client,
        attempt,
        id,
        &Outcome::Succeeded(analyze("rollback me")),
        true,
    )
    .await
    .unwrap();
    assert_eq!(status, TaskStatus::Succeeded);
    let again = queue::finish(
        &client,
        attempt,
        id,
        &Outcome::Succeeded(analyze("rollback me")),
        true,
    )
    .await;
    assert!(
        matches!(again, Err(FinishError::NotRunning { .. })),
        "{again:?}"
    );
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(
        (task.status, task.words, task.bytes, task.runes),
        (TaskStatus::Succeeded, 2, 11, 11)
    );
}

#[tokio::test]
async fn the_table_refuses_results_on_a_row_that_did_not_succeed() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (id, _) = claim_one(&client, "x").await;
    let err = client
        .execute(
            "UPDATE pgtaskd.task_state SET words = 5 WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)
    );
    let err = client
        .execute(
            "UPDATE pgtaskd.task_state SET status = 'FAILED', lease_owner = NULL, lease_expires_at = NULL WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
        "FAILED needs an error"
    );
}

#[tokio::test]
async fn release_puts_the_claim_back_to_queued_without_counting_an_attempt() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (id, attempt) = claim_one(&client, "released").await;
    let status = queue::release(&client, attempt, id, true).await.unwrap();
    assert_eq!(status, TaskStatus::Queued);
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(
        (task.status, task.attempt, task.lease_owner.as_deref()),
        (TaskStatus::Queued, 0, None)
    );
    let again = queue::release(&client, attempt, id, true).await;
    assert!(
        matches!(
            again,
            Err(FinishError::NotRunning {
                status: TaskStatus::Queued
            })
        ),
        "{again:?}"
    );
}

/// An analyzer that panics, on the async thread (`inline`) or on a blocking one.
struct Panicking {
    inline: bool,
}

impl pgtaskd::analyzer::Analyzer for Panicking {
    fn analyze(
        &self,
        _text: &str,
        _cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Counts, pgtaskd::analyzer::AnalyzeError> {
        panic!("the analyzer fell over")
    }

    fn inline_below(&self) -> usize {
        if self.inline {
            usize::MAX
        } else {
            0
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_analyzer_that_panics_leaves_the_task_failed_inline_or_on_a_blocking_thread() {
    for inline in [true, false] {
        let db = TestDb::new().await;
        let client = db.client().await;
        let daemon = InProcessDaemon::start(
            &db,
            db.config(""),
            std::sync::Arc::new(Panicking { inline }),
        )
        .await;
        let id = crate::support::enqueue(&client, "boom").await;
        let task = crate::support::wait_status(&client, id, TaskStatus::Failed).await;
        daemon.stop().await;
        assert_eq!(
            task.error.as_deref(),
            Some("handler panicked: the analyzer fell over"),
            "inline: {inline}"
        );
        assert_eq!((task.words, task.bytes, task.runes), (0, 0, 0));
    }
}

/// A daemon's session plans the finish and the cancel once, maybe while the table is empty
/// (a fresh queue, or one just drained and vacuumed: its statistics then say "no rows"
/// however it grows, until the next vacuum or analyze). Once the table holds many rows, each
/// call still reads its own rows only, never the whole table or a whole partial index.
#[tokio::test]
async fn a_finish_and_a_cancel_planned_on_an_empty_table_read_only_their_rows_once_it_grew() {
    const ROWS: i64 = 60_000;
    let db = TestDb::new().await;
    let client = db.client().await;
    statistics_say_empty(&client).await;
    // This session plans every statement of both functions while the table is empty: a
    // finish, a cancel of a QUEUED task, a cancel of a RUNNING one, and a cancel of neither.
    let (id, attempt) = claim_one(&client, "planned while empty").await;
    let success = Outcome::Succeeded(Counts {
        words: 3,
        bytes: 19,
        runes: 19,
    });
    queue::finish(&client, attempt, id, &success, true)
        .await
        .unwrap();
    let (running, _) = claim_one(&client, "canceled while running").await;
    let queued: i64 = client
        .query_one("SELECT pgtaskd.enqueue('canceled while queued')", &[])
        .await
        .unwrap()
        .get(0);
    for cancel in [queued, running, id] {
        client
            .execute("SELECT pgtaskd.cancel($1)", &[&cancel])
            .await
            .unwrap();
    }
    // The table grows to a backlog and as many running tasks of other daemons, the
    // statistics still saying it is empty: the tasks inserted, then the odd ones' state rows
    // (`pgtaskd.task_state`, schema 36) set running. The statistics saying "no rows", the
    // setup's own join is kept from a nested loop over both tables.
    client
        .batch_execute(&format!(
            "BEGIN;
             SET LOCAL enable_nestloop = off;
             INSERT INTO pgtaskd.tasks (payload)
             SELECT 'backlog ' || i FROM generate_series(1, {ROWS}::int8) i;
             UPDATE pgtaskd.task_state AS s
                SET status = 'RUNNING', attempt = 1, lease_owner = 'another daemon',
                    lease_expires_at = now() + interval '1 hour', started_at = now()
               FROM pgtaskd.tasks AS t
              WHERE t.id = s.id AND t.payload LIKE 'backlog %'
                AND split_part(t.payload, ' ', 2)::int8 % 2 = 1;
             COMMIT;"
        ))
        .await
        .unwrap();
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
    // The state rows' table: the one the finish and the cancel scan. The test's own reads
    // below go to it too, not through the view: planned on statistics that say "no rows",
    // the view's join of the two tables is a nested loop over both (minutes at this size).
    let table_blocks = count(
        &client,
        "SELECT pg_relation_size('pgtaskd.task_state') / current_setting('block_size')::int8",
    )
    .await;
    // A handful of blocks per call: the index descents and the row's own page; the table
    // alone is `table_blocks`.
    let bound = 40;
    assert!(
        table_blocks > 10 * bound,
        "the table is {table_blocks} blocks"
    );

    let id = client
        .query_one(
            "UPDATE pgtaskd.task_state SET status = 'RUNNING', attempt = 1, lease_owner = $1,
                        claim_token = 7,
                        lease_expires_at = now() + interval '1 hour', started_at = now()
                  WHERE id = (SELECT max(id) FROM pgtaskd.task_state WHERE status = 'QUEUED')
                 RETURNING id",
            &[&OWNER],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    let finish = |id: i64, token: i64| {
        format!(
            "pgtaskd.finish(ARRAY[{token}]::int8[], ARRAY[{id}]::int8[], ARRAY['SUCCEEDED'],
                            ARRAY[1]::int8[], ARRAY[1]::int8[], ARRAY[1]::int8[],
                            ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::float8[],
                            false)"
        )
    };
    // A call of each function that writes nothing (no task 0) first: the session's catalog
    // caches, flushed whenever its backend fell behind the other tests' migrations on the
    // same cluster (an invalidation queue overflowed while the setup ran), are read again
    // there, not counted below (a few hundred catalog blocks). The plans stay those made
    // while the statistics say "no rows".
    for warm in [finish(0, 0), "pgtaskd.request_cancel(0)".to_string()] {
        blocks_touched(&client, &warm).await;
    }
    let touched = blocks_touched(&client, &finish(id, 7)).await;
    assert!(
        touched <= bound,
        "a finish of one task touched {touched} blocks of a {table_blocks}-block table"
    );
    assert_eq!(
        queue::get(&client, id).await.unwrap().unwrap().status,
        TaskStatus::Succeeded,
        "and it finished the task"
    );
    for status in ["QUEUED", "RUNNING"] {
        let victim = count(
            &client,
            &format!("SELECT max(id) FROM pgtaskd.task_state WHERE status = '{status}'"),
        )
        .await;
        let touched = blocks_touched(&client, &format!("pgtaskd.request_cancel({victim})")).await;
        assert!(
            touched <= bound,
            "a cancel of a {status} task touched {touched} blocks of a {table_blocks}-block table"
        );
        assert!(
            queue::get(&client, victim)
                .await
                .unwrap()
                .unwrap()
                .cancel_requested,
            "and it recorded the cancel of the {status} task"
        );
    }
}

/// The daemon's finish statement (`queue::finish_many`) reads the state rows it answers by
/// primary key, and never scans the state table: flattened into a join, its read of the
/// FAILED rows' queue and attempt was planned as a hash of the whole table at every finish,
/// on any table under about a million rows. The scans are this transaction's own
/// (`pg_stat_xact_user_tables`), so no other session's count in.
#[tokio::test]
async fn the_daemons_finish_statement_never_scans_the_state_table() {
    let db = TestDb::new().await;
    let client = db.client().await;
    within(
        WAIT,
        "1,000 tasks, analyzed",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'p' || n FROM generate_series(1, 1000) AS n;
             ANALYZE pgtaskd.task_state",
        ),
    )
    .await
    .unwrap();
    let claimed = within(
        WAIT,
        "two claims",
        queue::claim(
            &client,
            OWNER,
            &["default".into()],
            2,
            Duration::from_secs(30),
        ),
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 2);
    let finishes = [
        queue::Finish {
            id: claimed[0].id,
            token: claimed[0].token,
            outcome: Outcome::Succeeded(analyze("two words")),
        },
        queue::Finish {
            id: claimed[1].id,
            token: claimed[1].token,
            outcome: Outcome::Failed("broke".into()),
        },
    ];
    within(WAIT, "BEGIN", client.batch_execute("BEGIN"))
        .await
        .unwrap();
    let answers = within(
        WAIT,
        "the daemon's finish of both",
        queue::finish_many(&client, &finishes),
    )
    .await
    .unwrap();
    let scans = within(
        WAIT,
        "this transaction's scans",
        count(
            &client,
            "SELECT seq_scan FROM pg_stat_xact_user_tables
              WHERE relid = 'pgtaskd.task_state'::regclass",
        ),
    )
    .await;
    within(WAIT, "COMMIT", client.batch_execute("COMMIT"))
        .await
        .unwrap();
    assert!(
        matches!(
            answers[..],
            [Ok(TaskStatus::Succeeded), Ok(TaskStatus::Failed)]
        ),
        "{answers:?}"
    );
    assert_eq!(scans, 0, "the finish scanned the state table");
}
