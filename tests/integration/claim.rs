//! One winner (docs/design.md): each claim of a task succeeds for exactly one claimer.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use pgtaskd::queue;
use tokio::sync::Barrier;

use crate::support::{
    blocks_touched, count, hold_snapshot, statistics_say_empty, within, TestDb, WAIT,
};

const LEASE: Duration = Duration::from_secs(30);

fn default_queue() -> Vec<String> {
    vec!["default".to_string()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_claimers_released_by_one_barrier_get_one_winner_thirty_times_in_a_row() {
    let db = TestDb::new().await;
    let pool = db.pool(2);
    let setup = db.client().await;
    for round in 0..30 {
        let id: i64 = setup
            .query_one("SELECT pgtaskd.enqueue($1)", &[&format!("round {round}")])
            .await
            .unwrap()
            .get(0);
        // Both connections are open before the barrier, so the race is between statements.
        let a = within(WAIT, "a pooled connection", pool.get())
            .await
            .unwrap();
        let b = within(WAIT, "a pooled connection", pool.get())
            .await
            .unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let claimer = |client: pgtaskd::db::Session, owner: &'static str| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let claimed = queue::claim(&client, owner, &default_queue(), 1, LEASE).await;
                (owner, claimed.expect("a claim statement does not fail"))
            })
        };
        let first = claimer(a, "claimer-a");
        let second = claimer(b, "claimer-b");
        let (first, second) = within(WAIT, "both claims", async {
            (first.await.unwrap(), second.await.unwrap())
        })
        .await;
        let winners: Vec<_> = [&first, &second]
            .into_iter()
            .filter(|(_, claimed)| !claimed.is_empty())
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one claim wins: {first:?} {second:?}"
        );
        let (owner, claimed) = winners[0];
        assert_eq!(claimed.len(), 1);
        assert_eq!(
            (claimed[0].id, claimed[0].attempt),
            (id, 1),
            "round {round}"
        );
        let row = setup
            .query_one(
                "SELECT status, attempt, lease_owner FROM pgtaskd.task_view WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), "RUNNING");
        assert_eq!(
            row.get::<_, i32>(1),
            1,
            "round {round}: one claim, one attempt"
        );
        assert_eq!(row.get::<_, Option<&str>>(2), Some(*owner));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_claimers_over_two_thousand_tasks_claim_each_task_exactly_once() {
    let db = TestDb::new().await;
    let setup = db.client().await;
    setup
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'task ' || i FROM generate_series(1, 2000) i",
            &[],
        )
        .await
        .unwrap();
    let pool = db.pool(8);
    let barrier = Arc::new(Barrier::new(8));
    let mut claimers = Vec::new();
    for n in 0..8 {
        let pool = pool.clone();
        let barrier = Arc::clone(&barrier);
        claimers.push(tokio::spawn(async move {
            let client = pool.get().await.unwrap();
            let owner = format!("claimer-{n}");
            barrier.wait().await;
            let mut ids = Vec::new();
            loop {
                // Batches of varying size, so that claimers overlap in many ways.
                let batch = 1 + (n * 7 + ids.len()) % 23;
                let claimed = queue::claim(&client, &owner, &default_queue(), batch, LEASE)
                    .await
                    .unwrap();
                assert!(
                    claimed.len() <= batch,
                    "a claim never takes more than its limit"
                );
                if claimed.is_empty() {
                    return ids;
                }
                ids.extend(claimed.iter().map(|t| (t.id, t.attempt)));
            }
        }));
    }
    let mut all = Vec::new();
    for claimer in claimers {
        all.extend(within(WAIT, "a claimer to finish", claimer).await.unwrap());
    }
    let unique: HashSet<i64> = all.iter().map(|(id, _)| *id).collect();
    assert_eq!(all.len(), 2000, "every task claimed once in all");
    assert_eq!(unique.len(), 2000, "no task claimed twice");
    assert!(all.iter().all(|(_, attempt)| *attempt == 1));
    let row = setup
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'RUNNING' AND attempt = 1), count(*) FROM pgtaskd.task_view",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (2000, 2000));
}

#[tokio::test]
async fn claims_take_higher_priority_first_then_oldest_and_skip_future_and_other_queues() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload, priority) VALUES ('low', 0), ('high', 5), ('low2', 0);
             INSERT INTO pgtaskd.tasks (payload, run_at) VALUES ('later', now() + interval '1 hour');
             INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('elsewhere', 'other');",
        )
        .await
        .unwrap();
    let mut order = Vec::new();
    loop {
        let claimed = queue::claim(&client, "me", &default_queue(), 1, LEASE)
            .await
            .unwrap();
        match claimed.first() {
            Some(task) => order.push(task.payload.as_ref().unwrap().as_str().to_owned()),
            None => break,
        }
    }
    assert_eq!(order, ["high", "low", "low2"]);
    let other = queue::claim(&client, "me", &["other".to_string()], 10, LEASE)
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].payload.as_ref().unwrap().as_str(), "elsewhere");
}

