//! The console's task list on a table of 1,000,000 finished rows (a database of the test's
//! own, filled by one `INSERT ... SELECT generate_series` and one `UPDATE` of the state rows): filters opened in Chromium, one of
//! them by a link 90% of the way down, and paged by the cursor, each page's rows checked against the table, and the time each
//! page took printed (a figure, not an assertion: `cargo test --test integration --
//! ui::million --nocapture` shows them). Then the queue's 20,000 FAILED rows retried through
//! `POST /queues/{queue}/retry-failed`, in batches, timed too.

use std::time::Instant;

use serde_json::json;

use super::browser::Browser;
use super::{Served, TOKEN};
use crate::support::{within, TestDb, WAIT};

/// The pages of each filter the test walks through.
const PAGES: usize = 8;
/// The rows of a page of the console's list.
const PAGE_ROWS: i64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_list_pages_deep_through_a_million_finished_rows_in_chromium() {
    super::chromium();
    super::browser::chromedriver();
    let db = TestDb::new().await;
    let client = db.client().await;
    // Queues default 90% and mail 10%; 98% SUCCEEDED, 2% FAILED (20,000 of them in mail).
    let started = Instant::now();
    within(
        WAIT * 5,
        "1,000,000 finished rows",
        client.batch_execute(
            "BEGIN;
             INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT CASE WHEN g % 10 = 0 THEN 'mail' ELSE 'default' END, 'payload ' || g
               FROM generate_series(1, 1000000) AS g;
             UPDATE pgtaskd.task_state AS s
                SET status = CASE WHEN g % 50 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END,
                    attempt = 1, started_at = now() - interval '3 hours',
                    finished_at = now() - interval '3 hours' + g * interval '1 ms',
                    error = CASE WHEN g % 50 = 0 THEN 'error ' || g END
               FROM (SELECT id, split_part(payload, ' ', 2)::int8 AS g FROM pgtaskd.tasks) AS t
              WHERE t.id = s.id;
             COMMIT;
             ANALYZE pgtaskd.tasks;
             ANALYZE pgtaskd.task_state;",
        ),
    )
    .await
    .expect("the rows are inserted");
    println!(
        "1,000,000 rows inserted and analyzed in {:?}",
        started.elapsed()
    );
    let served = Served::start(&db).await;
    let browser = Browser::start(1280, 900).await;
    browser.goto(&served.console("")).await;
    browser
        .wait_for(
            "the overview",
            "return document.getElementById('status').textContent.startsWith('updated')",
        )
        .await;

    // Three filters from their first page, and one opened by a link 90% of the way down
    // (`after=100000`), each paged by the cursor.
    for (queue, status, condition, start) in [
        ("mail", "failed", "queue = 'mail' AND status = 'FAILED'", ""),
        ("default", "", "queue = 'default'", ""),
        ("", "succeeded", "status = 'SUCCEEDED'", ""),
        ("default", "", "queue = 'default' AND id < 100000", "100000"),
    ] {
        let query: Vec<String> = [("queue", queue), ("status", status), ("after", start)]
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let fragment = format!("#tasks?{}", query.join("&"));
        browser
            .eval(&format!(
                "document.getElementById('task-list').dataset.loaded = ''; \
                 location.hash = '{fragment}'; return null"
            ))
            .await;
        let mut after = if start.is_empty() {
            "first".to_string()
        } else {
            start.to_string()
        };
        for page in 0..PAGES {
            let clicked = Instant::now();
            if page > 0 {
                browser.click("#older").await;
            }
            browser
                .wait_for(
                    &format!("page {page} of {fragment}"),
                    &format!(
                        "return document.getElementById('task-list').dataset.loaded === '{after}'"
                    ),
                )
                .await;
            let waited = clicked.elapsed();
            let shown = browser
                .eval(
                    "return [Array.from(document.querySelectorAll('#task-list tbody tr[data-task]')).map(r => Number(r.dataset.task)), document.getElementById('task-list').dataset.ms, location.hash]",
                )
                .await;
            let ids: Vec<i64> = serde_json::from_value(shown[0].clone()).unwrap();
            let sql = format!(
                "SELECT id FROM pgtaskd.task_view WHERE {condition} ORDER BY id DESC \
                 LIMIT {PAGE_ROWS} OFFSET {}",
                page as i64 * PAGE_ROWS
            );
            let expected: Vec<i64> = within(WAIT, "the page's ids", client.query(&sql, &[]))
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            assert_eq!(ids, expected, "page {page} of {fragment}");
            let statuses = browser
                .eval("return Array.from(document.querySelectorAll('#task-list tbody tr[data-task] td:nth-child(3)')).map(c => c.textContent)")
                .await;
            if !status.is_empty() {
                assert!(
                    statuses
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|s| s == &json!(status.to_uppercase())),
                    "{statuses}"
                );
            }
            println!(
                "{fragment} page {}: {} ms in the page (GET /tasks and its rows drawn), {:?} from the click, {}",
                page + 1,
                shown[1].as_str().unwrap_or("?"),
                waited,
                shown[2]
            );
            after = ids.last().expect("a full page").to_string();
        }
    }

    // Retry the 20,000 FAILED tasks of mail: two batches of 10,000, each its own statement.
    let http = reqwest::Client::new();
    let started = Instant::now();
    let response = within(
        WAIT,
        "retry-failed of mail",
        http.post(format!("{}/queues/mail/retry-failed", served.base))
            .bearer_auth(TOKEN)
            .send(),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    let body: serde_json::Value = within(WAIT, "its body", response.json()).await.unwrap();
    assert_eq!(
        (&body["queue"], &body["retried"], &body["remaining"]),
        (&json!("mail"), &json!(20000), &json!(0)),
        "{body}"
    );
    assert!(body["next"].as_i64().is_some_and(|next| next > 0), "{body}");
    println!(
        "POST /queues/mail/retry-failed: 20,000 FAILED of 1,000,000 rows QUEUED again in {took:?}"
    );
    browser.close().await;
    drop(served);
}
