//! A task's page in Chromium reads its task again while it is QUEUED or RUNNING, so that it
//! shows the task move on without a reload, and stops reading once the task has ended.

use std::time::Duration;

use pgtaskd::queue::{self, Outcome};

use super::browser::Browser;
use super::Served;
use crate::support::{within, TestDb, WAIT};

/// What the task's page shows: its status and whether it refreshes (`on`, `off`).
const SHOWN: &str = "const view = document.getElementById('task-view'); \
     return view.dataset.status + ' ' + view.dataset.refreshing";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_page_refreshes_while_the_task_is_queued_or_running_and_stops_once_it_ended() {
    super::chromium();
    super::browser::chromedriver();
    let db = TestDb::new().await;
    let client = db.client().await;
    // A queue the console's daemon does not serve: the test moves the task on itself.
    let id: i64 = within(
        WAIT,
        "an enqueue",
        client.query_one(
            "SELECT pgtaskd.enqueue('watch me', queue => 'watched')",
            &[],
        ),
    )
    .await
    .expect("enqueued")
    .get(0);
    let served = Served::start(&db).await;
    let browser = Browser::start(1280, 900).await;
    browser.goto(&served.console(&format!("&task={id}"))).await;
    let wait_shown = |expected: &'static str| {
        let browser = &browser;
        async move {
            browser
                .wait_for(
                    &format!("the page to show {expected}"),
                    &format!(
                        "const view = document.getElementById('task-view'); \
                         return view.dataset.status + ' ' + view.dataset.refreshing === '{expected}'"
                    ),
                )
                .await;
        }
    };
    wait_shown("QUEUED on").await;
    assert_eq!(
        browser
            .eval("return document.getElementById('task-live').hidden")
            .await,
        false
    );

    let claimed = queue::claim(
        &client,
        "tester",
        &["watched".to_string()],
        1,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);
    wait_shown("RUNNING on").await;

    queue::finish(
        &client,
        claimed[0].token,
        id,
        &Outcome::Output("done".into()),
        false,
    )
    .await
    .unwrap();
    wait_shown("SUCCEEDED off").await;
    assert_eq!(
        browser
            .eval("return document.getElementById('task-live').hidden")
            .await,
        true
    );

    // Ended: the page reads the task no more. The row changes under it (retried, QUEUED),
    // and after two refreshes of the overview (five seconds apart, longer than the task's
    // refresh) the page has not asked for the task and still shows it SUCCEEDED.
    browser
        .eval(
            "window.taskReads = 0; window.statsReads = 0; const fetched = window.fetch; \
             window.fetch = (path, ...rest) => { \
               if (String(path).startsWith('/tasks/')) window.taskReads += 1; \
               if (String(path) === '/stats') window.statsReads += 1; \
               return fetched(path, ...rest); }; return true",
        )
        .await;
    client
        .query_one("SELECT pgtaskd.retry($1)", &[&id])
        .await
        .unwrap();
    browser
        .wait_for(
            "two refreshes of the overview",
            "return window.statsReads >= 2",
        )
        .await;
    assert_eq!(browser.eval("return window.taskReads").await, 0);
    assert_eq!(browser.eval(SHOWN).await, "SUCCEEDED off");
    browser.close().await;
}
