//! The dashboard (`GET /ui`) in a real browser: headless Chromium (Debian's `chromium`)
//! against a daemon process with tasks in three queues. The page must show the queues and
//! their counts, the latest failure's error as text (a `<script>` or `<b>` in it stays text),
//! a task's payload as text on its page; a second run saves the README's screenshot.
//!
//! The console's clicks need a driver (`--dump-dom` cannot click): `browser` drives Chromium
//! through chromedriver. `console` pages the task list, opens a task, retries and cancels it,
//! reads the chart's labels and the page's width at 800 px; `retry_failed` tests `POST
//! /queues/{queue}/retry-failed`, its SQL function and its CLI form; `million` pages the list
//! of a table of 1,000,000 finished rows; `task_refresh` watches a task's page follow its task
//! from QUEUED to SUCCEEDED and stop reading it then; `tags` filters the list by tags and
//! metadata and reads them on a task's page.

mod browser;
mod console;
mod million;
mod progress;
mod retry_failed;
mod tags;
mod task_refresh;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

use crate::support::daemon::tempfile_path::TempPath;
use crate::support::{free_port, within, DaemonProcess, TestDb, WAIT};

pub const TOKEN: &str = "ui-test-token";
const ERROR: &str = "<script>document.title='pwned'</script>parse error near <b>x</b>";
const PAYLOAD: &str = "<script>document.title='pwned'</script>hello <i>world</i>";

/// The `chromium` command, or a failure saying how to install it.
pub fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromium"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "the dashboard test needs Debian's chromium: install it with \
             `apt-get install -y chromium` (.ci/run does)"
        )
    })
}

/// Run headless Chromium on `url` with `extra` arguments; its standard output.
pub(crate) async fn browse(url: &str, extra: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!(
        "pgtaskd-test-chromium-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let mut command = tokio::process::Command::new(chromium());
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--virtual-time-budget=5000")
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = within(WAIT, "chromium", command.output())
        .await
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The text of the `<tr data-queue="NAME">` row in `dom`.
pub(crate) fn queue_row<'a>(dom: &'a str, name: &str) -> &'a str {
    let start = dom
        .find(&format!("<tr data-queue=\"{name}\">"))
        .unwrap_or_else(|| panic!("no row of queue {name} in\n{dom}"));
    let end = dom[start..].find("</tr>").expect("the row ends") + start;
    &dom[start..end]
}

/// A daemon process with its HTTP server on a free port and the token [`TOKEN`], claiming
/// from the queue "elsewhere" only, so that the tests' tasks hold still.
pub struct Served {
    /// Held: the process is stopped when this is dropped.
    _daemon: DaemonProcess,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    _token: TempPath,
}

impl Served {
    /// Start it on `db` and wait until it listens.
    pub async fn start(db: &TestDb) -> Served {
        let token = TempPath::write(TOKEN);
        let port = free_port();
        let mut daemon = DaemonProcess::start(
            db,
            &format!(
                "[http]\nlisten = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n\
                 [worker]\nqueues = [\"elsewhere\"]\n",
                token.path().display()
            ),
            &[],
        );
        daemon.wait_for_log("HTTP server listening").await;
        Served {
            _daemon: daemon,
            base: format!("http://127.0.0.1:{port}"),
            _token: token,
        }
    }

