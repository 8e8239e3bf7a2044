//! The two rows of a task (schema 36, docs/design.md, "Table `pgtaskd.task_state`"): what
//! the producer wrote in `pgtaskd.tasks`, never updated; its state in `pgtaskd.task_state`,
//! kept beside it by the table's triggers. What a careless owner, a restore or a hostile
//! role can do to the pair.

use tokio_postgres::error::SqlState;

use crate::support::{texts, within, TestDb, WAIT};

const CLAIM_ONE: &str = "SELECT task_id::text FROM pgtaskd.claim(ARRAY['q'], 1, 'me', 60000, \
                         1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL";

/// A state row whose task row is gone (deleted with the triggers disabled) is neither shown
/// nor claimed: a claim of one task takes the next, where it would have spent its one slot
/// on the orphan at every call and left the queue stalled.
#[tokio::test]
async fn a_state_row_without_its_task_stalls_nothing_and_is_not_shown() {
    let db = TestDb::new().await;
    let client = db.client().await;
    within(
        WAIT,
        "three tasks, the first one's task row deleted alone",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT 'q', 'p' || n FROM generate_series(1, 3) AS n;
             ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_state_gone;
             DELETE FROM pgtaskd.tasks WHERE id = 1;
             ALTER TABLE pgtaskd.tasks ENABLE TRIGGER tasks_state_gone;",
        ),
    )
    .await
    .unwrap();
    assert_eq!(texts(&client, CLAIM_ONE).await, ["2"]);
    assert_eq!(texts(&client, CLAIM_ONE).await, ["3"]);
    assert_eq!(
        texts(
            &client,
            "SELECT id::text FROM pgtaskd.task_view ORDER BY id"
        )
        .await,
        ["2", "3"],
        "a task is its two rows"
    );
}

/// A task's id never changes (it would part the task from its state), and only the owner may
/// update a task row at all: the daemon's role, which updated rows before schema 36, may not.
#[tokio::test]
async fn a_task_row_keeps_its_id_and_the_daemon_role_cannot_update_it() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let role = format!("ts_daemon_{:08x}", fastrand::u32(..));
    within(
        WAIT,
        "a task and a daemon role",
        client.batch_execute(&format!(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('q', 'one');
             CREATE ROLE {role}; SELECT pgtaskd.grant_daemon('{role}');"
        )),
    )
    .await
    .unwrap();
    let err = within(
        WAIT,
        "the owner moves the id",
        client.execute("UPDATE pgtaskd.tasks SET id = DEFAULT WHERE id = 1", &[]),
    )
    .await
    .expect_err("an id does not change");
    assert!(
        format!("{err:?}").contains("the id of a task does not change"),
        "{err:?}"
    );
    within(
        WAIT,
        "as the daemon role",
        client.batch_execute(&format!("SET ROLE {role}")),
    )
    .await
    .unwrap();
    for statement in [
        "UPDATE pgtaskd.tasks SET payload = 'rewritten' WHERE id = 1",
        "UPDATE pgtaskd.tasks SET id = DEFAULT WHERE id = 1",
    ] {
        let err = within(WAIT, statement, client.execute(statement, &[]))
            .await
            .expect_err("the daemon role may not update task rows");
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{statement}: {err}"
        );
    }
    // What it needs still works: claim, and retention through the owner's rights.
    assert_eq!(texts(&client, CLAIM_ONE).await, ["1"]);
    within(WAIT, "back", client.batch_execute("RESET ROLE"))
        .await
        .unwrap();
    within(
        WAIT,
        "the task finished long ago",
        client.batch_execute(
            "UPDATE pgtaskd.task_state SET status = 'SUCCEEDED', lease_owner = NULL,
                    lease_expires_at = NULL, finished_at = now() - interval '1 day' WHERE id = 1",
        ),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "as the daemon role",
        client.batch_execute(&format!("SET ROLE {role}")),
    )
    .await
    .unwrap();
    assert_eq!(
        texts(
            &client,
            "SELECT deleted::text FROM pgtaskd.prune(1000, 100, NULL)"
        )
        .await,
        ["1"]
    );
    assert_eq!(
        texts(&client, "SELECT count(*)::text FROM pgtaskd.task_view").await,
        ["0"]
    );
}

/// A data-only restore loads the state rows first (`task_state` sorts before `tasks`), then
/// the task rows: their insert trigger keeps the state loaded (here SUCCEEDED) rather than
/// failing on it or writing it QUEUED again.
#[tokio::test]
async fn task_rows_loaded_after_their_state_keep_it() {
    let db = TestDb::new().await;
    let client = db.client().await;
    within(
        WAIT,
        "a restore's two loads",
        client.batch_execute(
            "INSERT INTO pgtaskd.task_state (id, queue, priority, run_at, status, attempt, words,
                                             finished_at)
             VALUES (7, 'q', 0, now(), 'SUCCEEDED', 1, 2, now());
             INSERT INTO pgtaskd.tasks (id, queue, payload) OVERRIDING SYSTEM VALUE
             VALUES (7, 'q', 'two words');",
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        texts(
            &client,
            "SELECT status || ' ' || words || ' ' || payload FROM pgtaskd.task_view"
        )
        .await,
        ["SUCCEEDED 2 two words"]
    );
}

