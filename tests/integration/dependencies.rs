//! Tasks that wait for other tasks (docs/dependencies.md): a task with parents is WAITING,
//! and becomes QUEUED, or is canceled, in the transaction that commits the end of its last
//! parent, whoever ends it; no periodic pass releases anything.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tokio_postgres::Client;

use crate::support::{within, TestDb, WAIT};

/// Records every change of a task out of WAITING, and whether it was released while one of
/// its parents had not SUCCEEDED (seen by the releasing transaction itself).
pub(crate) const RELEASE_AUDIT: &str = "
CREATE TABLE public.releases (
    seq        bigserial PRIMARY KEY,
    id         bigint NOT NULL,
    new_status text NOT NULL,
    early      boolean NOT NULL
);
CREATE FUNCTION public.audit_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'WAITING' AND NEW.status <> 'WAITING' THEN
        INSERT INTO public.releases (id, new_status, early)
        VALUES (NEW.id, NEW.status,
                NEW.status = 'QUEUED' AND EXISTS (
                    SELECT 1 FROM pgtaskd.tasks AS t
                     CROSS JOIN LATERAL unnest(t.depends_on) AS x(parent)
                      JOIN pgtaskd.task_state AS p ON p.id = x.parent
                     WHERE t.id = NEW.id AND p.status <> 'SUCCEEDED'));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit_release AFTER UPDATE ON pgtaskd.task_state
    FOR EACH ROW EXECUTE FUNCTION public.audit_release();
";

pub(crate) async fn install_release_audit(client: &Client) {
    client.batch_execute(RELEASE_AUDIT).await.unwrap();
}