#[tokio::test]
async fn a_claim_sets_the_lease_from_the_database_clock() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .execute("SELECT pgtaskd.enqueue('x')", &[])
        .await
        .unwrap();
    let claimed = queue::claim(&client, "me", &default_queue(), 5, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let row = client
        .query_one(
            "SELECT lease_owner, extract(epoch FROM lease_expires_at - started_at)::float8, started_at IS NOT NULL
               FROM pgtaskd.task_view WHERE id = $1",
            &[&claimed[0].id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "me");
    assert!((row.get::<_, f64>(1) - 90.0).abs() < 0.01);
    assert!(row.get::<_, bool>(2));
}

fn limits(tasks: usize) -> queue::ClaimLimits {
    queue::ClaimLimits {
        tasks,
        bytes: u64::MAX,
        take_one: true,
        max_payload: None,
    }
}

/// Claims after a position (docs/design.md, "Claims after a position"): the tasks after it
/// in claim order (the rest of its priority by id, then the lower priorities), and none
/// before it, whatever their priority.
#[tokio::test]
async fn a_claim_after_a_position_takes_the_tasks_after_it_in_claim_order_and_none_before() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // ids 1..=9, priority 1 for every third, 0 for the others.
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload, priority)
             SELECT 'p' || i, CASE WHEN i % 3 = 0 THEN 1 ELSE 0 END FROM generate_series(1, 9) i",
        )
        .await
        .unwrap();
    let claim = |after, n| {
        let client = &client;
        async move {
            let batch =
                queue::claim_after(client, "claimer", &default_queue(), limits(n), LEASE, after)
                    .await
                    .unwrap();
            let ids: Vec<i64> = batch.tasks.iter().map(|t| t.id).collect();
            (ids, batch.last)
        }
    };
    let after = Some(queue::Position { priority: 1, id: 3 });
    let (ids, last) = claim(after, 3).await;
    assert_eq!(
        ids,
        [6, 9, 1],
        "the rest of priority 1, then priority 0 by id"
    );
    assert_eq!(last, Some(queue::Position { priority: 0, id: 1 }));
    let (ids, _) = claim(Some(queue::Position { priority: 0, id: 4 }), 10).await;
    assert_eq!(
        ids,
        [5, 7, 8],
        "nothing before the position: 2 and 4 are left"
    );
    let (ids, _) = claim(None, 10).await;
    assert_eq!(
        ids,
        [3, 2, 4],
        "a claim from the start finds what the others skipped"
    );
}

/// A position needs both halves (schema 13): a caller of `pgtaskd.claim` who passes a
/// priority without an id, or an id without a priority, gets a claim from the start, not one
/// that skips the priority it named and everything above it.
#[tokio::test]
async fn a_claim_given_half_a_position_claims_from_the_start() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // Priorities 2, 1, 0, 2, 1, 0 for ids 1..=6.
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload, priority)
             SELECT 'p' || i, 2 - (i - 1) % 3 FROM generate_series(1, 6) i",
        )
        .await
        .unwrap();
    let claim = |after_priority: Option<i32>, after_id: Option<i64>| {
        let client = &client;
        async move {
            let rows = within(
                WAIT,
                "a claim of pgtaskd.claim's own",
                client.query(
                    "SELECT task_id FROM pgtaskd.claim(ARRAY['default'], 2, 'caller', 30000, \
                     1000000, true, 1000000, $1, $2)",
                    &[&after_priority, &after_id],
                ),
            )
            .await
            .unwrap();
            rows.iter().map(|r| r.get(0)).collect::<Vec<i64>>()
        }
    };
    assert_eq!(claim(Some(1), None).await, [1, 4], "priority 2 first");
    assert_eq!(claim(None, Some(5)).await, [2, 5], "then priority 1");
    assert_eq!(claim(None, None).await, [3, 6]);
}

