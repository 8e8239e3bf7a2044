//! Batches (docs/dependencies.md, "Batches"): a callback task runs once, after its batch is
//! sealed and the last member has ended, released in the transaction that commits that end
//! (or the seal); no row is written per member beyond the member itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tokio_postgres::Client;

use crate::dependencies::{claim, finish, problems, status};
use crate::support::{within, TestDb, WAIT};

/// Records every change of a batch's callback out of WAITING, whether some member of its
/// batch had not ended then (seen by the releasing transaction itself), and every write of a
/// batch row.
const BATCH_AUDIT: &str = "
CREATE TABLE public.callback_releases (
    seq        bigserial PRIMARY KEY,
    id         bigint NOT NULL,
    new_status text NOT NULL,
    early      boolean NOT NULL
);
CREATE FUNCTION public.audit_callback() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'WAITING' AND NEW.status <> 'WAITING' AND NEW.callback_of IS NOT NULL THEN
        INSERT INTO public.callback_releases (id, new_status, early)
        VALUES (NEW.id, NEW.status,
                EXISTS (SELECT 1 FROM pgtaskd.task_state AS m
                         WHERE m.batch_id = NEW.callback_of
                           AND m.status IN ('WAITING', 'QUEUED', 'RUNNING'))
                OR EXISTS (SELECT 1 FROM pgtaskd.batches AS b
                            WHERE b.id = NEW.callback_of AND b.sealed_at IS NULL));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit_callback AFTER UPDATE ON pgtaskd.task_state
    FOR EACH ROW EXECUTE FUNCTION public.audit_callback();
CREATE TABLE public.batch_writes (seq bigserial PRIMARY KEY, id bigint, op text);
CREATE FUNCTION public.audit_batch_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.batch_writes (id, op) VALUES (coalesce(NEW.id, OLD.id), TG_OP);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_batch_write AFTER INSERT OR UPDATE OR DELETE ON pgtaskd.batches
    FOR EACH ROW EXECUTE FUNCTION public.audit_batch_write();
";

async fn open(client: &Client, on: &str) -> (i64, i64) {
    let batch: i64 = client
        .query_one(
            "SELECT pgtaskd.open_batch('callbacks', $1, 'report')",
            &[&on],
        )
        .await
        .unwrap()
        .get(0);
    let callback: i64 = client
        .query_one(
            "SELECT callback FROM pgtaskd.batches WHERE id = $1",
            &[&batch],
        )
        .await
        .unwrap()
        .get(0);
    (batch, callback)
}

