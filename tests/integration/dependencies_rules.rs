//! Tasks that wait for other tasks: what the policies, cascades, retries, the database's
//! rules, retention and graphs do (docs/dependencies.md). The release's exactness under
//! concurrency is `dependencies.rs`, whose helpers these use.

use std::collections::HashMap;

use crate::dependencies::{claim, finish, insert, install_release_audit, problems, status};
use crate::support::{statistics_say_empty, within, TestDb, WAIT};

/// The policies by the parent's end: what the child is once its parent ended, and once the
/// parent was then retried and succeeded (the last column of the table in
/// docs/dependencies.md).
#[tokio::test]
async fn each_policy_does_what_its_table_says_for_each_end_of_the_parent() {
    let db = TestDb::new().await;
    let client = db.client().await;
    install_release_audit(&client).await;
    // (policy, parent's end, child after the end, child after a retry that succeeds)
    let table: &[(&str, &str, &str, &str)] = &[
        ("cancel", "SUCCEEDED", "QUEUED", "QUEUED"),
        ("cancel", "FAILED", "CANCELED", "CANCELED"),
        ("cancel", "CANCELED", "CANCELED", "CANCELED"),
        ("run", "SUCCEEDED", "QUEUED", "QUEUED"),
        ("run", "FAILED", "QUEUED", "QUEUED"),
        ("run", "CANCELED", "QUEUED", "QUEUED"),
        ("wait", "SUCCEEDED", "QUEUED", "QUEUED"),
        ("wait", "FAILED", "WAITING", "QUEUED"),
        ("wait", "CANCELED", "WAITING", "QUEUED"),
    ];
    for &(policy, end, after_end, after_retry) in table {
        client
            .batch_execute("TRUNCATE pgtaskd.tasks; TRUNCATE public.releases")
            .await
            .unwrap();
        let parent = insert(&client, "parent", &[], None).await;
        let child = insert(&client, "child", &[parent], Some(policy)).await;
        let case = format!("{policy} / {end}");
        if end == "CANCELED" {
            let row = client
                .query_one("SELECT pgtaskd.cancel($1)", &[&parent])
                .await
                .unwrap();
            assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("CANCELED"));
        } else {
            let claimed = claim(&client, 1).await;
            assert_eq!(
                claimed,
                vec![(parent, claimed[0].1)],
                "{case}: the parent alone"
            );
            assert_eq!(
                finish(&client, parent, claimed[0].1, end).await.as_deref(),
                Some(end),
                "{case}"
            );
        }
        assert_eq!(
            status(&client, child).await,
            after_end,
            "{case}: after the end"
        );
        if after_end == "CANCELED" {
            let error: String = client
                .query_one(
                    "SELECT error FROM pgtaskd.task_view WHERE id = $1",
                    &[&child],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(
                error,
                format!("parent task {parent} {}", end.to_lowercase()),
                "{case}: the error names the parent"
            );
        }
        assert!(problems(&client).await.is_empty(), "{case}");

        // The parent retried (a plain retry) and succeeding.
        if end != "SUCCEEDED" {
            let row = client
                .query_one("SELECT pgtaskd.retry($1)", &[&parent])
                .await
                .unwrap();
            assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some(end));
            // The child, if QUEUED (run), is claimed with its parent; leave it be.
            let claimed = claim(&client, 2).await;
            let token = claimed
                .iter()
                .find(|(id, _)| *id == parent)
                .map(|(_, token)| *token)
                .expect("the retried parent is claimed");
            finish(&client, parent, token, "SUCCEEDED").await;
            let want = if after_retry == "QUEUED" && policy == "run" {
                // Released at the parent's first end and claimed just now.
                "RUNNING"
            } else {
                after_retry
            };
            assert_eq!(
                status(&client, child).await,
                want,
                "{case}: after the retry"
            );
        }
        let releases: i64 = client
            .query_one(
                "SELECT count(*) FROM public.releases WHERE id = $1 AND new_status = 'QUEUED'",
                &[&child],
            )
            .await
            .unwrap()
            .get(0);
        let expected = i64::from(after_retry == "QUEUED");
        assert_eq!(releases, expected, "{case}: released at most once");
        assert!(problems(&client).await.is_empty(), "{case}");
    }
}

