//! The console's tag and metadata filters in Chromium: what is typed goes into the fragment
//! and `GET /tasks?tag=&meta=`, the list shows exactly the tasks with every term, and a
//! task's page shows its tags, each a link to the tasks that have it, and its metadata.

use tokio_postgres::Client;

use super::browser::Browser;
use super::Served;
use crate::support::{within, TestDb, WAIT};

const ROW_IDS: &str =
    "return Array.from(document.querySelectorAll('#task-list tbody tr[data-task]')).map(r => Number(r.dataset.task))";

async fn ids(client: &Client, sql: &str) -> Vec<i64> {
    within(WAIT, sql, client.query(sql, &[]))
        .await
        .expect("the ids are read")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Type `text` into the input `id` and leave it (what fires "change").
async fn type_into(browser: &Browser, id: &str, text: &str) {
    browser
        .eval(&format!(
            "const input = document.getElementById('{id}'); input.value = {text:?}; \
             input.dispatchEvent(new Event('change')); return true"
        ))
        .await;
}

/// The ids the list shows once the page for `hash` has loaded.
async fn shown(browser: &Browser, hash: &str) -> Vec<i64> {
    browser
        .wait_for(
            &format!("the list of {hash}"),
            &format!(
                "return location.hash === '{hash}' && \
                 document.getElementById('task-list').dataset.loaded === 'first' && \
                 document.getElementById('task-list').dataset.shows === '{hash}'"
            ),
        )
        .await;
    serde_json::from_value(browser.eval(ROW_IDS).await).expect("ids")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_filters_the_list_by_tags_and_metadata_and_shows_them_on_a_task() {
    super::chromium();
    super::browser::chromedriver();
    let db = TestDb::new().await;
    let client = db.client().await;
    within(
        WAIT,
        "the tasks",
        client.batch_execute(
            "INSERT INTO pgtaskd.tasks (queue, payload, tags, metadata)
             SELECT 'mail', 'task ' || g,
                    CASE WHEN g % 3 = 0 THEN ARRAY['rare', 'env:prod']
                         WHEN g % 3 = 1 THEN ARRAY['env:prod'] END,
                    CASE WHEN g % 2 = 0 THEN '{\"owner\": \"ann\", \"n\": 7}'::jsonb END
               FROM generate_series(1, 90) AS g;",
        ),
    )
    .await
    .expect("the tasks are inserted");
    let served = Served::start(&db).await;
    let browser = Browser::start(1280, 900).await;
    browser.goto(&served.console("&tasks")).await;
    shown(&browser, "#tasks").await;

    type_into(&browser, "filter-tag", "rare, env:prod").await;
    let expected = ids(
        &client,
        "SELECT id FROM pgtaskd.task_view WHERE tags @> '{rare,env:prod}' ORDER BY id DESC",
    )
    .await;
    assert_eq!(expected.len(), 30);
    assert_eq!(
        shown(&browser, "#tasks?tag=rare&tag=env%3Aprod").await,
        expected
    );
    type_into(&browser, "filter-meta", "owner:ann").await;
    let expected = ids(
        &client,
        "SELECT id FROM pgtaskd.task_view WHERE tags @> '{rare,env:prod}' \
         AND metadata @> '{\"owner\": \"ann\"}' ORDER BY id DESC",
    )
    .await;
    assert_eq!(expected.len(), 15);
    assert_eq!(
        shown(&browser, "#tasks?tag=rare&tag=env%3Aprod&meta=owner%3Aann").await,
        expected
    );
    let said = browser
        .eval("return document.getElementById('list-where').textContent")
        .await;
    assert_eq!(
        said.as_str().unwrap(),
        "every queue, any status, tagged rare and env:prod, with owner:ann, newest first"
    );

    // A task's page: its tags, each a link to its list, and its metadata.
    let id = expected[0];
    browser.goto(&served.console(&format!("&task={id}"))).await;
    let tags = browser
        .wait_for(
            "the task's tags",
            "const d = document.querySelector('#task dd.tags'); \
             return d && Array.from(d.querySelectorAll('a')).map(a => [a.textContent, a.getAttribute('href')])",
        )
        .await;
    assert_eq!(
        tags,
        serde_json::json!([
            ["rare", "#tasks?tag=rare"],
            ["env:prod", "#tasks?tag=env%3Aprod"]
        ])
    );
    let metadata = browser
        .eval("return document.querySelector('#task dd.metadata').textContent")
        .await;
    assert_eq!(metadata.as_str().unwrap(), r#"{"n":7,"owner":"ann"}"#);
    browser.click("#task dd.tags a").await;
    let all_rare = ids(
        &client,
        "SELECT id FROM pgtaskd.task_view WHERE tags @> '{rare}' ORDER BY id DESC LIMIT 50",
    )
    .await;
    assert_eq!(shown(&browser, "#tasks?tag=rare").await, all_rare);
    browser.close().await;
}