async fn members(client: &Client, batch: i64, n: i64) -> Vec<i64> {
    client
        .query(
            "INSERT INTO pgtaskd.tasks (payload, batch_id) \
             SELECT 'member ' || i, $1 FROM generate_series(1, $2::bigint) AS i RETURNING id",
            &[&batch, &n],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn seal(client: &Client, batch: i64) -> String {
    client
        .query_one("SELECT pgtaskd.seal_batch($1)", &[&batch])
        .await
        .unwrap()
        .get(0)
}

/// The callback's claim (queue `callbacks`): its batch and the counts it is told.
async fn claim_callback(client: &Client) -> Vec<(i64, Option<i64>, Option<String>)> {
    client
        .query(
            "SELECT task_id, task_batch, task_batch_counts FROM pgtaskd.claim(ARRAY['callbacks'], 10, \
             'test', 600000, 1000000000, true, 1000000000, NULL, NULL) WHERE task_id IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

#[tokio::test]
async fn the_callback_is_released_in_the_commit_of_the_last_members_end_after_the_seal() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let reader = db.client().await;
    client.batch_execute(BATCH_AUDIT).await.unwrap();
    let (batch, callback) = open(&client, "success").await;
    let ids = members(&client, batch, 3).await;
    assert_eq!(status(&reader, callback).await, "WAITING");
    let claimed: HashMap<i64, i64> = claim(&client, 10).await.into_iter().collect();
    assert_eq!(
        claimed.len(),
        3,
        "the members, never the callback: {claimed:?}"
    );
    assert!(
        claim_callback(&client).await.is_empty(),
        "a callback is never claimed while it waits"
    );
    finish(&client, ids[0], claimed[&ids[0]], "SUCCEEDED").await;
    finish(&client, ids[1], claimed[&ids[1]], "SUCCEEDED").await;
    assert_eq!(
        seal(&client, batch).await,
        "sealed",
        "a member is still running"
    );
    assert_eq!(status(&reader, callback).await, "WAITING");

    // The last member's finish, in a transaction still open: the callback is released inside
    // it, seen by no one else until it commits.
    client.batch_execute("BEGIN").await.unwrap();
    finish(&client, ids[2], claimed[&ids[2]], "SUCCEEDED").await;
    assert_eq!(status(&client, callback).await, "QUEUED");
    assert_eq!(status(&reader, callback).await, "WAITING");
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(status(&reader, callback).await, "QUEUED");

    let row = reader
        .query_one(
            "SELECT ended_at IS NOT NULL, succeeded, failed, canceled FROM pgtaskd.batches WHERE id = $1",
            &[&batch],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    assert_eq!((row.get(1), row.get(2), row.get(3)), (3i64, 0i64, 0i64));
    assert_eq!(
        claim_callback(&client).await,
        vec![(
            callback,
            Some(batch),
            Some("succeeded=3,failed=0,canceled=0".to_owned())
        )],
        "the callback is told its batch and the counts"
    );
    let writes: i64 = reader
        .query_one(
            "SELECT count(*) FROM public.batch_writes WHERE op = 'UPDATE'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        writes, 2,
        "the batch row is written by the seal and the end only"
    );
    assert!(problems(&reader).await.is_empty());
}

#[tokio::test]
async fn a_callback_is_never_due_before_the_seal() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (batch, callback) = open(&client, "finish").await;
    let ids = members(&client, batch, 2).await;
    for (id, token) in claim(&client, 10).await {
        finish(&client, id, token, "SUCCEEDED").await;
    }
    for id in &ids {
        assert_eq!(status(&client, *id).await, "SUCCEEDED");
    }
    assert_eq!(
        status(&client, callback).await,
        "WAITING",
        "every member has ended, but the batch is open"
    );
    assert!(
        problems(&client).await.is_empty(),
        "an open batch's callback waits rightly"
    );
    assert_eq!(
        seal(&client, batch).await,
        "ended",
        "the seal ends a batch whose members have ended"
    );
    assert_eq!(status(&client, callback).await, "QUEUED");
    assert_eq!(
        seal(&client, batch).await,
        "ended",
        "a second seal changes nothing"
    );
    assert_eq!(claim_callback(&client).await.len(), 1);

    // An empty batch ends at its seal: every member (none) succeeded.
    let (empty, empty_callback) = open(&client, "success").await;
    assert_eq!(seal(&client, empty).await, "ended");
    assert_eq!(status(&client, empty_callback).await, "QUEUED");
}

#[tokio::test]
async fn each_policy_does_what_its_table_says_for_the_members_outcomes() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // (on, outcomes of the two members, the callback's status after the end)
    let cases = [
        ("success", ["SUCCEEDED", "SUCCEEDED"], "QUEUED"),
        ("success", ["SUCCEEDED", "FAILED"], "CANCELED"),
        ("success", ["SUCCEEDED", "CANCELED"], "CANCELED"),
        ("finish", ["SUCCEEDED", "SUCCEEDED"], "QUEUED"),
        ("finish", ["FAILED", "FAILED"], "QUEUED"),
        ("finish", ["CANCELED", "SUCCEEDED"], "QUEUED"),
    ];
    for (on, outcomes, expected) in cases {
        let (batch, callback) = open(&client, on).await;
        let ids = members(&client, batch, 2).await;
        assert_eq!(seal(&client, batch).await, "sealed");
        // Canceled while QUEUED (an end as any other), then the rest claimed and finished.
        for (id, outcome) in ids.iter().zip(outcomes) {
            if outcome == "CANCELED" {
                client
                    .query_one("SELECT pgtaskd.cancel($1)", &[id])
                    .await
                    .unwrap();
            }
        }
        let claimed: HashMap<i64, i64> = claim(&client, 10).await.into_iter().collect();
        for (id, outcome) in ids.iter().zip(outcomes) {
            if outcome != "CANCELED" {
                let written = finish(&client, *id, claimed[id], outcome).await;
                assert_eq!(written.as_deref(), Some(outcome), "member {id}");
            }
        }
        assert_eq!(
            status(&client, callback).await,
            expected,
            "on {on}, members {outcomes:?}"
        );
        let row = client
            .query_one(
                "SELECT error FROM pgtaskd.task_view WHERE id = $1",
                &[&callback],
            )
            .await
            .unwrap();
        let error: Option<String> = row.get(0);
        if expected == "CANCELED" {
            let error = error.expect("a canceled callback says why");
            assert!(error.starts_with(&format!("batch {batch}: ")), "{error}");
        } else {
            assert_eq!(error, None);
            // Claimed and done, so the next case's claims see only its own tasks.
            for (id, _, _) in claim_callback(&client).await {
                assert_eq!(id, callback);
            }
        }
    }
    assert!(problems(&client).await.is_empty());
}

#[tokio::test]
async fn members_join_only_a_batch_that_exists_and_is_open() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (batch, callback) = open(&client, "finish").await;
    let ids = members(&client, batch, 1).await;

    let unknown = client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, batch_id) VALUES ('x', $1)",
            &[&(batch + 1000)],
        )
        .await
        .unwrap_err();
    let unknown = unknown.as_db_error().expect("a database error");
    assert_eq!(unknown.code().code(), "23503");
    assert_eq!(
        unknown.message(),
        format!("batch {} does not exist", batch + 1000)
    );

    let bad_on = client
        .query_one("SELECT pgtaskd.open_batch('q', 'always', 'p')", &[])
        .await
        .unwrap_err();
    assert_eq!(bad_on.as_db_error().unwrap().code().code(), "22023");

    // A member of a batch that has not ended cannot be deleted, nor moved to another batch.
    let deleted = client
        .execute("DELETE FROM pgtaskd.tasks WHERE id = $1", &[&ids[0]])
        .await
        .unwrap_err();
    assert!(
        deleted
            .as_db_error()
            .unwrap()
            .message()
            .contains("member of batch"),
        "{deleted:?}"
    );
    let moved = client
        .execute(
            "UPDATE pgtaskd.tasks SET batch_id = NULL WHERE id = $1",
            &[&ids[0]],
        )
        .await
        .unwrap_err();
    assert_eq!(moved.as_db_error().unwrap().code().code(), "42501");

    assert_eq!(seal(&client, batch).await, "sealed");
    let late = client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, batch_id) VALUES ('late', $1)",
            &[&batch],
        )
        .await
        .unwrap_err();
    let late = late.as_db_error().unwrap();
    assert_eq!(late.code().code(), "55000");
    assert_eq!(
        late.message(),
        format!("batch {batch} is sealed: no task can join it")
    );

    let unknown_seal = client
        .query_one("SELECT pgtaskd.seal_batch(424242)", &[])
        .await
        .unwrap_err();
    assert_eq!(unknown_seal.as_db_error().unwrap().code().code(), "P0002");
    assert_eq!(status(&client, callback).await, "WAITING");
}

