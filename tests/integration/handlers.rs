//! A queue's own work, run by real daemons (docs/design.md, "Handlers"): an `exec` handler's
//! answer becomes the task's output, failed attempts come back after a backoff until
//! `max_attempts`, a cancel or a daemon's SIGKILL stops the child, slow slots do not hold
//! claims they cannot start, and an unknown commit outcome never runs a command twice.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_postgres::Client;

use crate::support::daemon::pgtaskd;
use crate::support::proxy::{Fault, Proxy};
use crate::support::{
    count, eventually, server_addr, server_user, wait_count, DaemonProcess, GatedAnalyzer,
    InProcessDaemon, TestDb, WAIT,
};

/// A directory of the test's own: handler scripts and what they leave behind.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "pgtaskd-handlers-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        // Scripts run as the daemon's user, which may not be root's.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        Scratch(dir)
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// An executable `sh` script named `name`.
    pub(crate) fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// The process ids the handlers wrote to file `name`, once there are `n`.
    pub(crate) async fn pids(&self, name: &str, n: usize) -> Vec<i32> {
        eventually(WAIT, &format!("{n} children to start"), || async move {
            let pids = self.lines(name);
            (pids.len() >= n).then(|| pids.iter().map(|p| p.parse().unwrap()).collect())
        })
        .await
    }

    /// Lines of file `name`, none when it does not exist yet.
    pub(crate) fn lines(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(name))
            .map(|text| text.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The configuration of a daemon serving `default` (text-stats) and `jobs`, run by `section`.
fn config_with(section: &str) -> String {
    format!(
        "[worker]\nqueues = [\"default\", \"jobs\"]\npoll_interval = \"200ms\"\n\n[queues.jobs]\n{section}\n"
    )
}

/// [`config_with`] for an `exec` handler running `handler`, with the section's `extra` keys.
fn exec_config(handler: &Path, extra: &str) -> String {
    config_with(&format!(
        "handler = \"exec\"\ncommand = [\"{}\"]\n{extra}",
        handler.display()
    ))
}

/// The daemon's `/metrics` text.
async fn metrics(addr: &str) -> String {
    let response = crate::support::within(
        WAIT,
        "GET /metrics",
        reqwest::get(format!("http://{addr}/metrics")),
    )
    .await
    .expect("GET /metrics answers");
    crate::support::within(WAIT, "the /metrics body", response.text())
        .await
        .expect("the /metrics body is read")
}

async fn enqueue(client: &Client, payload: &str, max_attempts: i32) -> i64 {
    client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload, max_attempts, traceparent)
             VALUES ('jobs', $1, $2, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')
             RETURNING id",
            &[&payload, &max_attempts],
        )
        .await
        .unwrap()
        .get(0)
}

async fn wait_status(client: &Client, id: i64, status: &str) {
    wait_count(
        client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = '{status}'"),
        1,
        &format!("task {id} to be {status}"),
    )
    .await;
}

