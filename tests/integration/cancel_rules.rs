//! Only a recorded cancel request ends a task CANCELED (docs/design.md, "Cancel is a
//! request"): the finish refuses a CANCELED outcome without one, the table refuses the row,
//! and a cancel of a QUEUED task records its request.

use std::time::Duration;

use pgtaskd::queue::{self, FinishError, Outcome, TaskStatus};

use crate::support::{enqueue, TestDb};

const OWNER: &str = "test-owner";

#[tokio::test]
async fn the_finish_refuses_canceled_for_a_task_whose_cancel_was_not_requested() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = enqueue(&client, "text").await;
    let claimed = queue::claim(
        &client,
        OWNER,
        &["default".into()],
        1,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let attempt = claimed[0].token;

    let refused = queue::finish(&client, attempt, id, &Outcome::Canceled, true).await;
    assert!(
        matches!(
            refused,
            Err(FinishError::NotRunning {
                status: TaskStatus::Running
            })
        ),
        "{refused:?}"
    );
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running);

    // Once a cancel is requested, the same finish is accepted.
    client
        .execute("SELECT pgtaskd.cancel($1)", &[&id])
        .await
        .unwrap();
    let status = queue::finish(&client, attempt, id, &Outcome::Canceled, true)
        .await
        .unwrap();
    assert_eq!(status, TaskStatus::Canceled);
}

#[tokio::test]
async fn the_table_refuses_a_canceled_row_without_a_cancel_request() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = enqueue(&client, "text").await;
    let err = client
        .execute(
            "UPDATE pgtaskd.task_state SET status = 'CANCELED', finished_at = now() WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.as_db_error().map(|e| e.constraint()),
        Some(Some("tasks_canceled_only_when_requested"))
    );
}

#[tokio::test]
async fn a_queued_task_canceled_records_its_cancel_request() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = enqueue(&client, "text").await;
    let status: String = client
        .query_one("SELECT pgtaskd.cancel($1)", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "CANCELED");
    let task = queue::get(&client, id).await.unwrap().unwrap();
    assert!(task.cancel_requested);
}
