//! A running task's page in Chromium shows its handler's progress report (docs/handlers.md,
//! "Progress"): posted to the daemon's `POST /tasks/{id}/progress` with the task's claim,
//! written by the daemon's flusher, read by the page's refresh, rendered as a bar, the message
//! and the report, as text.

use std::time::{Duration, Instant};

use pgtaskd::queue;

use super::browser::Browser;
use super::{Served, TOKEN};
use crate::support::{within, TestDb, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_tasks_page_shows_its_progress_report() {
    super::chromium();
    super::browser::chromedriver();
    let db = TestDb::new().await;
    let client = db.client().await;
    // A queue the console's daemon does not serve: the test holds the claim itself.
    let id: i64 = within(
        WAIT,
        "an enqueue",
        client.query_one("SELECT pgtaskd.enqueue('long', queue => 'watched')", &[]),
    )
    .await
    .expect("enqueued")
    .get(0);
    let claimed = within(
        WAIT,
        "a claim",
        queue::claim(
            &client,
            "tester",
            &["watched".to_string()],
            1,
            Duration::from_secs(60),
        ),
    )
    .await
    .unwrap();
    let served = Served::start(&db).await;
    let browser = Browser::start(1280, 900).await;
    browser.goto(&served.console(&format!("&task={id}"))).await;
    browser
        .wait_for(
            "the page to show the task RUNNING",
            "return document.getElementById('task-view').dataset.status === 'RUNNING'",
        )
        .await;
    let posted = Instant::now();
    let answer = within(
        WAIT,
        "a progress report",
        reqwest::Client::new()
            .post(format!("{}/tasks/{id}/progress", served.base))
            .bearer_auth(TOKEN)
            .header("pgtaskd-claim", claimed[0].token.to_string())
            .body(r#"{"percent": 40, "message": "<b>half</b> way", "cursor": 17}"#)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(answer.status().as_u16(), 202);
    let shown = browser
        .wait_for(
            "the report on the page",
            "const cell = document.querySelector('#task-view dd.progress'); \
             if (!cell) return null; \
             const bar = cell.querySelector('progress'); \
             return [bar && bar.value, cell.textContent, cell.querySelectorAll('b').length]",
        )
        .await;
    println!(
        "shown on the task page {:?} after the post: {shown}",
        posted.elapsed()
    );
    assert_eq!(shown[0], 40.0);
    let text = shown[1].as_str().unwrap();
    assert!(text.contains("40% <b>half</b> way"), "{text}");
    assert!(text.contains(r#""cursor":17"#), "{text}");
    assert_eq!(shown[2], 0, "the message is text, not markup");
    browser.close().await;
}
