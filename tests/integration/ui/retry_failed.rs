//! `POST /queues/{queue}/retry-failed`: every FAILED task of one queue back to QUEUED as
//! `pgtaskd.retry` puts each, other queues and statuses untouched; 404 for a queue nobody
//! knows, 400 for a name that is not one, 401 without the token, 405 for GET. Under it,
//! `pgtaskd.retry_failed(queue, max_rows, after_id)` works a batch per call and is the operator's and
//! the daemon's, not PUBLIC's; above it, `pgtaskd retry --queue Q --failed`.

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_postgres::Client;

use super::{Served, TOKEN};
use crate::support::daemon::pgtaskd;
use crate::support::{within, TestDb, WAIT};

/// The count of tasks of `queue` in `status`.
async fn tally(client: &Client, queue: &str, status: &str) -> i64 {
    within(
        WAIT,
        "a count",
        client.query_one(
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = $1 AND status = $2",
            &[&queue, &status],
        ),
    )
    .await
    .expect("counted")
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_failed_requeues_one_queues_failures_in_batches() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // mail: 25,000 FAILED (three batches of the route's 10,000), 1 CANCELED, 1 SUCCEEDED;
    // reports: 3 FAILED; "quiet": paused, no task. The tasks are inserted, then their state
    // rows (`pgtaskd.task_state`, schema 36) set.
    within(
        WAIT,
        "the tasks",
        client.batch_execute(
            "BEGIN;
             INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT 'mail', 'm' || g FROM generate_series(1, 25000) AS g;
             UPDATE pgtaskd.task_state
                SET status = 'FAILED', attempt = 3, started_at = now(), finished_at = now(),
                    error = 'boom'
              WHERE queue = 'mail' AND status = 'QUEUED';
             INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('mail', 'c'), ('mail', 's');
             UPDATE pgtaskd.task_state AS s
                SET status = CASE t.payload WHEN 'c' THEN 'CANCELED' ELSE 'SUCCEEDED' END,
                    attempt = 1, started_at = now(), finished_at = now(),
                    cancel_requested = (t.payload = 'c')
               FROM pgtaskd.tasks AS t
              WHERE t.id = s.id AND t.queue = 'mail' AND s.status = 'QUEUED';
             INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT 'reports', 'r' || g FROM generate_series(1, 3) AS g;
             UPDATE pgtaskd.task_state
                SET status = 'FAILED', attempt = 1, started_at = now(), finished_at = now(),
                    error = 'no data'
              WHERE queue = 'reports' AND status = 'QUEUED';
             COMMIT;
             SELECT pgtaskd.pause_queue('quiet');",
        ),
    )
    .await
    .expect("the tasks are inserted");
    let served = Served::start(&db).await;
    let http = reqwest::Client::new();
    let post = |path: &str, token: Option<&str>| {
        let mut request = http.post(format!("{}{path}", served.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move {
            let response = within(WAIT, "an HTTP response", request.send())
                .await
                .unwrap();
            let status = response.status();
            let body: Value = within(WAIT, "an HTTP body", response.json()).await.unwrap();
            (status, body)
        }
    };

    // Without the token, or with a wrong one: 401, nothing changed.
    for token in [None, Some("wrong")] {
        let (status, body) = post("/queues/mail/retry-failed", token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    }
    assert_eq!(tally(&client, "mail", "FAILED").await, 25_000);

    let highest: i64 = within(
        WAIT,
        "mail's highest FAILED id",
        client.query_one(
            "SELECT max(id) FROM pgtaskd.task_view WHERE queue = 'mail' AND status = 'FAILED'",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let (status, body) = post("/queues/mail/retry-failed", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"queue": "mail", "retried": 25000, "next": highest, "remaining": 0})
    );
    assert_eq!(tally(&client, "mail", "FAILED").await, 0);
    assert_eq!(tally(&client, "mail", "QUEUED").await, 25_000);
    // As `pgtaskd.retry` leaves each: attempt 0, no error, output, results, start or finish.
    let row = within(
        WAIT,
        "the retried rows",
        client.query_one(
            "SELECT count(*) FROM pgtaskd.task_view
              WHERE queue = 'mail' AND status = 'QUEUED' AND attempt = 0 AND error IS NULL
                AND output IS NULL AND words = 0 AND started_at IS NULL
                AND finished_at IS NULL AND run_at <= now()",
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(row.get::<_, i64>(0), 25_000);
    // Other statuses and other queues untouched.
    assert_eq!(tally(&client, "mail", "CANCELED").await, 1);
    assert_eq!(tally(&client, "mail", "SUCCEEDED").await, 1);
    assert_eq!(tally(&client, "reports", "FAILED").await, 3);

    // Going on from the cursor never retries again a task that failed again meanwhile.
    within(
        WAIT,
        "some retried tasks failing again",
        client.batch_execute(
            "UPDATE pgtaskd.task_state SET status = 'FAILED', attempt = 1, finished_at = now(), error = 'again'
              WHERE id IN (SELECT id FROM pgtaskd.task_view WHERE queue = 'mail' AND status = 'QUEUED' LIMIT 10)",
        ),
    )
    .await
    .unwrap();
    let (status, body) = post(
        &format!("/queues/mail/retry-failed?after={highest}"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"queue": "mail", "retried": 0, "next": highest, "remaining": 0})
    );
    assert_eq!(tally(&client, "mail", "FAILED").await, 10);
    let (status, body) = post("/queues/mail/retry-failed?after=x", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    within(
        WAIT,
        "the failed-again tasks back",
        client.batch_execute(
            "UPDATE pgtaskd.task_state SET status = 'QUEUED', attempt = 0, finished_at = NULL, error = NULL
              WHERE queue = 'mail' AND status = 'FAILED'",
        ),
    )
    .await
    .unwrap();

    // Nothing left to retry: 200 and 0; a paused queue without tasks is known too.
    for queue in ["mail", "quiet"] {
        let (status, body) = post(&format!("/queues/{queue}/retry-failed"), Some(TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body,
            json!({"queue": queue, "retried": 0, "next": 0, "remaining": 0})
        );
    }
    // A queue nobody knows: 404; a name that is no queue name: 400; GET: 405.
    let (status, body) = post("/queues/nosuch/retry-failed", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("no such queue"),
        "{body}"
    );
    let long = "q".repeat(129);
    for bad in [long.as_str(), "a%00b"] {
        let (status, body) = post(&format!("/queues/{bad}/retry-failed"), Some(TOKEN)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let response = within(
        WAIT,
        "GET retry-failed",
        http.get(format!("{}/queues/mail/retry-failed", served.base))
            .bearer_auth(TOKEN)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);

    // The SQL function: a batch per call, at most max_rows, lowest ids first, each call from
    // the last one's highest id; 0 when none is left.
    let failed_ids: Vec<i64> = within(
        WAIT,
        "reports' ids",
        client.query(
            "SELECT id FROM pgtaskd.task_view WHERE queue = 'reports' ORDER BY id",
            &[],
        ),
    )
    .await
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect();
    let mut after = 0_i64;
    for (max_rows, retried, last) in [
        (2, 2, failed_ids[1]),
        (2, 1, failed_ids[2]),
        (2, 0, failed_ids[2]),
    ] {
        let row = within(
            WAIT,
            "pgtaskd.retry_failed",
            client.query_one(
                "SELECT retried, last_id FROM pgtaskd.retry_failed('reports', $1, $2)",
                &[&max_rows, &after],
            ),
        )
        .await
        .unwrap();
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            (retried, last),
            "max_rows {max_rows} after {after}"
        );
        after = last;
    }
    let err = within(
        WAIT,
        "max_rows 0",
        client.query_one("SELECT * FROM pgtaskd.retry_failed('reports', 0)", &[]),
    )
    .await
    .expect_err("max_rows 0 is refused");
    let message = err.as_db_error().map(|e| e.message().to_string());
    assert!(
        message.as_deref().is_some_and(|m| m.contains("max_rows")),
        "{err:?}"
    );

    // Operators and daemons may call it (as pgtaskd.retry); PUBLIC may not.
    within(
        WAIT,
        "roles",
        client.batch_execute(
            "DROP ROLE IF EXISTS ui_retry_operator; DROP ROLE IF EXISTS ui_retry_nobody;
             CREATE ROLE ui_retry_operator; CREATE ROLE ui_retry_nobody;
             SELECT pgtaskd.grant_operator('ui_retry_operator');",
        ),
    )
    .await
    .expect("the roles are made");
    let rights = within(
        WAIT,
        "the rights",
        client.query_one(
            "SELECT has_function_privilege('ui_retry_operator', 'pgtaskd.retry_failed(text, integer, bigint)', 'EXECUTE'),
                    has_function_privilege('ui_retry_nobody', 'pgtaskd.retry_failed(text, integer, bigint)', 'EXECUTE')",
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (rights.get::<_, bool>(0), rights.get::<_, bool>(1)),
        (true, false)
    );
    within(
        WAIT,
        "dropping the roles",
        client.batch_execute(
            "DROP OWNED BY ui_retry_operator; DROP ROLE ui_retry_operator; DROP ROLE ui_retry_nobody;",
        ),
    )
    .await
    .expect("the roles are dropped");

    // The CLI form: exit 0 and the counts; 3 for a queue nobody knows; --queue needs --failed.
    within(
        WAIT,
        "more failures",
        client.batch_execute(
            "UPDATE pgtaskd.task_state SET status = 'FAILED', error = 'again', finished_at = now(),
                                          started_at = now(), attempt = 1
              WHERE queue = 'reports';",
        ),
    )
    .await
    .unwrap();
    let (status, stdout, stderr) =
        pgtaskd(Some(&db.url), &["retry", "--queue", "reports", "--failed"]).await;
    assert_eq!(status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        "queue reports: 3 FAILED tasks QUEUED again, 0 FAILED left"
    );
    assert_eq!(tally(&client, "reports", "QUEUED").await, 3);
    let (status, stdout, stderr) =
        pgtaskd(Some(&db.url), &["retry", "--queue", "nosuch", "--failed"]).await;
    assert_eq!(status.code(), Some(3), "{stdout}{stderr}");
    assert!(stderr.contains("no such queue"), "{stderr}");
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["retry", "--queue", "reports"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    let (status, _, stderr) = pgtaskd(
        Some(&db.url),
        &["retry", "7", "--queue", "reports", "--failed"],
    )
    .await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    // --failed with an id instead of a queue: a usage error, not a retry of that one task.
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["retry", "7", "--failed"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    drop(served);
}
