//! A handler asks to run later without using an attempt (docs/handlers.md, "Snooze"): an
//! exec command exits 75 with the delay as its first line of stdout, an endpoint answers 202
//! with `Retry-After`. At most 100 snoozes; the next fails the task; a retry starts the count
//! again.

use tokio_postgres::Client;

use crate::handlers::Scratch;
use crate::support::daemon::pgtaskd;
use crate::support::{wait_count, within, DaemonProcess, TestDb, WAIT};

fn exec_config(handler: &std::path::Path) -> String {
    format!(
        "[worker]\nqueues = [\"jobs\"]\npoll_interval = \"100ms\"\n\n\
         [queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\nretry_backoff = \"1h\"\nmax_backoff = \"1h\"\n",
        handler.display()
    )
}

async fn insert(client: &Client, max_attempts: i32) -> i64 {
    within(
        WAIT,
        "an insert",
        client.query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue, max_attempts) VALUES ('x', 'jobs', $1) RETURNING id",
            &[&max_attempts],
        ),
    )
    .await
    .unwrap()
    .get(0)
}

/// (status, attempt, runs, snoozes, error) of task `id`.
async fn row(client: &Client, id: i64) -> (String, i32, i32, i32, Option<String>) {
    let row = within(
        WAIT,
        "the task",
        client.query_one(
            "SELECT status, attempt, runs, snoozes, error FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        ),
    )
    .await
    .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_handler_that_exits_75_runs_again_later_without_using_an_attempt() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // Three snoozes of 200 ms (a number of seconds, a duration, and the queue's backoff
    // would be an hour: not used), then success.
    let handler = scratch.script(
        "snooze.sh",
        "case \"$PGTASKD_RUN\" in\n\
         1) echo 0.2; exit 75 ;;\n\
         2) echo 200ms; echo 'not yet' >&2; exit 75 ;;\n\
         3) echo '0s'; exit 75 ;;\n\
         esac\n\
         echo \"done at attempt $PGTASKD_ATTEMPT run $PGTASKD_RUN\"",
    );
    let mut daemon = DaemonProcess::start(
        &db,
        &exec_config(&handler),
        &["--http-listen", "127.0.0.1:0"],
    );
    // One attempt only: a snooze that used one would fail the task.
    let id = insert(&client, 1).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the task after three snoozes",
    )
    .await;
    assert_eq!(
        row(&client, id).await,
        ("SUCCEEDED".to_string(), 1, 4, 3, None),
        "one attempt, four runs, three snoozes"
    );
    let output: String = within(
        WAIT,
        "the output",
        client.query_one("SELECT output FROM pgtaskd.task_view WHERE id = $1", &[&id]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(output, "done at attempt 1 run 4\n");
    let addr = daemon.http_addr().await;
    let metrics = within(WAIT, "GET /metrics", async {
        reqwest::get(format!("http://{addr}/metrics"))
            .await?
            .text()
            .await
    })
    .await
    .unwrap();
    assert!(
        metrics.contains("pgtaskd_handler_snoozes_total{queue=\"jobs\"} 3"),
        "{metrics}"
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_101st_snooze_fails_the_task_and_a_retry_starts_the_count_again() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let handler = scratch.script("always.sh", "echo 0\nexit 75");
    let mut daemon = DaemonProcess::start(&db, &exec_config(&handler), &[]);
    let id = insert(&client, 3).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'FAILED'"),
        1,
        "the task failed for snoozing too often",
    )
    .await;
    let (status, attempt, runs, snoozes, error) = row(&client, id).await;
    assert_eq!(
        (status.as_str(), attempt, runs, snoozes),
        ("FAILED", 1, 101, 100)
    );
    assert!(
        error
            .as_deref()
            .unwrap_or("")
            .contains("more than 100 times"),
        "{error:?}"
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    // The task's one "task failed" line says why, as the row does.
    let log = daemon.log_text();
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("task failed")).collect();
    assert!(
        failed.len() == 1 && failed[0].contains("more than 100 times"),
        "{failed:?}"
    );

    let (code, _, stderr) = pgtaskd(Some(&db.url), &["retry", &id.to_string()]).await;
    assert!(code.success(), "{stderr}");
    let (status, attempt, _, snoozes, _) = row(&client, id).await;
    assert_eq!((status.as_str(), attempt, snoozes), ("QUEUED", 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_answering_202_with_retry_after_snoozes_the_task() {
    use crate::handler_http::server::{respond, TestServer};
    let db = TestDb::new().await;
    let client = db.client().await;
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&calls);
    let server = TestServer::start(move |_| {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            match n {
                0 | 1 => respond(202, &[("retry-after", "0")], "not yet"),
                // A 202 without Retry-After is a success, as before.
                _ => respond(202, &[], "accepted and done"),
            }
        }
    })
    .await;
    let config = format!(
        "[worker]\nqueues = [\"jobs\"]\npoll_interval = \"100ms\"\n\n\
         [queues.jobs]\nhandler = \"http\"\nurl = \"{}\"\nretry_backoff = \"1h\"\n",
        server.url("/")
    );
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    let id = insert(&client, 1).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the task after two snoozes",
    )
    .await;
    assert_eq!(
        row(&client, id).await,
        ("SUCCEEDED".to_string(), 1, 3, 2, None)
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}