/// The callback waits for every member, so a member may wait for nothing that waits for the
/// callback: not the callback itself, not a task that depends on it, not another batch's
/// callback whose batch has a member that waits for this one's. Each such loop left every
/// task in it WAITING for ever; each is refused at the member's insert, naming the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_wait_for_what_waits_for_its_callback() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let insert_member = |batch: i64, parent: i64| {
        let client = &client;
        async move {
            client
                .query_one(
                    "INSERT INTO pgtaskd.tasks (payload, batch_id, depends_on) \
                     VALUES ('m', $1, ARRAY[$2::bigint]) RETURNING id",
                    &[&batch, &parent],
                )
                .await
        }
    };
    let (batch, callback) = open(&client, "finish").await;
    let refused = insert_member(batch, callback).await.unwrap_err();
    assert_eq!(refused.as_db_error().unwrap().code().code(), "23514");

    // Through a task that depends on the callback.
    let after: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) VALUES ('after', ARRAY[$1::bigint]) \
             RETURNING id",
            &[&callback],
        )
        .await
        .unwrap()
        .get(0);
    let refused = insert_member(batch, after).await.unwrap_err();
    let refused = refused.as_db_error().unwrap();
    assert_eq!(refused.code().code(), "23514");
    assert_eq!(
        refused.message(),
        format!(
            "a member of batch {batch} cannot depend on task {after}, which waits for the \
             batch's callback, task {callback}"
        )
    );

    // Through another batch: a member of the second depends on the first's callback, so the
    // second's callback waits for the first's; a member of the first cannot wait for it.
    let (other, other_callback) = open(&client, "finish").await;
    insert_member(other, callback)
        .await
        .expect("a member of another batch may wait for this callback");
    let refused = insert_member(batch, other_callback).await.unwrap_err();
    assert_eq!(
        refused.as_db_error().unwrap().code().code(),
        "23514",
        "{refused:?}"
    );

    // What does not loop is taken: a member waiting for a task that waits for nothing.
    let free = crate::support::enqueue(&client, "free").await;
    insert_member(batch, free).await.expect("no loop");
    assert!(problems(&client).await.is_empty());
}