/// The reason for positions: while a snapshot is held, the claim index keeps an entry for
/// every task claimed since, at the front of claim order. A claim from the start reads them
/// all (and each one's row); a claim after the last position reads none of them.
#[tokio::test]
async fn under_a_held_snapshot_a_claim_after_the_last_position_skips_the_entries_claimed_before() {
    const CLAIMED: i64 = 40_000;
    let db = TestDb::new().await;
    let client = db.client().await;
    let holder = hold_snapshot(&db).await;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'claimed ' || i FROM generate_series(1, $1::int8) i",
            &[&CLAIMED],
        )
        .await
        .unwrap();
    let mut last = None;
    loop {
        let batch = queue::claim_after(
            &client,
            "claimer",
            &default_queue(),
            limits(500),
            LEASE,
            last,
        )
        .await
        .unwrap();
        if batch.tasks.is_empty() {
            break;
        }
        last = batch.last;
    }
    assert_eq!(
        last,
        Some(queue::Position {
            priority: 0,
            id: CLAIMED
        })
    );
    client
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'waiting ' || i FROM generate_series(1, 20) i",
        )
        .await
        .unwrap();
    let call = |after: &str| {
        format!("pgtaskd.claim(ARRAY['default'], 10, 'claimer', 30000, 1000000000, true, NULL, {after})")
    };
    let positioned = blocks_touched(&client, &call(&format!("0, {CLAIMED}"))).await;
    let from_start = blocks_touched(&client, &call("NULL, NULL")).await;
    let table_blocks = count(
        &client,
        "SELECT pg_relation_size('pgtaskd.task_state') / current_setting('block_size')::int8",
    )
    .await;
    // About ten blocks for each task a claim takes (its row, its new version, three indexes).
    assert!(
        positioned <= 200,
        "a claim after the position touched {positioned} blocks ({table_blocks} in the table)"
    );
    assert!(
        from_start > 4 * positioned,
        "a claim from the start touched {from_start} blocks, one after the position {positioned}: the test no longer shows the difference"
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'QUEUED'"
        )
        .await,
        0,
        "both claims took their 10"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
}

/// A claim's commit is flushed before its answer whatever `synchronous_commit` says (schema
/// 25): with it off, a crash could lose a claim the daemon was answered, and the token
/// sequence's last values with it, and the same task would be claimed again under the same
/// token. The claim makes `off` `local` for its own transaction only, and keeps `local` (the
/// daemon's setting while a synchronous standby is missing: `on` would wait for it forever).
#[tokio::test]
async fn a_claim_commits_synchronously_even_where_synchronous_commit_is_off() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    crate::support::enqueue(&client, "durable").await;
    client
        .batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let claimed = tx
        .query(
            "SELECT task_id FROM pgtaskd.claim(ARRAY['default'], 10, 'me', 60000, 1048576, \
             true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let setting: String = tx
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "local", "for the claim's commit");
    tx.commit().await.unwrap();
    let setting: String = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "off", "the session's own setting after it");
    // Any other setting is kept.
    for kept in ["local", "on", "remote_write"] {
        crate::support::enqueue(&client, "durable").await;
        client
            .batch_execute(&format!("SET synchronous_commit = {kept}"))
            .await
            .unwrap();
        let tx = client.transaction().await.unwrap();
        tx.query(
            "SELECT task_id FROM pgtaskd.claim(ARRAY['default'], 10, 'me', 60000, 1048576, \
             true, 1048576, NULL, NULL)",
            &[],
        )
        .await
        .unwrap();
        let setting: String = tx
            .query_one("SHOW synchronous_commit", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(setting, kept);
        tx.commit().await.unwrap();
    }
}

/// Statistics taken while the tables were empty (an autovacuum of a drained queue, a VACUUM
/// ANALYZE by hand) must not make the claim walk the task table for each candidate: the claim
/// reads each candidate's task row by its key (schema 44). Before, the planner, costing both
/// tables at one row, joined them by walking `tasks_pkey` from its start and filtering on the
/// id, so a claim near the end of a backlog read every task row before its candidates.
#[tokio::test]
async fn a_claim_after_statistics_of_empty_tables_reads_each_task_row_by_its_key() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    statistics_say_empty(&client).await;
    within(
        WAIT,
        "the backlog",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload)
                 SELECT 'walk', 'task ' || g FROM generate_series(1, 5000) AS g",
        ),
    )
    .await
    .unwrap();
    let tuples: f32 = client
        .query_one(
            "SELECT reltuples FROM pg_class WHERE oid = 'pgtaskd.task_state'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tuples, 0.0, "the statistics are those of the empty table");
    // The last 16 tasks, claimed after the position of the one before them (priority 0).
    let after: i64 = client
        .query_one(
            "SELECT id FROM pgtaskd.tasks WHERE queue = 'walk' ORDER BY id DESC OFFSET 16 LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    for (after_priority, after_id) in [(Some(0), Some(after)), (None, None)] {
        let tx = client.transaction().await.unwrap();
        let claimed = within(
            WAIT,
            "the claim",
            tx.query(
                "SELECT task_id FROM pgtaskd.claim(ARRAY['walk'], 16, 'walkerkey0', 30000, \
                 1000000000, true, 1048576, $1, $2) WHERE task_id IS NOT NULL",
                &[&after_priority, &after_id],
            ),
        )
        .await
        .unwrap();
        assert_eq!(claimed.len(), 16);
        // The task rows this transaction fetched through an index: the claimed ones (and a
        // few more), not the thousands before them.
        let fetched: i64 = tx
            .query_one(
                "SELECT idx_tup_fetch FROM pg_stat_xact_user_tables
                  WHERE relid = 'pgtaskd.tasks'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            fetched <= 100,
            "the claim after {after_id:?} fetched {fetched} task rows for 16 tasks"
        );
        tx.rollback().await.unwrap();
    }
}
