//! The console in Chromium, clicked through chromedriver: the task list filtered and paged by
//! its cursor, a task's page (payload escaped and cut, output, error), its Retry and Cancel
//! buttons with the row checked in the database after each and a refusal shown as such, a
//! queue's "Retry failed" button,
//! the chart's y labels for a minute of 214,182 finished rows, and the page's width at 800 px
//! (with a screenshot, target/dashboard-800.png).

use std::path::Path;

use serde_json::{json, Value};
use tokio_postgres::Client;

use super::browser::Browser;
use super::Served;
use crate::support::{set_state, within, TestDb, WAIT};

/// The rows a page of the console's list holds.
const PAGE_ROWS: usize = 50;

/// The ids of the rows the list shows, in order.
const ROW_IDS: &str =
    "return Array.from(document.querySelectorAll('#task-list tbody tr[data-task]')).map(r => Number(r.dataset.task))";

/// The ids `sql` selects, in order.
async fn ids(client: &Client, sql: &str) -> Vec<i64> {
    within(WAIT, sql, client.query(sql, &[]))
        .await
        .expect("the ids are read")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// One column of the task `id`, as text.
async fn column(client: &Client, id: i64, name: &str) -> Option<String> {
    let sql = format!("SELECT {name}::text FROM pgtaskd.task_view WHERE id = $1");
    within(WAIT, "a column", client.query_one(&sql, &[&id]))
        .await
        .expect("the task is read")
        .get(0)
}

/// Wait until the list has loaded the page that starts after `after` ("first" for the first).
async fn wait_page(browser: &Browser, after: &str) -> Vec<i64> {
    browser
        .wait_for(
            &format!("the page after {after}"),
            &format!("return document.getElementById('task-list').dataset.loaded === '{after}'"),
        )
        .await;
    let shown = browser.eval(ROW_IDS).await;
    serde_json::from_value(shown).expect("ids")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_pages_opens_retries_and_cancels_tasks_in_chromium() {
    super::chromium();
    super::browser::chromedriver();
    let db = TestDb::new().await;
    let client = db.client().await;
    // mail: 120 FAILED (two-line errors) and 30 SUCCEEDED; reports: 40 FAILED; one FAILED task
    // of "pages" with a long payload full of markup, an output and an error. The tasks are
    // inserted, then their state rows (`pgtaskd.task_state`, schema 36) set.
    within(
        WAIT,
        "the tasks",
        client.batch_execute(
            "BEGIN;
             INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT 'mail', 'mail payload ' || g || ' <b>bold</b>'
               FROM generate_series(1, 120) AS g;
             UPDATE pgtaskd.task_state AS s
                SET status = 'FAILED', attempt = 3, started_at = now(), finished_at = now(),
                    error = 'boom ' || split_part(t.payload, ' ', 3) || E'\nsecond line'
               FROM pgtaskd.tasks AS t
              WHERE t.id = s.id AND t.queue = 'mail' AND t.payload LIKE 'mail payload %';
             INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT 'mail', 'sent ' || g
               FROM generate_series(1, 30) AS g;
             UPDATE pgtaskd.task_state
                SET status = 'SUCCEEDED', attempt = 1, started_at = now(), finished_at = now()
              WHERE queue = 'mail' AND status = 'QUEUED';
             INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT 'reports', 'report ' || g
               FROM generate_series(1, 40) AS g;
             UPDATE pgtaskd.task_state
                SET status = 'FAILED', attempt = 1, started_at = now(), finished_at = now(),
                    error = 'no data'
              WHERE queue = 'reports' AND status = 'QUEUED';
             COMMIT;",
        ),
    )
    .await
    .expect("the tasks are inserted");
    let payload = "<b>bold</b><script>document.title='pwned'</script>".repeat(100);
    let page_task: i64 = within(
        WAIT,
        "the task with markup",
        client.query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload, max_attempts, idempotency_key, traceparent)
             VALUES ('pages', $1, 5, 'key-1',
                     '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')
             RETURNING id",
            &[&payload],
        ),
    )
    .await
    .expect("the task is inserted")
    .get(0);
    within(
        WAIT,
        "the task with markup to fail",
        set_state(
            &client,
            page_task,
            "status = 'FAILED', attempt = 2, started_at = now() - interval '1 minute',
             finished_at = now(), error = E'<i>failed</i> at step 2\nstack'",
        ),
    )
    .await
    .expect("the task's state is set");
    let done_task: i64 = within(
        WAIT,
        "a task with an output",
        client.query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('pages', 'short') RETURNING id",
            &[],
        ),
    )
    .await
    .expect("the task is inserted")
    .get(0);
    within(
        WAIT,
        "the task with an output to succeed",
        set_state(
            &client,
            done_task,
            "status = 'SUCCEEDED', attempt = 1, started_at = now(), finished_at = now(),
             output = 'the <u>output</u>', words = 1, bytes = 5, runes = 5",
        ),
    )
    .await
    .expect("the task's state is set");
    let served = Served::start(&db).await;
    let browser = Browser::start(1280, 900).await;

    // The list of mail's FAILED tasks, filtered with the two selects: three pages by the
    // cursor (50, 50, 20), then back with "Newer".
    browser.goto(&served.console("")).await;
    browser
        .wait_for(
            "the overview",
            "return document.querySelector('#queues tr[data-queue=\"mail\"]')",
        )
        .await;
    browser.click("#nav-tasks").await;
    wait_page(&browser, "first").await;
    browser.select("#filter-queue", "mail").await;
    browser
        .wait_for(
            "the queue in the fragment",
            "return location.hash === '#tasks?queue=mail'",
        )
        .await;
    browser.select("#filter-status", "failed").await;
    browser
        .wait_for(
            "the status in the fragment",
            "return location.hash === '#tasks?queue=mail&status=failed'",
        )
        .await;
    let expected = ids(
        &client,
        "SELECT id FROM pgtaskd.task_view WHERE queue = 'mail' AND status = 'FAILED' ORDER BY id DESC",
    )
    .await;
    assert_eq!(expected.len(), 120);
    let first = wait_page(&browser, "first").await;
    assert_eq!(first, expected[..PAGE_ROWS], "the first page");
    let row = browser
        .eval("return document.querySelector('#task-list tbody tr').innerText")
        .await;
    let row = row.as_str().unwrap();
    assert!(
        row.contains("mail")
            && row.contains("FAILED")
            && row.contains("3 / 3")
            && row.contains("<b>bold</b>")
            && row.contains("boom 120 …")
            && !row.contains("second line"),
        "a row shows its queue, status, attempts, payload as text and the error's first line: {row}"
    );
    // One time format: local "YYYY-MM-DD HH:MM:SS", the UTC time as its title.
    let time = browser
        .eval("const c = document.querySelector('#task-list tbody td.time'); return [c.textContent, c.title]")
        .await;
    let text = time[0].as_str().unwrap();
    assert!(
        text.len() == 19 && text.as_bytes()[4] == b'-' && text.as_bytes()[13] == b':',
        "{time}"
    );
    assert!(time[1].as_str().unwrap().ends_with('Z'), "{time}");
    assert_eq!(
        browser
            .eval("return document.querySelector('#task-list b')")
            .await,
        Value::Null,
        "a payload's markup stays text"
    );

    browser.click("#older").await;
    let second = wait_page(&browser, &expected[PAGE_ROWS - 1].to_string()).await;
    assert_eq!(
        second,
        expected[PAGE_ROWS..2 * PAGE_ROWS],
        "the second page"
    );
    let hash = browser.eval("return location.hash").await;
    assert_eq!(
        hash,
        format!(
            "#tasks?queue=mail&status=failed&after={}",
            expected[PAGE_ROWS - 1]
        )
    );
    browser.click("#older").await;
    let third = wait_page(&browser, &expected[2 * PAGE_ROWS - 1].to_string()).await;
    assert_eq!(third, expected[2 * PAGE_ROWS..], "the last page");
    assert_eq!(
        browser
            .eval("return document.getElementById('older').disabled")
            .await,
        true,
        "no page after the last"
    );
    // A reload keeps the view and its stack of cursors.
    browser
        .eval("window.stale = true; setTimeout(() => location.reload(), 0); return null")
        .await;
    browser
        .wait_for("the reload", "return window.stale === undefined")
        .await;
    let again = wait_page(&browser, &expected[2 * PAGE_ROWS - 1].to_string()).await;
    assert_eq!(again, third, "the same page after a reload");
    browser.click("#newer").await;
    let back = wait_page(&browser, &expected[PAGE_ROWS - 1].to_string()).await;
    assert_eq!(back, second, "Newer goes back one page");
    browser.click("#newer").await;
    let back = wait_page(&browser, "first").await;
    assert_eq!(back, first, "and to the first");

    // A row opens its task's page.
    browser
        .click(&format!(
            "#task-list tr[data-task=\"{}\"] td.preview",
            expected[1]
        ))
        .await;
    browser
        .wait_for(
            "the task page",
            &format!(
                "return location.hash === '#task={}' && document.getElementById('task-title').textContent === '{}'",
                expected[1], expected[1]
            ),
        )
        .await;

    // The page of a task with markup in its payload, output and error: all text; the payload
    // cut to its first 2,000 characters and saying so.
    browser
        .goto(&served.console(&format!("&task={page_task}")))
        .await;
    browser
        .wait_for(
            "the task's page",
            &format!("return document.getElementById('task-view').dataset.status === 'FAILED' && document.getElementById('task-title').textContent === '{page_task}'"),
        )
        .await;
    let page = browser
        .eval("return document.getElementById('task').innerText")
        .await;
    let page = page.as_str().unwrap().to_string();
    for needle in [
        "pages",
        "2 / 5",
        "<i>failed</i> at step 2",
        "key-1",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "first 2,000 of 5,000 characters",
    ] {
        assert!(
            page.contains(needle),
            "no {needle:?} in the task page:\n{page}"
        );
    }
    let shown = browser
        .eval("return Array.from(document.querySelector('#task dd.payload').textContent).length")
        .await;
    assert_eq!(shown, 2001, "2,000 characters and an ellipsis");
    assert_eq!(
        browser
            .eval("return document.querySelector('#task b, #task i, #task u, #task script')")
            .await,
        Value::Null,
        "no markup of the task's became an element"
    );
    assert_eq!(browser.eval("return document.title").await, "pgtaskd");
    assert_eq!(
        browser
            .eval("return [document.getElementById('task-retry').hidden, document.getElementById('task-cancel').hidden]")
            .await,
        serde_json::json!([false, true]),
        "a FAILED task can be retried, not canceled"
    );

    // A SUCCEEDED task's output, as text; neither button.
    browser
        .goto(&served.console(&format!("&task={done_task}")))
        .await;
    browser
        .wait_for(
            "the succeeded task's page",
            "return document.getElementById('task-view').dataset.status === 'SUCCEEDED'",
        )
        .await;
    let done = browser
        .eval("return [document.getElementById('task').innerText, document.getElementById('task-retry').hidden, document.getElementById('task-cancel').hidden, document.querySelector('#task u')]")
        .await;
    let text = done[0].as_str().unwrap();
    assert!(
        text.contains("the <u>output</u>")
            && text.contains("1 / 5 / 5")
            && text.contains("all 5 characters"),
        "{text}"
    );
    assert_eq!(
        done.as_array().unwrap()[1..],
        [json!(true), json!(true), Value::Null],
        "{done}"
    );
    // In the list, its row ends with the output's start, as text.
    browser
        .eval("location.hash = 'tasks?queue=pages&status=succeeded'; return null")
        .await;
    let last = browser
        .wait_for(
            "the succeeded task's row",
            &format!(
                "const row = document.querySelector('#task-list tr[data-task=\"{done_task}\"]'); \
                 return row && document.getElementById('task-list').dataset.loaded === 'first' \
                   ? [row.lastElementChild.textContent, row.querySelector('u')] : null"
            ),
        )
        .await;
    assert_eq!(last, json!(["the <u>output</u>", null]), "{last}");

    // Retry from the page of the FAILED one: QUEUED again, as new.
    browser
        .goto(&served.console(&format!("&task={page_task}")))
        .await;
    browser
        .wait_for(
            "the failed task's page",
            "return document.getElementById('task-view').dataset.status === 'FAILED'",
        )
        .await;
    browser.click("#task-retry").await;
    browser
        .wait_for(
            "the retry's answer",
            "return document.getElementById('task-answer').textContent.includes('QUEUED (was FAILED)') && document.getElementById('task-view').dataset.status === 'QUEUED'",
        )
        .await;
    assert_eq!(
        column(&client, page_task, "status").await.as_deref(),
        Some("QUEUED")
    );
    assert_eq!(
        column(&client, page_task, "attempt").await.as_deref(),
        Some("0")
    );
    assert_eq!(column(&client, page_task, "error").await, None);
    assert_eq!(column(&client, page_task, "output").await, None);

    // Cancel from the page, after its confirmation: CANCELED.
    assert_eq!(
        browser
            .eval("return document.getElementById('task-cancel').hidden")
            .await,
        false,
        "a QUEUED task can be canceled"
    );
    browser.click("#task-cancel").await;
    browser.confirm(&format!("Cancel task {page_task}")).await;
    browser
        .wait_for(
            "the cancel's answer",
            "return document.getElementById('task-answer').textContent.includes('cancel: CANCELED') && document.getElementById('task-view').dataset.status === 'CANCELED'",
        )
        .await;
    assert_eq!(
        column(&client, page_task, "status").await.as_deref(),
        Some("CANCELED")
    );
    // A refusal is shown too: the task is retried behind the page's back, then the page's
    // Retry (still offered for the CANCELED task it shows) gets the API's 409 and says so.
    within(
        WAIT,
        "a retry elsewhere",
        client.execute("SELECT pgtaskd.retry($1)", &[&page_task]),
    )
    .await
    .expect("retried");
    browser.click("#task-retry").await;
    browser
        .wait_for(
            "the refusal",
            "return document.getElementById('task-answer').textContent === 'retry refused: task is QUEUED: only a FAILED or CANCELED task can be retried' && document.getElementById('task-view').dataset.status === 'QUEUED'",
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.getElementById('task-answer').className")
            .await,
        "bad"
    );

    // The queue's "Retry failed" button, after its confirmation: reports' 40 FAILED tasks are
    // QUEUED, mail's 120 untouched.
    browser.goto(&served.console("")).await;
    browser
        .wait_for(
            "the reports row",
            "return document.querySelector('#queues tr[data-queue=\"reports\"] button.retry-failed')",
        )
        .await;
    browser
        .click("#queues tr[data-queue=\"reports\"] button.retry-failed")
        .await;
    // Queue names are isolated (FSI ... PDI) in sentences: a right-to-left mark in one cannot
    // reorder the words around it.
    browser.confirm("queue \u{2068}reports\u{2069}").await;
    browser
        .wait_for(
            "the retry of reports' failures",
            "return document.getElementById('queue-answer').textContent === 'queue \\u2068reports\\u2069: 40 failed tasks retried'",
        )
        .await;
    let counts = ids(
        &client,
        "SELECT count(*) FILTER (WHERE queue = 'reports' AND status = 'QUEUED' AND attempt = 0)
              + 1000 * count(*) FILTER (WHERE queue = 'reports' AND status = 'FAILED')
              + 1000000 * count(*) FILTER (WHERE queue = 'mail' AND status = 'FAILED')
           FROM pgtaskd.task_view",
    )
    .await;
    assert_eq!(
        counts,
        [120_000_040],
        "40 reports QUEUED, none FAILED; mail's 120 FAILED"
    );

    // The chart's y axis for a minute of 214,182 finished rows: round ticks, "200k", never
    // a cut number such as ".4182".
    within(
        WAIT,
        "214,182 finished rows",
        client.batch_execute(
            "BEGIN;
             INSERT INTO pgtaskd.tasks (queue, payload)
             SELECT 'bulk', 'x' FROM generate_series(1, 214182);
             UPDATE pgtaskd.task_state
                SET status = 'SUCCEEDED', attempt = 1, started_at = now(), finished_at = now()
              WHERE queue = 'bulk' AND status = 'QUEUED';
             COMMIT;",
        ),
    )
    .await
    .expect("the rows are inserted");
    browser.goto(&served.console("")).await;
    let labels = browser
        .wait_for(
            "the chart's labels for 214,182",
            "const l = Array.from(document.querySelectorAll('#chart svg text.y-label')).map(t => t.textContent); return l.includes('200k') ? l : null",
        )
        .await;
    let labels: Vec<String> = serde_json::from_value(labels).unwrap();
    assert_eq!(labels, ["0", "100k", "200k", "300k"], "{labels:?}");
    // The longest label fits left of the plot.
    let fits = browser
        .eval(
            "return Array.from(document.querySelectorAll('#chart svg text.y-label')).every(t => t.getBBox().x >= 0)",
        )
        .await;
    assert_eq!(fits, true, "a y label is cut off at the left");

    // 800 px: one column, tables scrolling inside their sections, no page wider than 800.
    browser.resize(800, 1000).await;
    for (fragment, ready) in [
        (
            "",
            "return document.querySelector('#queues tr[data-queue=\"bulk\"]')",
        ),
        (
            "#tasks?queue=mail&status=failed",
            "return document.getElementById('task-list').dataset.loaded === 'first'",
        ),
        (
            &format!("#task={}", expected[0]) as &str,
            "return document.getElementById('task-view').dataset.status === 'FAILED'",
        ),
    ] {
        // The views' markers cleared first, so that only the new view's load sets them.
        browser
            .eval(&format!(
                "document.getElementById('task-list').dataset.loaded = ''; \
                 document.getElementById('task-view').dataset.status = ''; \
                 location.hash = '{fragment}'; return null"
            ))
            .await;
        browser.wait_for(fragment, ready).await;
        let widths = browser
            .eval("return [window.innerWidth, document.documentElement.scrollWidth]")
            .await;
        assert_eq!(widths[0], 800, "the viewport");
        assert!(
            widths[1].as_u64().unwrap() <= 800,
            "the page {fragment:?} is wider than 800 px: {widths}"
        );
    }
    browser.eval("location.hash = ''; return null").await;
    browser
        .wait_for(
            "the overview at 800 px",
            "return !document.querySelector('#chart').hidden && document.querySelector('#queues tr[data-queue=\"bulk\"]')",
        )
        .await;
    let columns = browser
        .eval("return getComputedStyle(document.querySelector('main')).gridTemplateColumns.split(' ').length")
        .await;
    assert_eq!(columns, 1, "one column under 900 px");
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-800.png");
    std::fs::write(&path, png).expect("the screenshot is saved");

    // A link with the token first, then the view: the view opens, and the token leaves the
    // address (it stayed there, and the overview showed).
    browser.goto(&served.console("&tasks?queue=mail")).await;
    browser
        .wait_for(
            "the task list of mail, the token out of the address",
            "return location.hash === '#tasks?queue=mail' \
               && !document.getElementById('tasks-view').hidden",
        )
        .await;

    browser.close().await;
    drop(served);
}