/// A seal waits for a producer still adding a member, and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_waits_for_the_members_being_added_and_counts_them() {
    let db = TestDb::new().await;
    let producer = db.client().await;
    let sealer = db.client().await;
    let reader = db.client().await;
    let (batch, callback) = open(&producer, "finish").await;
    producer.batch_execute("BEGIN").await.unwrap();
    let added = members(&producer, batch, 1).await[0];
    let sealing = tokio::spawn(async move {
        let state = seal(&sealer, batch).await;
        (sealer, state)
    });
    // The gate: the seal is seen waiting for the producer's lock.
    within(WAIT, "the seal waiting for the producer", async {
        loop {
            let waiting: i64 = reader
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                      WHERE wait_event_type = 'Lock' AND query LIKE '%seal_batch%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    producer.batch_execute("COMMIT").await.unwrap();
    let (sealer, state) = within(WAIT, "the seal", sealing).await.unwrap();
    assert_eq!(
        state, "sealed",
        "the member added is counted: it has not ended"
    );
    assert_eq!(status(&reader, callback).await, "WAITING");
    let claimed = claim(&sealer, 10).await;
    assert_eq!(claimed.len(), 1);
    finish(&sealer, added, claimed[0].1, "SUCCEEDED").await;
    assert_eq!(status(&reader, callback).await, "QUEUED");
}

/// Trials of two batches' worth of races: the last two members of a sealed batch ending at
/// once in two sessions, and the last member's end racing the seal. The callback is released
/// exactly once, never before the seal and the last end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_two_ends_and_the_seal_racing_release_the_callback_exactly_once() {
    let trials: i64 = std::env::var("PGTASKD_BATCH_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000);
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute(BATCH_AUDIT).await.unwrap();
    // Per trial: batch A with two members, sealed; batch B with one member, open.
    let mut plan = Vec::new();
    for _ in 0..trials {
        let (a, _) = open(&client, "finish").await;
        let a_members = members(&client, a, 2).await;
        seal(&client, a).await;
        let (b, _) = open(&client, "success").await;
        let b_member = members(&client, b, 1).await[0];
        plan.push((a_members[0], a_members[1], b, b_member));
    }
    let claimed: HashMap<i64, i64> = claim(&client, trials * 3).await.into_iter().collect();
    assert_eq!(
        claimed.len() as i64,
        trials * 3,
        "every member, no callback"
    );
    let plan = Arc::new(plan);
    let claimed = Arc::new(claimed);
    let barrier = Arc::new(Barrier::new(2));
    let mut sessions = Vec::new();
    for side in 0..2usize {
        let session = db.client().await;
        let (plan, claimed, barrier) = (plan.clone(), claimed.clone(), barrier.clone());
        sessions.push(tokio::spawn(async move {
            for &(a1, a2, b, b_member) in plan.iter() {
                barrier.wait().await;
                let id = if side == 0 { a1 } else { a2 };
                finish(&session, id, claimed[&id], "SUCCEEDED").await;
                barrier.wait().await;
                if side == 0 {
                    finish(&session, b_member, claimed[&b_member], "SUCCEEDED").await;
                } else {
                    seal(&session, b).await;
                }
            }
        }));
    }
    for session in sessions {
        within(WAIT * 5, "the trials", session).await.unwrap();
    }
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pgtaskd.batches WHERE ended_at IS NULL), \
                    (SELECT count(*) FROM pgtaskd.task_state WHERE callback_of IS NOT NULL AND status <> 'QUEUED'), \
                    (SELECT count(*) FROM public.callback_releases), \
                    (SELECT count(*) FROM (SELECT id FROM public.callback_releases GROUP BY id HAVING count(*) > 1) AS twice), \
                    (SELECT count(*) FROM public.callback_releases WHERE early)",
            &[],
        )
        .await
        .unwrap();
    let (open_left, not_queued, releases, twice, early): (i64, i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    assert_eq!(open_left, 0, "every batch ended");
    assert_eq!(not_queued, 0, "every callback QUEUED");
    assert_eq!(releases, trials * 2, "each callback released once");
    assert_eq!(twice, 0);
    assert_eq!(
        early, 0,
        "no callback released before its seal and its last end"
    );
    assert!(problems(&client).await.is_empty());
    println!("{trials} trials of each race: every callback released once, none early");
}

/// The members of a big batch ending in many transactions write nothing but themselves: no
/// edge, no per-member write of the batch row.
#[tokio::test]
async fn no_row_is_written_per_member() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute(BATCH_AUDIT).await.unwrap();
    let (batch, callback) = open(&client, "success").await;
    members(&client, batch, 2_000).await;
    assert_eq!(seal(&client, batch).await, "sealed");
    loop {
        let claimed = claim(&client, 100).await;
        if claimed.is_empty() {
            break;
        }
        for (id, token) in claimed {
            finish(&client, id, token, "SUCCEEDED").await;
        }
    }
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM public.batch_writes WHERE op = 'UPDATE'), \
                    (SELECT count(*) FROM pgtaskd.task_deps), \
                    (SELECT succeeded FROM pgtaskd.batches WHERE id = $1)",
            &[&batch],
        )
        .await
        .unwrap();
    let (writes, edges, succeeded): (i64, i64, Option<i64>) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(writes, 2, "the seal and the end");
    assert_eq!(edges, 0);
    assert_eq!(succeeded, Some(2_000));
    assert_eq!(status(&client, callback).await, "QUEUED");
}