/// Claim every due task of the default queue (up to `max`): (id, claim token) pairs.
pub(crate) async fn claim(client: &Client, max: i64) -> Vec<(i64, i64)> {
    client
        .query(
            "SELECT task_id, task_claim FROM pgtaskd.claim(ARRAY['default'], $1, 'test', 600000, \
             1000000000, true, 1000000000, NULL, NULL) WHERE task_id IS NOT NULL",
            &[&max],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Finish claim `token` of task `id` with `status` (an error for FAILED); the status written.
pub(crate) async fn finish(client: &Client, id: i64, token: i64, status: &str) -> Option<String> {
    let error = (status == "FAILED").then_some("it broke");
    client
        .query_one(
            "SELECT written FROM pgtaskd.finish(ARRAY[$1::bigint], ARRAY[$2::bigint], \
             ARRAY[$3::text], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint], \
             ARRAY[$4::text], ARRAY[NULL::text], ARRAY[NULL::float8], true)",
            &[&token, &id, &status, &error],
        )
        .await
        .unwrap()
        .get(0)
}

pub(crate) async fn status(client: &Client, id: i64) -> String {
    client
        .query_one("SELECT status FROM pgtaskd.task_view WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

pub(crate) async fn insert(
    client: &Client,
    payload: &str,
    parents: &[i64],
    policy: Option<&str>,
) -> i64 {
    let parents: Option<Vec<i64>> = (!parents.is_empty()).then(|| parents.to_vec());
    client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, depends_on, on_dep_failure) \
             VALUES ($1, $2, $3) RETURNING id",
            &[&payload, &parents, &policy],
        )
        .await
        .unwrap()
        .get(0)
}

pub(crate) async fn problems(client: &Client) -> Vec<String> {
    client
        .query(
            "SELECT task_id || ': ' || problem FROM pgtaskd.check_deps()",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}
#[tokio::test]
async fn a_child_is_queued_in_the_commit_of_its_last_parents_end() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let reader = db.client().await;
    let a = insert(&client, "a", &[], None).await;
    let b = insert(&client, "b", &[], None).await;
    let c = insert(&client, "c", &[a, b], None).await;
    assert_eq!(status(&reader, c).await, "WAITING");
    let claimed: HashMap<i64, i64> = claim(&client, 10).await.into_iter().collect();
    assert_eq!(
        claimed.len(),
        2,
        "only the parents are claimed: {claimed:?}"
    );
    assert_eq!(
        finish(&client, a, claimed[&a], "SUCCEEDED")
            .await
            .as_deref(),
        Some("SUCCEEDED")
    );
    assert_eq!(status(&reader, c).await, "WAITING", "one parent is left");

    // The last parent's finish, in a transaction still open: the child is released inside
    // it, seen by no one else until it commits, and by everyone once it has.
    client.batch_execute("BEGIN").await.unwrap();
    finish(&client, b, claimed[&b], "SUCCEEDED").await;
    assert_eq!(status(&client, c).await, "QUEUED");
    assert_eq!(status(&reader, c).await, "WAITING");
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(status(&reader, c).await, "QUEUED");

    let parents: (Option<String>, i32) = {
        let row = client
            .query_one(
                "SELECT task_parents, task_parent_count FROM pgtaskd.claim(ARRAY['default'], 10, \
                 'test', 60000, 1000000000, true, 1000000000, NULL, NULL) WHERE task_id = $1",
                &[&c],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        parents,
        (Some(format!("{a}=SUCCEEDED,{b}=SUCCEEDED")), 2),
        "the claim tells the handler its parents and their outcomes"
    );
    assert!(problems(&client).await.is_empty());
}

/// Trials in which the last two parents of each child end at once in two sessions: each
/// child is released exactly once, never before both parents ended, and nothing deadlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_two_parents_ending_at_once_release_their_child_exactly_once() {
    // 3,000 in the suite; PGTASKD_DEP_TRIALS=10000 for the count.
    let trials: i64 = std::env::var("PGTASKD_DEP_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3_000);
    let db = TestDb::new().await;
    let client = db.client().await;
    install_release_audit(&client).await;
    // Pairs of parents (ids 2k-1 and 2k), then one child per pair.
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'parent ' || i FROM generate_series(1, $1::bigint * 2) AS i",
            &[&trials],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) \
             SELECT 'child ' || k, ARRAY[2 * k - 1, 2 * k] FROM generate_series(1, $1::bigint) AS k",
            &[&trials],
        )
        .await
        .unwrap();
    let claimed: HashMap<i64, i64> = claim(&client, trials * 2).await.into_iter().collect();
    assert_eq!(
        claimed.len() as i64,
        trials * 2,
        "the parents, and no child"
    );

    let barrier = Arc::new(Barrier::new(2));
    let mut sessions = Vec::new();
    for side in 0..2i64 {
        let session = db.client().await;
        let claimed = claimed.clone();
        let barrier = barrier.clone();
        sessions.push(tokio::spawn(async move {
            for k in 1..=trials {
                let id = 2 * k - 1 + side;
                barrier.wait().await;
                let written = finish(&session, id, claimed[&id], "SUCCEEDED").await;
                assert_eq!(written.as_deref(), Some("SUCCEEDED"), "parent {id}");
            }
        }));
    }
    for session in sessions {
        within(WAIT * 5, "the trials", session).await.unwrap();
    }

    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.status = 'QUEUED'), \
                    (SELECT count(*) FROM public.releases), \
                    (SELECT count(*) FROM (SELECT id FROM public.releases GROUP BY id HAVING count(*) > 1) AS twice), \
                    (SELECT count(*) FROM public.releases WHERE early) \
               FROM pgtaskd.task_state AS s WHERE s.id > $1::bigint * 2",
            &[&trials],
        )
        .await
        .unwrap();
    let (queued, releases, twice, early): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(queued, trials, "every child is QUEUED");
    assert_eq!(releases, trials, "each child released once");
    assert_eq!(twice, 0);
    assert_eq!(early, 0, "no child released before both its parents ended");
    assert!(problems(&client).await.is_empty());
}

/// A second finish of the same child's other parent waits for the first's commit, then
/// releases the child itself: the interleaving the trials above hit only sometimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_end_waits_for_the_other_parents_commit_and_then_releases_the_child() {
    let db = TestDb::new().await;
    let first = db.client().await;
    let second = db.client().await;
    let a = insert(&first, "a", &[], None).await;
    let b = insert(&first, "b", &[], None).await;
    let c = insert(&first, "c", &[a, b], None).await;
    let claimed: HashMap<i64, i64> = claim(&first, 10).await.into_iter().collect();

    first.batch_execute("BEGIN").await.unwrap();
    finish(&first, a, claimed[&a], "SUCCEEDED").await;
    let token_b = claimed[&b];
    let waiting = tokio::spawn(async move {
        finish(&second, b, token_b, "SUCCEEDED").await;
        second
    });
    // The second finish waits for the child's row, which the first holds.
    let observer = db.client().await;
    crate::support::eventually(WAIT, "the second finish to wait for a lock", || {
        let observer = &observer;
        async move {
            let row = observer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND datname = current_database()",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0) > 0).then_some(())
        }
    })
    .await;
    assert_eq!(status(&observer, c).await, "WAITING");
    first.batch_execute("COMMIT").await.unwrap();
    let second = within(WAIT, "the second finish", waiting).await.unwrap();
    assert_eq!(status(&second, c).await, "QUEUED");
    assert!(problems(&second).await.is_empty());
}