pub(crate) fn alive(pid: i32) -> bool {
    // A zombie waiting for its new parent to reap it is gone as far as work goes.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// A command that records its pid in the file `started` of `scratch`, then sleeps for ever.
fn slow_handler(scratch: &Scratch) -> PathBuf {
    let started = scratch.path("started");
    scratch.script(
        "slow.sh",
        &format!("echo $$ >> {}\nexec sleep 1000", started.display()),
    )
}

async fn wait_file(path: &Path) -> String {
    eventually(
        WAIT,
        &format!("{} to be written", path.display()),
        || async {
            std::fs::read_to_string(path)
                .ok()
                .filter(|text| text.ends_with('\n'))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_handler_gets_the_payload_and_the_task_and_its_stdout_becomes_the_output() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let handler = scratch.script(
        "upper.sh",
        "printf 'id=%s attempt=%s queue=%s claim=%s trace=%s pw=%s url=%s\\n' \
         \"$PGTASKD_TASK_ID\" \"$PGTASKD_ATTEMPT\" \"$PGTASKD_QUEUE\" \"$PGTASKD_CLAIM\" \
         \"${TRACEPARENT-none}\" \"${PGPASSWORD-unset}\" \"${PGTASKD_DATABASE_URL-unset}\"\n\
         tr a-z A-Z",
    );
    let config = exec_config(&handler, "");
    let mut daemon =
        DaemonProcess::start_with_env(&db.url, &config, &[], &[("PGPASSWORD", "secret-pw")]);
    daemon.wait_for_log("listening for notifications").await;

    let id = enqueue(&client, "hello, handler", 3).await;
    let text_stats: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('two words') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    wait_status(&client, id, "SUCCEEDED").await;
    wait_status(&client, text_stats, "SUCCEEDED").await;
    let row = client
        .query_one(
            "SELECT output, claim_token, words, error FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let token: i64 = row.get(1);
    assert_eq!(
        row.get::<_, Option<String>>(0).as_deref(),
        Some(
            format!(
                "id={id} attempt=1 queue=jobs claim={token} \
                 trace=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01 pw=unset url=unset\n\
                 HELLO, HANDLER"
            )
            .as_str()
        ),
        "stdout is the output; the daemon's secrets are not in the handler's environment"
    );
    assert_eq!(row.get::<_, i64>(2), 0, "a handler's task has no counts");
    assert_eq!(row.get::<_, Option<String>>(3), None);
    // The default queue still runs the text analyzer.
    let words: i64 = client
        .query_one(
            "SELECT words FROM pgtaskd.task_view WHERE id = $1",
            &[&text_stats],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(words, 2);
    // `status` shows the output.
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["status", &id.to_string()]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("output: id="), "{stdout}");
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_fails_every_time_comes_back_after_its_backoff_then_ends_failed() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let runs = scratch.path("runs");
    let handler = scratch.script(
        "fail.sh",
        &format!(
            "echo \"$PGTASKD_ATTEMPT $PGTASKD_CLAIM $PGTASKD_RUN $PGTASKD_TASK_KEY\" >> {}\necho \"disk full on attempt $PGTASKD_ATTEMPT\" >&2\nexit 3",
            runs.display()
        ),
    );
    let config = format!(
        "[http]\nlisten = \"127.0.0.1:0\"\n{}",
        exec_config(
            &handler,
            "retry_backoff = \"20ms\"\nmax_backoff = \"100ms\"\n",
        )
    );
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("HTTP server listening").await;

    let id = enqueue(&client, "x", 3).await;
    wait_status(&client, id, "FAILED").await;
    // Two attempts queued again, one failure: retries are neither finishes nor releases.
    let addr = daemon.http_addr().await;
    let metrics = metrics(&addr).await;
    for line in [
        "pgtaskd_handler_retries_total{queue=\"jobs\"} 2",
        "pgtaskd_tasks_released_total 0",
        "pgtaskd_tasks_finished_total{status=\"FAILED\"} 1",
    ] {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
    let row = client
        .query_one(
            "SELECT attempt, error FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i32>(0),
        3,
        "max_attempts counts the failed attempts"
    );
    let error: String = row.get(1);
    assert!(error.contains("disk full on attempt 3"), "{error}");
    assert!(error.contains('3'), "the exit status is kept: {error}");
    let runs = scratch.lines("runs");
    assert_eq!(runs.len(), 3, "one run per attempt: {runs:?}");
    let tokens: std::collections::HashSet<&str> =
        runs.iter().filter_map(|l| l.split(' ').nth(1)).collect();
    assert_eq!(
        tokens.len(),
        3,
        "each attempt is a claim of its own: {runs:?}"
    );
    // One key for the whole task, the view's; a run number that grows.
    let key: String = client
        .query_one(
            "SELECT task_key FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    let told: Vec<(&str, &str)> = runs
        .iter()
        .map(|l| {
            let words: Vec<&str> = l.split(' ').collect();
            (words[2], words[3])
        })
        .collect();
    assert_eq!(
        told,
        [
            ("1", key.as_str()),
            ("2", key.as_str()),
            ("3", key.as_str())
        ],
        "{runs:?}"
    );
    // Every failed attempt's error is kept, in the view, `status` and GET /tasks/{id}.
    let history: Vec<(i32, i32, String)> = client
        .query(
            "SELECT (e->>'attempt')::int, (e->>'run')::int, e->>'error' \
               FROM pgtaskd.task_view, jsonb_array_elements(errors) AS e WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(history.len(), 3, "{history:?}");
    for (n, (attempt, run, error)) in history.iter().enumerate() {
        let n = n as i32 + 1;
        assert_eq!((*attempt, *run), (n, n), "{history:?}");
        assert!(
            error.contains(&format!("disk full on attempt {n}")),
            "{error}"
        );
    }
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["status", &id.to_string()]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("failed attempts (3):"), "{stdout}");
    assert!(stdout.contains(&format!("key: {key}  runs: 3")), "{stdout}");
    let answer: serde_json::Value = crate::support::within(WAIT, "GET /tasks/{id}", async {
        reqwest::get(format!("http://{addr}/tasks/{id}"))
            .await?
            .json()
            .await
    })
    .await
    .unwrap();
    assert_eq!(
        answer["errors"].as_array().map(Vec::len),
        Some(3),
        "{answer}"
    );
    assert_eq!(answer["task_key"], key.as_str());
    assert_eq!(answer["runs"], 3);

    // The summary at the stop says the same.
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(
        log.contains("released=0") && log.contains("attempts_failed_to_retry=2"),
        "{log}"
    );

    // Exit 65 (EX_DATAERR) is not worth another attempt.
    let refused = scratch.script("refuse.sh", "echo 'bad input' >&2\nexit 65");
    let config = exec_config(&refused, "retry_backoff = \"20ms\"\n");
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("listening for notifications").await;
    let id = enqueue(&client, "y", 3).await;
    wait_status(&client, id, "FAILED").await;
    let attempt: i32 = client
        .query_one(
            "SELECT attempt FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempt, 1, "exit 65 fails at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ends_failed_gets_one_info_line_with_its_queue_attempts_and_error() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let long = "e".repeat(300);
    let handler = scratch.script(
        "fail.sh",
        &format!("echo 'disk full: {long}' >&2\necho 'the second line' >&2\nexit 3"),
    );
    let config = exec_config(
        &handler,
        "retry_backoff = \"20ms\"\nmax_backoff = \"100ms\"\n",
    );
    let mut daemon =
        DaemonProcess::start_with_env(&db.url, &config, &[], &[("RUST_LOG", "pgtaskd=info")]);
    daemon.wait_for_log("listening for notifications").await;
    let succeeding: i64 = client
        .query_one("SELECT pgtaskd.enqueue('three small words')", &[])
        .await
        .unwrap()
        .get(0);
    let id = enqueue(&client, "x", 2).await;
    wait_status(&client, id, "FAILED").await;
    wait_status(&client, succeeding, "SUCCEEDED").await;
    daemon.wait_for_log("task failed").await;
    daemon.stop_cleanly().await;

    let log = daemon.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("task failed")).collect();
    assert_eq!(
        lines.len(),
        1,
        "one line, for the end, none for the retried attempt:\n{log}"
    );
    let line = lines[0];
    assert!(line.contains(" INFO "), "{line}");
    for field in [format!("id={id}"), "queue=jobs".into(), "attempts=2".into()] {
        assert!(line.contains(&field), "{field}: {line}");
    }
    assert!(
        line.contains("exited with status 3; stderr: disk full: eee"),
        "the error's first line: {line}"
    );
    assert!(line.contains("e..."), "cut: {line}");
    assert!(!line.contains(&long), "cut: {line}");
    assert!(!line.contains("the second line"), "{line}");
    assert!(line.len() < 400, "{} bytes: {line}", line.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_waiting_for_its_retry_shows_its_error_and_its_run_at() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let handler = scratch.script("fail.sh", "echo 'try later' >&2\nexit 1");
    // A backoff far longer than the test: the task waits QUEUED with its error.
    let config = exec_config(&handler, "retry_backoff = \"1h\"\nmax_backoff = \"1h\"\n");
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("listening for notifications").await;
    let id = enqueue(&client, "z", 3).await;
    wait_count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'QUEUED' AND attempt = 1"
        ),
        1,
        "the first attempt to fail and be put back",
    )
    .await;
    let row = client
        .query_one(
            "SELECT error, run_at > started_at, finished_at IS NULL, lease_owner IS NULL \
               FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert!(row.get::<_, String>(0).contains("try later"));
    assert!(row.get::<_, bool>(1), "run_at is pushed back");
    assert!(row.get::<_, bool>(2) && row.get::<_, bool>(3));
    let (_, stdout, _) = pgtaskd(Some(&db.url), &["status", &id.to_string()]).await;
    assert!(stdout.contains("last attempt's error: "), "{stdout}");
    assert!(stdout.contains("run at: "), "{stdout}");
    // A cancel of the waiting task clears its error.
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["cancel", &id.to_string()]).await;
    assert!(status.success(), "{stderr}");
    let error: Option<String> = client
        .query_one("SELECT error FROM pgtaskd.task_view WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(error, None);
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success());
}

/// `pgtaskd list` shows what a handler's task came to: the output's size and its first
/// characters, escaped (an analyzer's task still shows its counts); a failure's first and last
/// lines in about 200 characters, where `status` shows the whole stderr tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_an_outputs_size_and_preview_and_a_short_error() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // Exit 65: fails at once, whatever attempts are left.
    let handler = scratch.script(
        "json.sh",
        "read -r payload\n\
         if [ \"$payload\" = fail ]; then\n\
           i=0; while [ $i -lt 200 ]; do echo \"convert: warning $i about something long\" >&2; i=$((i+1)); done\n\
           echo 'no such file: x.png' >&2; exit 65\n\
         fi\n\
         printf '{\"ok\":true,\"payload\":\"%s\"}\\n' \"$payload\"",
    );
    let mut daemon = DaemonProcess::start(&db, &exec_config(&handler, ""), &[]);
    daemon.wait_for_log("listening for notifications").await;
    let good = enqueue(&client, "hello", 1).await;
    let bad = enqueue(&client, "fail", 1).await;
    let counted: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('three little words') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    wait_status(&client, good, "SUCCEEDED").await;
    wait_status(&client, bad, "FAILED").await;
    wait_status(&client, counted, "SUCCEEDED").await;

    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["list"]).await;
    assert!(status.success(), "{stderr}");
    let line = |id: i64| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no line for task {id}:\n{stdout}"))
            .to_string()
    };
    assert!(
        line(good).ends_with(r#"output 30 bytes "{\"ok\":true,\"payload\":\"hello\"}\n""#),
        "{stdout}"
    );
    assert!(
        line(counted).ends_with("words=3 bytes=18 runes=18"),
        "{stdout}"
    );
    let failed = line(bad);
    assert!(
        failed.chars().count() < 300,
        "{} characters: {failed}",
        failed.chars().count()
    );
    assert!(failed.contains("exited with status 65"), "{failed}");
    assert!(failed.ends_with(" ... no such file: x.png"), "{failed}");
    let (_, whole, _) = pgtaskd(Some(&db.url), &["status", &bad.to_string()]).await;
    assert!(
        whole.contains("warning 150 about"),
        "status shows the whole error:\n{whole}"
    );

    let (_, json, _) = pgtaskd(Some(&db.url), &["list", "--json"]).await;
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let row = |id: i64| rows.iter().find(|r| r["id"] == id).expect("listed").clone();
    assert_eq!(row(good)["output_bytes"], 30);
    assert_eq!(
        row(good)["output_preview"],
        "{\"ok\":true,\"payload\":\"hello\"}\n"
    );
    assert_eq!(row(counted)["output_bytes"], serde_json::Value::Null);
    assert_eq!(row(counted)["output_preview"], serde_json::Value::Null);
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_child_that_ignores_sigterm_and_the_task_ends_canceled() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let pidfile = scratch.path("pid");
    let handler = scratch.script(
        "stubborn.sh",
        &format!(
            "trap '' TERM\necho $$ > {}.tmp && mv {0}.tmp {0}\nwhile :; do sleep 0.05; done",
            pidfile.display()
        ),
    );
    let config = exec_config(&handler, "kill_after = \"1s\"\n");
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("listening for notifications").await;
    let id = enqueue(&client, "z", 3).await;
    let pid: i32 = wait_file(&pidfile).await.trim().parse().unwrap();
    assert!(alive(pid));
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["cancel", &id.to_string()]).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stdout,
        "RUNNING (cancel requested; it becomes CANCELED once its handler returns)\n"
    );
    wait_status(&client, id, "CANCELED").await;
    assert!(!alive(pid), "the child is gone before the task is CANCELED");
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success());
    // A command is not the analyzer: the log speaks of its handler.
    let log = daemon.log_text();
    assert!(log.contains("stopping its handler"), "{log}");
    assert!(
        !log.lines().any(|l| l.contains("analyzer")),
        "an exec queue's log speaks of an analyzer:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_slots_hold_few_claims_and_a_sigkill_of_the_daemon_kills_its_children() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let handler = slow_handler(&scratch);
    let config = exec_config(&handler, "concurrency = 2\n");
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT 'jobs', 'slow ' || g FROM generate_series(1, 500) g",
            &[],
        )
        .await
        .unwrap();
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    let pids = scratch.pids("started", 2).await;
    // Let the lane claim what it will while its two slots are busy: a few more scans.
    daemon.wait_for_log("queue served by its own lane").await;
    for _ in 0..3 {
        client.execute("NOTIFY pgtaskd_tasks", &[]).await.unwrap();
    }
    let held = count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'jobs' AND status = 'RUNNING'",
    )
    .await;
    assert!(
        held <= 4,
        "a daemon with 2 slow slots holds {held} claims (at most its slots and a few)"
    );
    daemon.signal(libc::SIGKILL);
    daemon.wait().await;
    eventually(
        Duration::from_secs(10),
        "the children to die with the daemon",
        || {
            let pids = &pids;
            async move { pids.iter().all(|pid| !alive(*pid)).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_committed_but_unanswered_never_runs_the_command_again() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let runs = scratch.path("runs");
    let handler = scratch.script(
        "count.sh",
        &format!("echo \"$PGTASKD_TASK_ID\" >> {}\necho done", runs.display()),
    );
    let proxy = Proxy::start(server_addr(), Fault::DropAfterReply, "FROM pgtaskd.finish(").await;
    let mut config = db.config(&format!(
        "[database]\nstatement_timeout = \"1s\"\n[worker]\nqueues = [\"jobs\"]\nconcurrency = 8\npoll_interval = \"500ms\"\n\
         [queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\n",
        handler.display()
    ));
    config.database.url = Some(proxy.conninfo(&server_user(), &db.name));
    let daemon = InProcessDaemon::start(&db, config, GatedAnalyzer::counting()).await;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT 'jobs', 'n' || g FROM generate_series(1, 20) g",
            &[],
        )
        .await
        .unwrap();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED' AND output = 'done\n'",
        20,
        "every task to succeed",
    )
    .await;
    daemon.stop().await;
    assert!(proxy.triggered(), "a finish's answer was swallowed");
    let mut ran = scratch.lines("runs");
    ran.sort();
    let before = ran.len();
    ran.dedup();
    assert_eq!(before, 20, "the command ran once per task: {ran:?}");
    assert_eq!(ran.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_handler_answers_become_output_retry_after_is_honoured_and_404_fails_at_once() {
    use crate::handler_http::server::{respond, TestServer};
    let db = TestDb::new().await;
    let client = db.client().await;
    // "later": 503 with Retry-After: 1 the first time, then 200; "gone": 404; else 200 with
    // the body upper-cased.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&calls);
    let mut server = TestServer::start(move |seen| {
        let body = String::from_utf8_lossy(&seen.body).to_string();
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            match body.as_str() {
                "later" if n == 0 => respond(503, &[("retry-after", "1")], "busy"),
                "gone" => respond(404, &[], "no such thing"),
                _ => respond(200, &[], body.to_uppercase()),
            }
        }
    })
    .await;
    let config = config_with(&format!(
        "handler = \"http\"\nurl = \"{}\"\nretry_backoff = \"1h\"\nmax_backoff = \"1h\"\n",
        server.url("/jobs")
    ));
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("listening for notifications").await;

    let later = enqueue(&client, "later", 3).await;
    wait_status(&client, later, "SUCCEEDED").await;
    let first = server.next_request().await;
    assert_eq!(first.path, "/jobs");
    let second = server.next_request().await;
    let row = client
        .query_one(
            "SELECT output, attempt, claim_token, started_at - created_at FROM pgtaskd.task_view WHERE id = $1",
            &[&later],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("LATER"));
    assert_eq!(row.get::<_, i32>(1), 2, "the 503 cost an attempt");
    let token: i64 = row.get(2);
    let header = |seen: &crate::handler_http::server::Seen, name: &str| {
        seen.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let key: String = client
        .query_one(
            "SELECT task_key FROM pgtaskd.task_view WHERE id = $1",
            &[&later],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(header(&second, "pgtaskd-claim"), Some(token.to_string()));
    assert_eq!(header(&second, "idempotency-key"), Some(key.clone()));
    assert_eq!(
        header(&first, "idempotency-key"),
        Some(key),
        "the key is the task's, the same for every attempt"
    );
    assert_eq!(header(&second, "pgtaskd-task-id"), Some(later.to_string()));
    assert_eq!(header(&second, "pgtaskd-attempt").as_deref(), Some("2"));
    assert_eq!(header(&first, "pgtaskd-run").as_deref(), Some("1"));
    assert_eq!(header(&second, "pgtaskd-run").as_deref(), Some("2"));
    assert_eq!(header(&second, "pgtaskd-queue").as_deref(), Some("jobs"));
    assert_ne!(
        header(&first, "pgtaskd-claim"),
        header(&second, "pgtaskd-claim"),
        "each attempt is a claim of its own"
    );
    // Retry-After: 1 and not the queue's hour of backoff.
    let waited: f64 = client
        .query_one(
            "SELECT extract(epoch FROM started_at - created_at)::float8 FROM pgtaskd.task_view WHERE id = $1",
            &[&later],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        (1.0..600.0).contains(&waited),
        "second attempt after {waited} s"
    );

    let gone = enqueue(&client, "gone", 3).await;
    wait_status(&client, gone, "FAILED").await;
    let row = client
        .query_one(
            "SELECT attempt, error FROM pgtaskd.task_view WHERE id = $1",
            &[&gone],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1, "404 fails at once");
    assert!(row.get::<_, String>(1).contains("404"));
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_gives_running_children_the_grace_then_stops_them_and_gives_their_tasks_back() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let started = scratch.path("started");
    let handler = scratch.script(
        "slow.sh",
        &format!(
            "if [ \"$(cat)\" = quick ]; then echo ok; exit 0; fi\necho $$ >> {}\nexec sleep 1000",
            started.display()
        ),
    );
    let config = format!(
        "[shutdown]\ngrace = \"500ms\"\n[http]\nlisten = \"127.0.0.1:0\"\n{}",
        exec_config(&handler, "concurrency = 2\nkill_after = \"1s\"\n")
    );
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("HTTP server listening").await;
    let quick = enqueue(&client, "quick", 3).await;
    wait_status(&client, quick, "SUCCEEDED").await;
    for _ in 0..2 {
        enqueue(&client, "slow", 3).await;
    }
    let pids = scratch.pids("started", 2).await;
    // The quick run is in the handler's metrics.
    let addr = daemon.http_addr().await;
    let metrics = metrics(&addr).await;
    assert!(
        metrics.contains("pgtaskd_handler_duration_seconds_count{queue=\"jobs\"} 1"),
        "{metrics}"
    );

    daemon.signal(libc::SIGTERM);
    let status = daemon.wait().await;
    assert!(status.success(), "{}", daemon.log_text());
    assert!(
        pids.iter().all(|pid| !alive(*pid)),
        "no child outlives the stop"
    );
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'QUEUED' AND attempt = 0), count(*) FROM pgtaskd.task_view WHERE queue = 'jobs' AND payload = 'slow'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        row.get::<_, i64>(1),
        "both tasks given back, the stopped attempt not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_an_output_or_an_error_fails_that_attempt_alone() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // "nul": a NUL in stdout; "err": a NUL in stderr and exit 65; else "ok".
    let handler = scratch.script(
        "nul.sh",
        "case \"$(cat)\" in\n  nul) printf 'a\\000b' ;;\n  err) printf 'bad\\000input' >&2; exit 65 ;;\n  *) echo ok ;;\nesac",
    );
    let config = exec_config(
        &handler,
        "retry_backoff = \"10ms\"\nmax_backoff = \"20ms\"\n",
    );
    let nul = enqueue(&client, "nul", 2).await;
    let err = enqueue(&client, "err", 2).await;
    let mut fine = Vec::new();
    for _ in 0..20 {
        fine.push(enqueue(&client, "fine", 2).await);
    }
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    wait_status(&client, nul, "FAILED").await;
    wait_status(&client, err, "FAILED").await;
    for id in fine {
        wait_status(&client, id, "SUCCEEDED").await;
    }
    let row = client
        .query_one(
            "SELECT attempt, error FROM pgtaskd.task_view WHERE id = $1",
            &[&nul],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
    assert!(row.get::<_, String>(1).contains("NUL"));
    let error: String = client
        .query_one("SELECT error FROM pgtaskd.task_view WHERE id = $1", &[&err])
        .await
        .unwrap()
        .get(0);
    assert!(error.contains("bad\\0input"), "{error}");
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success());
}

/// A daemon of two permits serving `default` and, in a lane of its own, `jobs` with `handler`.
fn busy_config(handler: &Path) -> String {
    format!(
        "[worker]\nqueues = [\"default\", \"jobs\"]\nconcurrency = 2\npoll_interval = \"200ms\"\n\n\
         [queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\ntimeout = \"10m\"\n",
        handler.display()
    )
}

/// A daemon serving `default` only, ready.
async fn default_only_daemon(db: &TestDb) -> DaemonProcess {
    let mut daemon = DaemonProcess::start(
        db,
        "[worker]\nqueues = [\"default\"]\npoll_interval = \"200ms\"\n",
        &[],
    );
    daemon.wait_for_log("ready").await;
    daemon
}

/// A lane whose slow commands hold every one of the daemon's `worker.concurrency` permits
/// claims no task of its other queues, which could not start: a second daemon serving them
/// gets every one at once (a hostile review: a default-queue task waited 28 s behind an exec
/// queue's timeouts, RUNNING under the busy daemon, while a second daemon sat idle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_holding_every_permit_leaves_the_other_queues_to_other_daemons() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let handler = slow_handler(&scratch);
    let busy_config = busy_config(&handler);
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('jobs', 'a'), ('jobs', 'b')",
            &[],
        )
        .await
        .unwrap();
    let mut busy = DaemonProcess::start(&db, &busy_config, &[]);
    scratch.pids("started", 2).await;
    let mut free = default_only_daemon(&db).await;
    // A few statements, so that the busy daemon's default lane is woken several times.
    for _ in 0..5 {
        client
            .execute(
                "INSERT INTO pgtaskd.tasks (payload) SELECT 'word ' || g FROM generate_series(1, 4) AS g",
                &[],
            )
            .await
            .unwrap();
    }
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'default' AND status = 'SUCCEEDED'",
        20,
        "every default task to succeed while the busy daemon's permits are held",
    )
    .await;
    busy.signal(libc::SIGKILL);
    busy.wait().await;
    free.signal(libc::SIGTERM);
    let _ = free.wait().await;
}