/// A canceled callback retried while its batch ends: the batch's end waits for the retry's
/// commit and releases the callback the retry made wait again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_retried_while_its_batch_ends_is_released() {
    let db = TestDb::new().await;
    let retrier = db.client().await;
    let sealer = db.client().await;
    let reader = db.client().await;
    let (batch, callback) = open(&retrier, "finish").await;
    let member = members(&retrier, batch, 1).await[0];
    let claimed = claim(&retrier, 10).await;
    finish(&retrier, member, claimed[0].1, "SUCCEEDED").await;
    retrier
        .query_one("SELECT pgtaskd.cancel($1)", &[&callback])
        .await
        .unwrap();
    retrier.batch_execute("BEGIN").await.unwrap();
    retrier
        .query_one("SELECT pgtaskd.retry($1)", &[&callback])
        .await
        .unwrap();
    assert_eq!(
        status(&retrier, callback).await,
        "WAITING",
        "its batch is open"
    );
    let sealing = tokio::spawn(async move { seal(&sealer, batch).await });
    within(WAIT, "the seal waiting for the retry", async {
        loop {
            let waiting: i64 = reader
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                      WHERE wait_event_type = 'Lock' AND query LIKE '%seal_batch%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    retrier.batch_execute("COMMIT").await.unwrap();
    assert_eq!(within(WAIT, "the seal", sealing).await.unwrap(), "ended");
    assert_eq!(status(&reader, callback).await, "QUEUED");
    assert!(problems(&reader).await.is_empty());
}

/// Two cancels at once, each cascading into a member of the other's batch: the batches' rows
/// are locked once per end, in id order, so the two never deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cascades_into_each_others_batches_never_deadlock() {
    const TRIALS: usize = 150;
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut plan = Vec::new();
    for _ in 0..TRIALS {
        let (a, _) = open(&client, "finish").await;
        let (b, _) = open(&client, "finish").await;
        let insert = |payload: &'static str, batch: i64, parents: Option<Vec<i64>>| {
            let client = &client;
            async move {
                client
                    .query_one(
                        "INSERT INTO pgtaskd.tasks (queue, payload, batch_id, depends_on) \
                         VALUES ('elsewhere', $1, $2, $3) RETURNING id",
                        &[&payload, &batch, &parents],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
            }
        };
        let x = insert("x", b, None).await;
        let u = insert("u", a, None).await;
        insert("y", a, Some(vec![x])).await;
        insert("v", b, Some(vec![u])).await;
        seal(&client, a).await;
        seal(&client, b).await;
        plan.push((x, u));
    }
    let plan = Arc::new(plan);
    let barrier = Arc::new(Barrier::new(2));
    let mut sessions = Vec::new();
    for side in 0..2usize {
        let session = db.client().await;
        let (plan, barrier) = (plan.clone(), barrier.clone());
        sessions.push(tokio::spawn(async move {
            for &(x, u) in plan.iter() {
                barrier.wait().await;
                let id = if side == 0 { x } else { u };
                session
                    .query_one("SELECT pgtaskd.cancel($1)", &[&id])
                    .await
                    .unwrap_or_else(|err| panic!("cancel of {id}: {err:?}"));
            }
        }));
    }
    for session in sessions {
        within(WAIT * 3, "the trials", session).await.unwrap();
    }
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtaskd.batches WHERE ended_at IS NULL OR canceled <> 2",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "every batch ended with its two members canceled");
    assert!(problems(&client).await.is_empty());
}

/// What the database refuses around a batch's callback, and what a retry after the end keeps.
#[tokio::test]
async fn a_callback_is_kept_and_its_counts_stand_after_the_end() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (batch, callback) = open(&client, "success").await;
    let own = client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, batch_id, depends_on) VALUES ('loop', $1, $2)",
            &[&batch, &vec![callback]],
        )
        .await
        .unwrap_err();
    assert_eq!(own.as_db_error().unwrap().code().code(), "23514", "{own:?}");
    let deleted = client
        .execute("DELETE FROM pgtaskd.tasks WHERE id = $1", &[&callback])
        .await
        .unwrap_err();
    assert!(
        deleted
            .as_db_error()
            .unwrap()
            .message()
            .contains("callback of batch"),
        "{deleted:?}"
    );

    let ids = members(&client, batch, 2).await;
    seal(&client, batch).await;
    let claimed: HashMap<i64, i64> = claim(&client, 10).await.into_iter().collect();
    finish(&client, ids[0], claimed[&ids[0]], "SUCCEEDED").await;
    finish(&client, ids[1], claimed[&ids[1]], "FAILED").await;
    assert_eq!(status(&client, callback).await, "CANCELED");
    // The failed member retried after the end runs again; the batch does not end twice.
    client
        .query_one("SELECT pgtaskd.retry($1)", &[&ids[1]])
        .await
        .unwrap();
    let claimed = claim(&client, 10).await;
    finish(&client, ids[1], claimed[0].1, "SUCCEEDED").await;
    assert_eq!(status(&client, callback).await, "CANCELED");
    let counts = client
        .query_one(
            "SELECT succeeded, failed, canceled FROM pgtaskd.batches WHERE id = $1",
            &[&batch],
        )
        .await
        .unwrap();
    assert_eq!(
        (counts.get(0), counts.get(1), counts.get(2)),
        (1i64, 1i64, 0i64),
        "the counts of the end"
    );
    assert!(problems(&client).await.is_empty());
    // Once ended, the callback and the members may go.
    client
        .execute(
            "DELETE FROM pgtaskd.tasks WHERE id = $1 OR batch_id = $2",
            &[&callback, &batch],
        )
        .await
        .unwrap();
    let rows: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtaskd.batches WHERE id = $1",
            &[&batch],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "an ended batch goes with its callback");
}
