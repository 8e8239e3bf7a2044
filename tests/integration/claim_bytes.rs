//! A claim bounded in payload bytes (docs/design.md, "Bounded memory"): it stops adding tasks
//! once their payloads reach the budget, takes one task of any size when asked to, says what
//! it left out, and leaves a payload over `max_payload` in the database.

use std::time::Duration;

use pgtaskd::queue::{self, ClaimLimits};
use tokio_postgres::Client;

use crate::support::TestDb;

const OWNER: &str = "test-owner";
const LEASE: Duration = Duration::from_secs(30);

fn limits(bytes: u64, take_one: bool) -> ClaimLimits {
    ClaimLimits {
        tasks: 100,
        bytes,
        take_one,
        max_payload: None,
    }
}

/// Enqueue one task per length, in order, each a run of 'x'; returns their ids.
async fn enqueue_sizes(client: &Client, sizes: &[usize]) -> Vec<i64> {
    let mut ids = Vec::new();
    for &size in sizes {
        let id: i64 = client
            .query_one(
                "SELECT pgtaskd.enqueue(repeat('x', $1::int))",
                &[&(size as i32)],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    ids
}

async fn claim(client: &Client, limits: ClaimLimits) -> queue::ClaimBatch {
    queue::claim_within(client, OWNER, &["default".into()], limits, LEASE)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_claim_stops_at_the_first_task_that_would_pass_the_byte_budget() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids = enqueue_sizes(&client, &[100, 200, 300, 10]).await;

    let batch = claim(&client, limits(350, false)).await;
    let claimed: Vec<i64> = batch.tasks.iter().map(|t| t.id).collect();
    // 100 + 200 fit; 300 would pass 350, and the 10 behind it waits its turn.
    assert_eq!(claimed, ids[..2]);
    assert_eq!(batch.bytes, 300);
    assert_eq!(batch.left_out, Some(300));
    assert_eq!(batch.tasks[0].payload.as_ref().unwrap().as_str().len(), 100);
    let queued: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'QUEUED'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(queued, 2);
}

#[tokio::test]
async fn a_payload_larger_than_the_budget_is_taken_alone_when_the_claim_may_take_one() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids = enqueue_sizes(&client, &[200_000, 10]).await;

    let strict = claim(&client, limits(1_000, false)).await;
    assert!(strict.tasks.is_empty());
    assert_eq!(strict.left_out, Some(200_000));

    let batch = claim(&client, limits(1_000, true)).await;
    assert_eq!(batch.tasks.len(), 1);
    assert_eq!(batch.tasks[0].id, ids[0]);
    assert_eq!(batch.tasks[0].bytes, 200_000);
    // Held in the row it arrived in, read in place.
    let text = batch.tasks[0].payload.as_ref().unwrap().as_str();
    assert_eq!(text.len(), 200_000);
    assert!(text.bytes().all(|b| b == b'x'));
    assert_eq!(batch.left_out, Some(10));
}

#[tokio::test]
async fn a_claim_within_budget_leaves_nothing_out() {
    let db = TestDb::new().await;
    let client = db.client().await;
    enqueue_sizes(&client, &[10, 20, 30]).await;
    let batch = claim(&client, limits(1 << 20, false)).await;
    assert_eq!(batch.tasks.len(), 3);
    assert_eq!(batch.bytes, 60);
    assert_eq!(batch.left_out, None);
}

#[tokio::test]
async fn a_payload_over_max_payload_is_claimed_without_its_text_and_weighs_nothing() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids = enqueue_sizes(&client, &[5_000, 40]).await;
    let batch = claim(
        &client,
        ClaimLimits {
            tasks: 10,
            bytes: 100,
            take_one: false,
            max_payload: Some(1_000),
        },
    )
    .await;
    assert_eq!(batch.tasks.len(), 2);
    assert_eq!(batch.tasks[0].id, ids[0]);
    assert_eq!(batch.tasks[0].bytes, 5_000);
    assert!(batch.tasks[0].payload.is_none());
    assert_eq!(batch.tasks[1].payload.as_ref().unwrap().as_str().len(), 40);
    assert_eq!(batch.bytes, 40);
    assert_eq!(batch.left_out, None);
}