/// Children inserted by producers while their parents end in another session: none is left
/// WAITING once its parents ended, none is released before them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_inserted_while_their_parents_end_are_never_stranded_nor_early() {
    // 1,200 children in the suite; PGTASKD_DEP_PARENTS=5000 for the 10,000.
    let parents: i64 = std::env::var("PGTASKD_DEP_PARENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(600);
    let db = TestDb::new().await;
    let client = db.client().await;
    install_release_audit(&client).await;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'parent ' || i FROM generate_series(1, $1::bigint) AS i",
            &[&parents],
        )
        .await
        .unwrap();
    let claimed = claim(&client, parents).await;
    assert_eq!(claimed.len() as i64, parents);

    let finisher = db.client().await;
    let ends = tokio::spawn(async move {
        for (id, token) in claimed {
            finish(&finisher, id, token, "SUCCEEDED").await;
        }
    });
    // Two producers, each inserting children of two parents around the one being finished.
    let mut producers = Vec::new();
    for side in 0..2i64 {
        let producer = db.client().await;
        producers.push(tokio::spawn(async move {
            let mut children = 0;
            for i in 0..parents {
                let a = 1 + (i + side) % parents;
                let b = 1 + (i * 7 + side) % parents;
                producer
                    .execute(
                        "INSERT INTO pgtaskd.tasks (payload, depends_on) VALUES ('child', ARRAY[$1::bigint, $2::bigint])",
                        &[&a, &b],
                    )
                    .await
                    .unwrap();
                children += 1;
            }
            children
        }));
    }
    within(WAIT * 3, "the parents' ends", ends).await.unwrap();
    let mut children = 0;
    for producer in producers {
        children += within(WAIT * 3, "the producers", producer).await.unwrap();
    }
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'QUEUED'), count(*) FILTER (WHERE status = 'WAITING'), \
                    (SELECT count(*) FROM public.releases WHERE early) \
               FROM pgtaskd.task_view WHERE payload = 'child'",
            &[],
        )
        .await
        .unwrap();
    let (queued, waiting, early): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(waiting, 0, "no child stranded");
    assert_eq!(queued, children);
    assert_eq!(early, 0, "no child released before its parents");
    assert!(problems(&client).await.is_empty());
}

/// Two parents failing at once, whose cancels cascade through one graph from both sides
/// (A, B; X after B; Y after A and X; Z after B and Y): the cascades lock the tasks below in
/// one order, so neither deadlocks, and every task below ends CANCELED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cascades_through_one_graph_never_deadlock() {
    const TRIALS: usize = 150;
    let db = TestDb::new().await;
    let client = db.client().await;
    let sessions = [db.client().await, db.client().await];
    let sessions: Vec<Arc<Client>> = sessions.into_iter().map(Arc::new).collect();
    for trial in 0..TRIALS {
        let a = insert(&client, "a", &[], None).await;
        let b = insert(&client, "b", &[], None).await;
        let x = insert(&client, "x", &[b], None).await;
        let y = insert(&client, "y", &[a, x], None).await;
        let z = insert(&client, "z", &[b, y], None).await;
        let claimed: HashMap<i64, i64> = claim(&client, 2).await.into_iter().collect();
        assert_eq!(claimed.len(), 2, "trial {trial}: the two roots");
        let barrier = Arc::new(Barrier::new(2));
        let ends: Vec<_> = [(a, 0), (b, 1)]
            .into_iter()
            .map(|(id, side)| {
                let session = sessions[side].clone();
                let barrier = barrier.clone();
                let token = claimed[&id];
                tokio::spawn(async move {
                    barrier.wait().await;
                    // Without waiting for a row held elsewhere, as a batch finishes.
                    session
                        .query_one(
                            "SELECT written FROM pgtaskd.finish(ARRAY[$1::bigint], ARRAY[$2::bigint], \
                             ARRAY['FAILED'], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint], \
                             ARRAY['bad'], ARRAY[NULL::text], ARRAY[NULL::float8], false)",
                            &[&token, &id],
                        )
                        .await
                        .map(|row| row.get::<_, Option<String>>(0))
                })
            })
            .collect();
        for end in ends {
            let written = within(WAIT, "a root's failure", end)
                .await
                .unwrap()
                .unwrap_or_else(|err| panic!("trial {trial}: {err:?}"));
            assert_eq!(written.as_deref(), Some("FAILED"), "trial {trial}");
        }
        for id in [x, y, z] {
            assert_eq!(
                status(&client, id).await,
                "CANCELED",
                "trial {trial}: task {id}"
            );
        }
    }
    let deadlocks: i64 = client
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(deadlocks, 0);
    assert!(problems(&client).await.is_empty());
}