/// A failure five levels up cancels the whole chain below it in its own commit, each task
/// naming its parent; `retry_with_dependents` brings them all back to wait again.
#[tokio::test]
async fn a_failure_cancels_five_levels_of_dependents_in_its_commit_and_a_retry_brings_them_back() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let reader = db.client().await;
    let mut chain = vec![insert(&client, "root", &[], None).await];
    for level in 1..=5 {
        let parent = *chain.last().unwrap();
        chain.push(insert(&client, &format!("level {level}"), &[parent], None).await);
    }
    let claimed = claim(&client, 10).await;
    assert_eq!(claimed.len(), 1);
    client.batch_execute("BEGIN").await.unwrap();
    finish(&client, chain[0], claimed[0].1, "FAILED").await;
    for &id in &chain[1..] {
        assert_eq!(
            status(&reader, id).await,
            "WAITING",
            "not before the commit"
        );
    }
    client.batch_execute("COMMIT").await.unwrap();
    for pair in chain.windows(2) {
        let row = reader
            .query_one(
                "SELECT status, error FROM pgtaskd.task_view WHERE id = $1",
                &[&pair[1]],
            )
            .await
            .unwrap();
        let (status, error): (String, String) = (row.get(0), row.get(1));
        assert_eq!(status, "CANCELED");
        let cause = if pair[0] == chain[0] {
            "failed"
        } else {
            "canceled"
        };
        assert_eq!(error, format!("parent task {} {cause}", pair[0]));
    }
    assert!(problems(&client).await.is_empty());

    let back: Vec<i64> = client
        .query(
            "SELECT retried_id FROM pgtaskd.retry_with_dependents($1)",
            &[&chain[0]],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(back, chain, "the root and every dependent, in order");
    assert_eq!(status(&client, chain[0]).await, "QUEUED");
    for &id in &chain[1..] {
        assert_eq!(status(&client, id).await, "WAITING");
    }
    assert!(problems(&client).await.is_empty());
}

#[tokio::test]
async fn parents_are_checked_by_the_database_and_never_change() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let parent = insert(&client, "parent", &[], None).await;
    let gone = insert(&client, "gone", &[], None).await;
    client
        .execute("DELETE FROM pgtaskd.tasks WHERE id = $1", &[&gone])
        .await
        .unwrap();

    let unknown = client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) VALUES ('x', ARRAY[$1::bigint])",
            &[&gone],
        )
        .await
        .unwrap_err();
    let unknown = unknown.as_db_error().expect("a database error");
    assert_eq!(unknown.code().code(), "23503");
    assert_eq!(
        unknown.message(),
        format!("task depends on task {gone}, which does not exist")
    );
    // A parent id larger than any task's: it does not exist either, and is named.
    let later = client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) VALUES ('x', ARRAY[$1::bigint + 100])",
            &[&parent],
        )
        .await
        .unwrap_err();
    let later = later.as_db_error().unwrap();
    assert_eq!(later.code().code(), "23503");
    assert_eq!(
        later.message(),
        format!(
            "task depends on task {}, which does not exist",
            parent + 100
        )
    );
    // A parent that exists but is not older (an id chosen by the owner): no cycle can be
    // written.
    let newer = client
        .execute(
            "INSERT INTO pgtaskd.tasks (id, payload, depends_on) OVERRIDING SYSTEM VALUE \
             VALUES ($1::bigint - 1, 'x', ARRAY[$1::bigint])",
            &[&parent],
        )
        .await
        .unwrap_err();
    let newer = newer.as_db_error().unwrap();
    assert_eq!(newer.code().code(), "23514");
    assert_eq!(newer.constraint(), Some("tasks_depends_on_earlier"));
    let child = insert(&client, "child", &[parent], None).await;
    let changed = client
        .execute(
            "UPDATE pgtaskd.tasks SET depends_on = NULL WHERE id = $1",
            &[&child],
        )
        .await
        .unwrap_err();
    assert!(
        changed
            .as_db_error()
            .unwrap()
            .message()
            .contains("parents of a task do not change"),
        "{changed:?}"
    );
    let deleted = client
        .execute("DELETE FROM pgtaskd.tasks WHERE id = $1", &[&parent])
        .await
        .unwrap_err();
    assert_eq!(
        deleted.as_db_error().unwrap().message(),
        format!("task {parent} cannot be deleted: task {child} waits for it")
    );
    assert_eq!(status(&client, child).await, "WAITING");
}