    /// The console's address with the token in the fragment, then `fragment` (`&task=7`).
    pub fn console(&self, fragment: &str) -> String {
        format!("{}/ui#token={TOKEN}{fragment}", self.base)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_queues_and_failures_as_text_in_a_real_browser() {
    // Before anything else: without the browser the test fails here, saying how to get it.
    chromium();
    let db = TestDb::new().await;
    let client = db.client().await;
    // Three queues the daemon does not serve (it claims from "elsewhere" only), so their
    // figures hold still: mail has 3 QUEUED (unserved); reports 2 SUCCEEDED and 1 FAILED in the last
    // minute; thumbnails 1 QUEUED, paused.
    let statements = format!(
        "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('mail', 'a'), ('mail', 'b'), ('mail', 'c'), ('thumbnails', 'd');
         BEGIN;
         INSERT INTO pgtaskd.tasks (queue, payload)
              VALUES ('reports', 'e'), ('reports', 'f'), ('reports', 'g');
         UPDATE pgtaskd.task_state AS s
            SET status = CASE t.payload WHEN 'g' THEN 'FAILED' ELSE 'SUCCEEDED' END,
                attempt = 1, started_at = now(), finished_at = now(),
                error = CASE t.payload WHEN 'g' THEN '{}' END
           FROM pgtaskd.tasks AS t
          WHERE t.id = s.id AND t.queue = 'reports';
         COMMIT;
         SELECT pgtaskd.pause_queue('thumbnails');
         SELECT pgtaskd.put_schedule('nightly', '30 2 * * *', NULL, 'x', 'reports', 'Europe/Berlin');
         INSERT INTO pgtaskd.schedules (name, cron, payload) VALUES ('broken', '<b>x</b>', 'y');",
        ERROR.replace('\'', "''")
    );
    within(WAIT, "the tasks", client.batch_execute(&statements))
        .await
        .expect("the tasks are inserted");
    let looked_up: i64 = within(
        WAIT,
        "a task with markup",
        client.query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('mail', $1) RETURNING id",
            &[&PAYLOAD],
        ),
    )
    .await
    .unwrap()
    .get(0);

    let served = Served::start(&db).await;
    let base = served.base.clone();

    // The page is served without the token; its data is not.
    let http = reqwest::Client::new();
    let page = within(WAIT, "GET /ui", http.get(format!("{base}/ui")).send())
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let stats = within(WAIT, "GET /stats", http.get(format!("{base}/stats")).send())
        .await
        .unwrap();
    assert_eq!(stats.status().as_u16(), 401);

    // The JSON the page reads.
    let get = |path: &str| {
        let request = http.get(format!("{base}{path}")).bearer_auth(TOKEN).send();
        async move {
            let response = within(WAIT, "an HTTP response", request).await.unwrap();
            let status = response.status().as_u16();
            let body: Value = within(WAIT, "an HTTP body", response.json()).await.unwrap();
            (status, body)
        }
    };
    let (status, body) = get("/tasks?queue=mail&status=QUEUED&limit=2").await;
    assert_eq!(status, 200, "{body}");
    let tasks = &body["tasks"];
    assert_eq!(tasks.as_array().map(Vec::len), Some(2), "{body}");
    assert_eq!(tasks[0]["id"], looked_up, "newest first: {body}");
    assert!(tasks[0].get("payload").is_none(), "no payloads: {body}");
    for bad in [
        "/tasks?limit=0",
        "/tasks?limit=x",
        "/tasks?status=done",
        "/tasks?queue=",
    ] {
        let (status, body) = get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, body) = get("/stats/throughput").await;
    assert_eq!(status, 200, "{body}");
    let minutes = body.as_array().expect("an array");
    assert_eq!(minutes.len(), 15, "{body}");
    let finished: i64 = minutes
        .iter()
        .map(|m| m["succeeded"].as_i64().unwrap() + m["failed"].as_i64().unwrap())
        .sum();
    assert_eq!(finished, 3, "{body}");
    let (status, body) = get("/stats").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["queues"].as_array().map(Vec::len), Some(3), "{body}");

    let url = format!("{base}/ui#token={TOKEN}&task={looked_up}");
    let dom = browse(&url, &["--dump-dom"]).await;

    let mail = queue_row(&dom, "mail");
    // Due tasks, and no daemon serves mail: "unserved", in the warning colour.
    assert!(
        mail.contains("<td class=\"unserved\"")
            && mail.contains(">unserved<")
            && mail.contains("<td class=\"n\">4</td>"),
        "{mail}"
    );
    let thumbnails = queue_row(&dom, "thumbnails");
    assert!(
        thumbnails.contains(">paused<") && thumbnails.contains(">Resume<"),
        "{thumbnails}"
    );
    let reports = queue_row(&dom, "reports");
    assert!(reports.contains(">2 / 1 / 0<"), "{reports}");
    // The error and the payload are text: escaped in the DOM, never elements.
    assert!(
        dom.contains("parse error near &lt;b&gt;x&lt;/b&gt;"),
        "the failure's error is not shown as text:\n{dom}"
    );
    assert!(
        dom.contains(
            "&lt;script&gt;document.title='pwned'&lt;/script&gt;hello &lt;i&gt;world&lt;/i&gt;"
        ),
        "the task's payload is not shown as text:\n{dom}"
    );
    assert!(
        !dom.contains("<b>x</b>") && !dom.contains("<i>world</i>"),
        "{dom}"
    );
    assert!(
        dom.contains("<title>pgtaskd</title>"),
        "a script ran: {dom}"
    );
    assert!(dom.contains("<svg"), "no throughput chart:\n{dom}");
    // The schedules, a rule the daemons cannot read shown as text.
    let nightly = &dom[dom
        .find("data-schedule=\"nightly\"")
        .expect("the nightly schedule's row")..];
    let nightly = &nightly[..nightly.find("</tr>").unwrap()];
    assert!(
        nightly.contains("cron 30 2 * * * (Europe/Berlin)") && nightly.contains("coalesce"),
        "{nightly}"
    );
    let broken = &dom[dom
        .find("data-schedule=\"broken\"")
        .expect("the broken schedule's row")..];
    let broken = &broken[..broken.find("</tr>").unwrap()];
    assert!(
        broken.contains("invalid cron expression") && broken.contains("&lt;b&gt;x&lt;/b&gt;"),
        "{broken}"
    );
    assert!(
        dom.contains("<span id=\"status\">updated "),
        "the token was not taken:\n{dom}"
    );

    // Saved under target/, so that a test run leaves the tree as it was; docs/dashboard.png is
    // a copy of it.
    let screenshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard.png");
    browse(
        &served.console(""),
        &[
            &format!("--screenshot={}", screenshot.display()),
            "--window-size=1280,900",
        ],
    )
    .await;
    let png = std::fs::read(&screenshot).expect("the screenshot is saved");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    drop(served);
}