/// The same when both queues' tasks come in one transaction, so that the busy daemon's lanes
/// look for work at the same moment: the default lane never claims more than the permits the
/// other lane's claim leaves (a hostile review: counting its own tasks only, it claimed all
/// 30 default tasks while the slow lane took both permits, 4 trials in 10). Three trials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_that_look_at_once_leave_the_tasks_they_cannot_start_to_other_daemons() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let handler = slow_handler(&scratch);
    let busy_config = busy_config(&handler);
    let mut free = default_only_daemon(&db).await;
    for trial in 1..=3i64 {
        let mut busy = DaemonProcess::start(&db, &busy_config, &[]);
        busy.wait_for_log("ready").await;
        client
            .batch_execute(
                "BEGIN;
                 INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('jobs', 'a'), ('jobs', 'b');
                 INSERT INTO pgtaskd.tasks (payload) SELECT 'word ' || g FROM generate_series(1, 30) AS g;
                 COMMIT;",
            )
            .await
            .unwrap();
        wait_count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'default' AND status = 'SUCCEEDED'",
            30 * trial,
            "every default task to succeed while the busy daemon's permits are held",
        )
        .await;
        busy.signal(libc::SIGKILL);
        busy.wait().await;
    }
    free.signal(libc::SIGTERM);
    let _ = free.wait().await;
}