/// Retention passes over a finished parent that a task still waits for (under 'wait').
#[tokio::test]
async fn retention_keeps_a_parent_that_a_task_still_waits_for() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let parent = insert(&client, "parent", &[], None).await;
    let child = insert(&client, "child", &[parent], Some("wait")).await;
    let other = insert(&client, "other", &[], None).await;
    for (id, token) in claim(&client, 10).await {
        finish(&client, id, token, "FAILED").await;
    }
    assert_eq!(status(&client, child).await, "WAITING");
    let deleted: i64 = client
        .query_one("SELECT deleted FROM pgtaskd.prune(0, 100, NULL)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(deleted, 1, "the other finished task only");
    let left: Vec<i64> = client
        .query("SELECT id FROM pgtaskd.tasks ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(left, vec![parent, child]);
    assert!(!left.contains(&other));
}

/// The largest graph there is, one cycle through every task: refused within the tests' wait
/// (the search of every edge for each step took most of an hour), named by its first and
/// last ten steps.
#[tokio::test]
async fn a_cycle_of_a_hundred_thousand_tasks_is_refused_naming_its_ends() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let cycle = within(
        WAIT,
        "the cycle's refusal",
        client.query(
            "SELECT * FROM pgtaskd.enqueue_graph((
                SELECT jsonb_agg(jsonb_build_object(
                           'ref', 't' || g, 'payload', 'x',
                           'after', jsonb_build_array('t' || CASE WHEN g = 1 THEN 100000 ELSE g - 1 END))
                           ORDER BY g)
                  FROM generate_series(1, 100000) AS g))",
            &[],
        ),
    )
    .await
    .unwrap_err();
    let first: Vec<String> = (0..10).map(|k| format!("t{}", 100_000 - k)).collect();
    let last: Vec<String> = (2..=10).rev().map(|k| format!("t{k}")).collect();
    assert_eq!(
        cycle.as_db_error().unwrap().message(),
        format!(
            "cycle: t1 -> {} -> (99981 more) -> {} -> t1",
            first[..9].join(" -> "),
            last.join(" -> ")
        )
    );
    let count: i64 = client
        .query_one("SELECT count(*) FROM pgtaskd.tasks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "nothing inserted");
}

/// Refs named twice are named ten at most, with how many more: the error stays a line.
#[tokio::test]
async fn a_graph_naming_thirty_thousand_refs_twice_names_the_first_ten() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let twice = within(
        WAIT,
        "the refusal",
        client.query(
            "SELECT * FROM pgtaskd.enqueue_graph((
                SELECT jsonb_agg(jsonb_build_object('ref', 'r' || (g % 30000), 'payload', 'x'))
                  FROM generate_series(1, 60000) AS g))",
            &[],
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(
        twice.as_db_error().unwrap().message(),
        "enqueue_graph: more than one task has ref r0, r1, r10, r100, r1000, r10000, r10001, \
         r10002, r10003, r10004 and 29990 more"
    );
}

#[tokio::test]
async fn a_graph_is_inserted_parents_first_and_a_cycle_inserts_nothing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let cycle = client
        .query(
            "SELECT * FROM pgtaskd.enqueue_graph($1::text::jsonb)",
            &[&r#"[{"ref": "a", "payload": "1", "after": ["c"]},
                  {"ref": "b", "payload": "2", "after": ["a"]},
                  {"ref": "c", "payload": "3", "after": ["b"]},
                  {"ref": "d", "payload": "4"}]"#],
        )
        .await
        .unwrap_err();
    assert_eq!(
        cycle.as_db_error().unwrap().message(),
        "cycle: a -> c -> b -> a"
    );
    let count: i64 = client
        .query_one("SELECT count(*) FROM pgtaskd.tasks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "nothing inserted");

    let existing = insert(&client, "existing", &[], None).await;
    let graph = format!(
        r#"[{{"ref": "report", "payload": "r", "after": ["left", "right"]}},
            {{"ref": "left", "payload": "l", "after": ["root"]}},
            {{"ref": "right", "payload": "r", "after": ["root", {existing}], "on_dep_failure": "run"}},
            {{"ref": "root", "payload": "x", "queue": "graphs"}}]"#
    );
    let ids: HashMap<String, i64> = client
        .query(
            "SELECT ref, task_id FROM pgtaskd.enqueue_graph($1::text::jsonb)",
            &[&graph],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(ids.len(), 4);
    assert!(ids["root"] < ids["left"] && ids["left"] < ids["report"]);
    assert!(ids["right"] < ids["report"]);
    let row = client
        .query_one(
            "SELECT depends_on, on_dep_failure, status FROM pgtaskd.task_view WHERE id = $1",
            &[&ids["right"]],
        )
        .await
        .unwrap();
    let (parents, policy, state): (Vec<i64>, Option<String>, String) =
        (row.get(0), row.get(1), row.get(2));
    assert_eq!(parents, vec![ids["root"], existing]);
    assert_eq!(policy.as_deref(), Some("run"));
    assert_eq!(state, "WAITING");
    assert_eq!(status(&client, ids["root"]).await, "QUEUED");
    assert!(problems(&client).await.is_empty());
}

