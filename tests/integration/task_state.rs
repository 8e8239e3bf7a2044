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