/// A row-level security policy on `pgtaskd.tasks` holds through the view: a tenant reads the
/// state of its own tasks only (the view joins the task row, whose policy hides the others).
#[tokio::test]
async fn a_row_level_security_policy_on_the_tasks_holds_for_their_state() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let tenant = format!("ts_tenant_{:08x}", fastrand::u32(..));
    within(
        WAIT,
        "two queues and a tenant that may see one",
        client.batch_execute(&format!(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('mine', 'a'), ('theirs', 'b');
             UPDATE pgtaskd.task_state SET status = 'FAILED', error = 'their secret',
                    finished_at = now() WHERE queue = 'theirs';
             CREATE ROLE {tenant}; SELECT pgtaskd.grant_producer('{tenant}');
             ALTER TABLE pgtaskd.tasks ENABLE ROW LEVEL SECURITY;
             CREATE POLICY mine ON pgtaskd.tasks FOR SELECT TO {tenant} USING (queue = 'mine');
             SET ROLE {tenant};"
        )),
    )
    .await
    .unwrap();
    assert_eq!(
        texts(
            &client,
            "SELECT queue || ' ' || status || ' ' || coalesce(error, '-') FROM pgtaskd.task_view"
        )
        .await,
        ["mine QUEUED -"]
    );
}

/// The counts a task has not earned are not stored (schema 40): a QUEUED or RUNNING state
/// row, and an end that did not succeed, hold NULL `words`, `bytes`, `runes`, and NULL `runs`
/// and `snoozes` until the first claim and the first snooze, so the versions a held snapshot
/// keeps stay narrow. The view answers 0 for each, a snooze counts up from none, and a
/// success keeps its counts.
#[tokio::test]
async fn counts_not_earned_are_not_stored_and_the_view_answers_zero() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let stored = "SELECT concat_ws(',', coalesce(words::text, '-'), coalesce(bytes::text, '-'),
                         coalesce(runes::text, '-'), coalesce(runs::text, '-'),
                         coalesce(snoozes::text, '-'))
                    FROM pgtaskd.task_state ORDER BY id";
    let shown = "SELECT concat_ws(',', status, words, bytes, runes, runs, snoozes, attempt)
                   FROM pgtaskd.task_view ORDER BY id";
    within(
        WAIT,
        "three tasks",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT 'q', 'p' || n FROM generate_series(1, 3) AS n",
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        texts(&client, stored).await,
        ["-,-,-,-,-"; 3],
        "QUEUED rows"
    );
    assert_eq!(texts(&client, shown).await, ["QUEUED,0,0,0,0,0,0"; 3]);

    let tokens = texts(
        &client,
        "SELECT task_claim::text FROM pgtaskd.claim(ARRAY['q'], 3, 'me', 60000, 1048576, false,
                1048576, NULL, NULL) WHERE task_id IS NOT NULL ORDER BY task_id",
    )
    .await;
    assert_eq!(tokens.len(), 3, "three claimed: {tokens:?}");
    assert_eq!(
        texts(&client, stored).await,
        ["-,-,-,1,-"; 3],
        "RUNNING rows"
    );

    // The first succeeds with its counts, the second fails (no retry), the third snoozes;
    // the counts the failure reports are not stored (schema 39 wrote zeros).
    let finished = texts(
        &client,
        &format!(
            "SELECT task_id || ':' || written FROM pgtaskd.finish(
                 ARRAY[{}]::bigint[], ARRAY[1, 2, 3]::bigint[],
                 ARRAY['SUCCEEDED', 'FAILED', 'SNOOZED'], ARRAY[3, 7, 0]::bigint[],
                 ARRAY[4, 8, 0]::bigint[], ARRAY[5, 9, 0]::bigint[],
                 ARRAY[NULL, 'broke', NULL], ARRAY['{{}}', NULL, NULL],
                 ARRAY[NULL, NULL, 0]::float8[], true) ORDER BY task_id",
            tokens.join(", ")
        ),
    )
    .await;
    assert_eq!(finished, ["1:SUCCEEDED", "2:FAILED", "3:QUEUED"]);
    assert_eq!(
        texts(&client, stored).await,
        ["3,4,5,1,-", "-,-,-,1,-", "-,-,-,1,1"]
    );
    assert_eq!(
        texts(&client, shown).await,
        [
            "SUCCEEDED,3,4,5,1,0,1",
            "FAILED,0,0,0,1,0,1",
            "QUEUED,0,0,0,1,1,0"
        ],
        "through the view, the counts as before schema 40"
    );
}