#[tokio::test]
async fn a_task_waiting_for_a_ref_no_task_has_is_named_first_and_cut_to_a_hundred_characters() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // The second task waits for a megabyte-long ref no task has, after a ref that exists; the
    // third for another missing ref. The refusal names the second task, each ref cut.
    let missing = within(
        WAIT,
        "the refusal",
        client.query(
            "SELECT * FROM pgtaskd.enqueue_graph(jsonb_build_array(
                jsonb_build_object('ref', 'a', 'payload', 'x'),
                jsonb_build_object('ref', repeat('b', 1000000), 'payload', 'x',
                                   'after', jsonb_build_array('a', repeat('m', 1000000))),
                jsonb_build_object('ref', 'c', 'payload', 'x', 'after', jsonb_build_array('z'))))",
            &[],
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(
        missing.as_db_error().unwrap().message(),
        format!(
            "enqueue_graph: task {} waits for ref {}, which the graph does not name",
            "b".repeat(100),
            "m".repeat(100)
        )
    );
    let count: i64 = client
        .query_one("SELECT count(*) FROM pgtaskd.tasks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "a refused graph inserts nothing");
}

/// Statistics taken while the tables were empty must not make a parent's end walk the tables
/// for each of its dependents: every row `settle_waiting` reads is read by its key (schema
/// 45). Before, a parent with 2,000 children ended fetching 16 million task rows in the
/// transaction of the finish that ended it, and the producer's insert of those children
/// scanned the state table for each of them.
#[tokio::test]
async fn a_parent_ending_under_statistics_of_empty_tables_reads_its_childrens_rows_by_key() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    statistics_say_empty(&client).await;
    for statement in [
        "INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT 'filler', 'f' FROM generate_series(1, 3000)",
        "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('parent', 'p')",
    ] {
        within(WAIT, statement, client.batch_execute(statement))
            .await
            .unwrap();
    }
    // The producer's insert of the children, its commit's checks run at once: each parent
    // and child row looked up by its key, not the state table scanned for each child.
    let tx = client.transaction().await.unwrap();
    within(
        WAIT,
        "the children's insert",
        tx.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload, depends_on)
                 SELECT 'child', 'c', ARRAY[(SELECT id FROM pgtaskd.tasks WHERE queue = 'parent')]
                   FROM generate_series(1, 2000);
             SET CONSTRAINTS ALL IMMEDIATE",
        ),
    )
    .await
    .unwrap();
    let read: i64 = tx
        .query_one(
            "SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_xact_user_tables
              WHERE relid = 'pgtaskd.task_state'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        read <= 20 * 2000,
        "the insert of 2,000 children read {read} state rows"
    );
    tx.commit().await.unwrap();
    let claimed = within(
        WAIT,
        "the parent's claim",
        client.query_one(
            "SELECT task_id, task_claim FROM pgtaskd.claim(ARRAY['parent'], 1, 'parentkey0', \
             30000, 1000000000, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL",
            &[],
        ),
    )
    .await
    .unwrap();
    let (id, token): (i64, i64) = (claimed.get(0), claimed.get(1));
    let tx = client.transaction().await.unwrap();
    within(
        WAIT,
        "the parent's finish",
        tx.query(
            "SELECT * FROM pgtaskd.finish(ARRAY[$1::bigint], ARRAY[$2::bigint], \
             ARRAY['SUCCEEDED'], ARRAY[1::bigint], ARRAY[1::bigint], ARRAY[1::bigint], \
             ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::float8], false)",
            &[&token, &id],
        ),
    )
    .await
    .unwrap();
    let fetched = tx
        .query(
            "SELECT relname::text, idx_tup_fetch FROM pg_stat_xact_user_tables
              WHERE relid IN ('pgtaskd.tasks'::regclass, 'pgtaskd.task_state'::regclass)",
            &[],
        )
        .await
        .unwrap();
    for row in &fetched {
        let (table, rows): (String, i64) = (row.get(0), row.get(1));
        assert!(
            rows <= 20 * 2000,
            "the parent's end fetched {rows} rows of {table} for 2,000 children"
        );
    }
    tx.commit().await.unwrap();
    let queued: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'child' AND status = 'QUEUED'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(queued, 2000, "every child released in the parent's commit");
    assert!(problems(&client).await.is_empty());
}