/// A task ends only in a READ COMMITTED transaction: one that held its snapshot from before a
/// sibling parent's end would decide the child from edges that are gone and leave it
/// WAITING for ever. A cancel in a REPEATABLE READ transaction is refused, nothing changes.
#[tokio::test]
async fn a_task_is_not_ended_from_a_snapshot_older_than_its_siblings_ends() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let operator = db.client().await;
    let a = insert(&client, "a", &[], None).await;
    // Claimed first: a stays QUEUED, untouched.
    let b: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, priority) VALUES ('b', 5) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let c = insert(&client, "c", &[a, b], Some("run")).await;
    // The operator's transaction takes its snapshot; then b ends.
    operator
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    let claimed = claim(&client, 1).await;
    assert_eq!(claimed[0].0, b);
    finish(&client, b, claimed[0].1, "SUCCEEDED").await;
    let refused = operator
        .query_one("SELECT pgtaskd.cancel($1)", &[&a])
        .await
        .unwrap_err();
    let refused = refused.as_db_error().unwrap();
    assert_eq!(refused.code().code(), "0A000", "{}", refused.message());
    assert!(
        refused.message().contains("READ COMMITTED"),
        "{}",
        refused.message()
    );
    operator.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(status(&client, a).await, "QUEUED", "nothing changed");
    // The same cancel in a transaction of its own decides c from what committed.
    let now: Option<String> = operator
        .query_one("SELECT pgtaskd.cancel($1)", &[&a])
        .await
        .unwrap()
        .get(0);
    assert_eq!(now.as_deref(), Some("CANCELED"));
    assert_eq!(
        status(&client, c).await,
        "QUEUED",
        "run: every parent ended"
    );
    assert!(problems(&client).await.is_empty());
}

/// Many tasks waiting elsewhere cost a parent's end and a child's insert nothing: each settle
/// reads the children it decides by their keys, never every WAITING task (before, 5,000
/// children inserted in one transaction took some 25 s at the commit, each reading all the
/// others, and each finish read every WAITING row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_waiting_elsewhere_cost_a_settle_nothing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let held: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('held', 'elsewhere') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    within(
        Duration::from_secs(30),
        "5,000 children inserted in one statement and committed",
        client.execute(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) \
             SELECT 'waits ' || n, ARRAY[$1::bigint] FROM generate_series(1, 5000) AS n",
            &[&held],
        ),
    )
    .await
    .unwrap();
    client.batch_execute("ANALYZE").await.unwrap();
    let a = insert(&client, "a", &[], None).await;
    let b = insert(&client, "b", &[a], None).await;
    let claimed = claim(&client, 1).await;
    assert_eq!(claimed[0].0, a);
    let touched = crate::support::blocks_touched(
        &client,
        &format!(
            "pgtaskd.finish(ARRAY[{}::bigint], ARRAY[{a}::bigint], ARRAY['SUCCEEDED'], \
             ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[NULL::text], \
             ARRAY[NULL::text], ARRAY[NULL::float8], true)",
            claimed[0].1
        ),
    )
    .await;
    assert_eq!(status(&client, b).await, "QUEUED");
    assert!(
        touched < 400,
        "a finish that released one child touched {touched} blocks beside 5,000 WAITING tasks"
    );
}
