//! Progress reports (docs/handlers.md, "Progress"): an exec handler writes JSON lines to
//! `PGTASKD_PROGRESS_FD`, an http handler posts them to `POST /tasks/{id}/progress` with its
//! `Pgtaskd-Claim`; the daemon keeps the latest in memory, writes it at most once a second per
//! task (one statement for all), fenced by the claim, and the next attempt is told it. Real
//! daemons, real commands, a real HTTP endpoint.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_postgres::Client;

use crate::handler_http::server::{respond, TestServer};
use crate::handlers::Scratch;
use crate::support::daemon::pgtaskd;
use crate::support::{eventually, free_port, wait_count, within, DaemonProcess, TestDb, WAIT};

/// A daemon serving queue `jobs` with `handler` (an exec command, or an http URL), its HTTP API
/// on `port`.
fn config(handler: &str, extra: &str) -> String {
    format!(
        "[worker]\nqueues = [\"jobs\"]\npoll_interval = \"100ms\"\n\n\
         [queues.jobs]\n{handler}\nretry_backoff = \"100ms\"\nmax_backoff = \"100ms\"\n{extra}"
    )
}

fn exec(script: &std::path::Path) -> String {
    format!("handler = \"exec\"\ncommand = [\"{}\"]", script.display())
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

/// The task's progress as the database holds it, as JSON.
async fn stored(client: &Client, id: i64) -> Option<Value> {
    let row = within(
        WAIT,
        "the task's progress",
        client.query_one(
            "SELECT progress::text FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        ),
    )
    .await
    .unwrap();
    row.get::<_, Option<String>>(0)
        .map(|text| serde_json::from_str(&text).unwrap())
}

/// A counter of the daemon's `/metrics` (0 when absent).
async fn counter(addr: &str, name: &str) -> f64 {
    let text = within(WAIT, "GET /metrics", async {
        reqwest::get(format!("http://{addr}/metrics"))
            .await?
            .text()
            .await
    })
    .await
    .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A python3 program as an executable script.
fn python(scratch: &Scratch, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = scratch.path(name);
    std::fs::write(&path, format!("#!/usr/bin/env python3\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_reports_in_one_attempt_are_written_about_once_a_second_and_the_last_is_kept()
{
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // 10,000 reports in ten bursts a quarter of a second apart: about 2.5 s of work.
    let handler = python(
        &scratch,
        "busy.py",
        "import os, time\n\
         out = os.fdopen(int(os.environ['PGTASKD_PROGRESS_FD']), 'w')\n\
         for burst in range(10):\n\
         \x20   for j in range(1000):\n\
         \x20       i = burst * 1000 + j\n\
         \x20       out.write('{\"percent\": %s, \"i\": %d, \"message\": \"row %d\"}\\n' % ((i + 1) / 100, i, i))\n\
         \x20   out.flush()\n\
         \x20   time.sleep(0.25)\n\
         print('done')",
    );
    let mut daemon = DaemonProcess::start(
        &db,
        &config(&exec(&handler), ""),
        &["--http-listen", "127.0.0.1:0"],
    );
    let addr = daemon.http_addr().await;
    let id = insert(&client, 1).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the task",
    )
    .await;
    let seconds: f64 = within(
        WAIT,
        "the run's length",
        client.query_one(
            "SELECT extract(epoch FROM finished_at - started_at)::float8 FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let reports = counter(&addr, "pgtaskd_progress_reports_total").await;
    let writes = counter(&addr, "pgtaskd_progress_writes_total").await;
    let flushes = counter(&addr, "pgtaskd_progress_flushes_total").await;
    let dropped = counter(&addr, "pgtaskd_progress_dropped_total").await;
    println!(
        "10,000 report lines in {seconds:.2} s: {reports} taken, {dropped} dropped, \
         {writes} rows written by {flushes} statements"
    );
    // Of the lines one read brings, only the last is checked and kept: each burst of a
    // thousand comes in a few reads.
    assert!(
        (10.0..1_000.0).contains(&reports),
        "{reports} reports taken for 10,000 lines in ten bursts: one per read"
    );
    assert_eq!(dropped, 0.0);
    // At most one write a second, and the one before the finish.
    assert!(writes >= 1.0, "written");
    assert!(
        writes <= seconds.ceil() + 2.0,
        "{writes} writes in {seconds:.2} s: more than one a second"
    );
    assert!(
        flushes <= writes + 1.0,
        "{flushes} statements for {writes} rows"
    );
    assert_eq!(
        stored(&client, id).await,
        Some(json!({"percent": 100.0, "i": 9999, "message": "row 9999"})),
        "the last line"
    );
    daemon.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_from_a_claim_that_is_not_current_changes_nothing() {
    use pgtaskd::queue::{self, progress::write_progress};
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = insert(&client, 3).await;
    let jobs = vec!["jobs".to_string()];
    let claimed = within(
        WAIT,
        "a claim",
        queue::claim(&client, "me", &jobs, 1, Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let token = claimed[0].token;
    let write = |token: i64, text: &'static str| {
        let client = &client;
        async move {
            within(
                WAIT,
                "write_progress",
                write_progress(client, &[id], &[token], &[text]),
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(write(token, r#"{"percent": 10}"#).await, [id], "current");
    assert_eq!(write(token + 1, r#"{"percent": 99}"#).await, [] as [i64; 0]);
    assert_eq!(stored(&client, id).await, Some(json!({"percent": 10})));
    // Given back: the old claim writes nothing, and the row keeps its progress for the next.
    within(WAIT, "a release", queue::release(&client, token, id, true))
        .await
        .unwrap();
    assert_eq!(write(token, r#"{"percent": 50}"#).await, [] as [i64; 0]);
    assert_eq!(stored(&client, id).await, Some(json!({"percent": 10})));
    let next = within(
        WAIT,
        "a claim",
        queue::claim(&client, "me", &jobs, 1, Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(
        next[0].told.progress.as_deref(),
        Some(r#"{"percent": 10}"#),
        "the next claim is told it"
    );
    assert_eq!(write(token, r#"{"percent": 60}"#).await, [] as [i64; 0]);
    assert_eq!(write(next[0].token, r#"{"percent": 70}"#).await, [id]);
    assert_eq!(stored(&client, id).await, Some(json!({"percent": 70})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_attempt_that_fails_leaves_its_last_progress_to_the_next() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // The first attempt reports twice and fails well within the flusher's second: only the
    // write before its finish keeps the second report.
    let handler = scratch.script(
        "resume.sh",
        "if [ \"$PGTASKD_ATTEMPT\" = 1 ]; then\n\
         \x20 echo '{\"cursor\": 100, \"percent\": 10}' >&$PGTASKD_PROGRESS_FD\n\
         \x20 echo '{\"cursor\": 500, \"percent\": 50, \"message\": \"naïve\"}' >&$PGTASKD_PROGRESS_FD\n\
         \x20 exit 1\n\
         fi\n\
         printf '%s' \"$PGTASKD_PROGRESS\"",
    );
    let mut daemon = DaemonProcess::start(&db, &config(&exec(&handler), ""), &[]);
    let id = insert(&client, 2).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the second attempt",
    )
    .await;
    let output: String = within(
        WAIT,
        "the output",
        client.query_one("SELECT output FROM pgtaskd.task_view WHERE id = $1", &[&id]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        serde_json::from_str::<Value>(&output).unwrap(),
        json!({"cursor": 500, "percent": 50, "message": "naïve"}),
        "PGTASKD_PROGRESS of attempt 2: {output:?}"
    );
    daemon.stop_cleanly().await;
}

/// The claim and progress headers of each post an endpoint got, and its answers: the first
/// post reports progress to the daemon's API and fails the attempt; the second answers the
/// `Pgtaskd-Progress` it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_handler_reports_over_the_api_and_its_next_attempt_gets_the_header() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(u16, String)>::new()));
    let seen = std::sync::Arc::clone(&answers);
    let base = api.clone();
    let server = TestServer::start(move |request| {
        let id: i64 = request.headers["pgtaskd-task-id"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let claim = request.headers["pgtaskd-claim"]
            .to_str()
            .unwrap()
            .to_string();
        let progress = request
            .headers
            .get("pgtaskd-progress")
            .map(|value| value.to_str().unwrap().to_string());
        let base = base.clone();
        let seen = std::sync::Arc::clone(&seen);
        async move {
            let http = reqwest::Client::new();
            let post = |claim: String, body: String| {
                let request = http
                    .post(format!("{base}/tasks/{id}/progress"))
                    .header("pgtaskd-claim", claim)
                    .header("content-type", "application/json")
                    .body(body);
                async move {
                    let answer = request.send().await.unwrap();
                    let status = answer.status().as_u16();
                    (status, answer.text().await.unwrap())
                }
            };
            match progress {
                None => {
                    let mut got = Vec::new();
                    got.push(post(claim.clone(), r#"{"percent": 30, "cursor": "ü"}"#.into()).await);
                    let stale = (claim.parse::<i64>().unwrap() + 1000).to_string();
                    got.push(post(stale, r#"{"percent": 99}"#.into()).await);
                    got.push(post(claim.clone(), r#"{"percent": 500}"#.into()).await);
                    got.push(post(claim.clone(), "[1]".into()).await);
                    got.push(post(claim.clone(), "x".repeat(5000)).await);
                    let unknown = http
                        .post(format!("{base}/tasks/{}/progress", id + 1000))
                        .header("pgtaskd-claim", claim.clone())
                        .body("{}")
                        .send()
                        .await
                        .unwrap();
                    got.push((unknown.status().as_u16(), String::new()));
                    let unclaimed = http
                        .post(format!("{base}/tasks/{id}/progress"))
                        .body("{}")
                        .send()
                        .await
                        .unwrap();
                    got.push((unclaimed.status().as_u16(), String::new()));
                    seen.lock().unwrap().extend(got);
                    respond(503, &[], "try again")
                }
                Some(progress) => respond(200, &[], progress),
            }
        }
    })
    .await;
    let handler = format!("handler = \"http\"\nurl = \"{}\"", server.url("/"));
    let mut daemon = DaemonProcess::start(
        &db,
        &config(&handler, ""),
        &["--http-listen", &format!("127.0.0.1:{port}")],
    );
    let id = insert(&client, 2).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the second attempt",
    )
    .await;
    let codes: Vec<u16> = answers
        .lock()
        .unwrap()
        .iter()
        .map(|(code, _)| *code)
        .collect();
    println!("answers: {:?}", answers.lock().unwrap());
    assert_eq!(
        codes,
        [202, 409, 400, 400, 413, 404, 400],
        "accepted, stale claim, percent 500, not an object, too long, unknown task, no claim"
    );
    let output: String = within(
        WAIT,
        "the output",
        client.query_one("SELECT output FROM pgtaskd.task_view WHERE id = $1", &[&id]),
    )
    .await
    .unwrap()
    .get(0);
    // The same JSON in ASCII: `ü` as `\u00fc`.
    assert_eq!(output, r#"{"cursor": "\u00fc", "percent": 30}"#);
    assert_eq!(
        stored(&client, id).await,
        Some(json!({"percent": 30, "cursor": "ü"}))
    );
    // The claim has ended: its token is refused now.
    let token: i64 = within(
        WAIT,
        "the claim",
        client.query_one(
            "SELECT claim_token FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        ),
    )
    .await
    .unwrap()
    .get::<_, Option<i64>>(0)
    .unwrap_or(0);
    let late = within(
        WAIT,
        "a late report",
        reqwest::Client::new()
            .post(format!("{api}/tasks/{id}/progress"))
            .header("pgtaskd-claim", token.to_string())
            .body(r#"{"percent": 1}"#)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(late.status(), StatusCode::CONFLICT);
    daemon.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_is_shown_by_status_and_get_within_two_seconds_while_the_task_runs() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let gate = scratch.path("gate");
    let wrote = scratch.path("wrote");
    let made = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .unwrap();
    assert!(made.success());
    // Reports, says so, then waits at the gate (a fifo the test opens when it is done).
    let handler = scratch.script(
        "gated.sh",
        &format!(
            "echo '{{\"percent\": 40, \"message\": \"half way\"}}' >&$PGTASKD_PROGRESS_FD\n\
             touch {wrote}\n\
             read line < {gate}\n\
             echo finished",
            wrote = wrote.display(),
            gate = gate.display()
        ),
    );
    let mut daemon = DaemonProcess::start(
        &db,
        &config(&exec(&handler), ""),
        &["--http-listen", "127.0.0.1:0"],
    );
    let addr = daemon.http_addr().await;
    let id = insert(&client, 1).await;
    eventually(WAIT, "the handler's report", || {
        let wrote = wrote.clone();
        async move { wrote.exists().then_some(()) }
    })
    .await;
    let reported = Instant::now();
    let http = reqwest::Client::new();
    let task: Value = eventually(WAIT, "the report in GET /tasks/{id}", || {
        let request = http.get(format!("http://{addr}/tasks/{id}"));
        async move {
            let task: Value = request.send().await.ok()?.json().await.ok()?;
            task["progress"].is_object().then_some(task)
        }
    })
    .await;
    let shown_after = reported.elapsed();
    println!("shown by GET /tasks/{{id}} {shown_after:?} after the report");
    assert_eq!(task["status"], "RUNNING");
    assert_eq!(
        task["progress"],
        json!({"percent": 40, "message": "half way"})
    );
    assert!(task["progress_at"].is_string());
    assert!(
        shown_after < Duration::from_secs(2),
        "shown {shown_after:?} after the report"
    );
    let (code, status, stderr) = pgtaskd(Some(&db.url), &["status", &id.to_string()]).await;
    assert!(code.success(), "{stderr}");
    assert!(
        status.contains(r#"progress: {"message": "half way", "percent": 40}"#),
        "{status}"
    );
    assert!(status.contains("RUNNING"), "{status}");
    // Open the gate: the task ends, its progress is kept.
    within(WAIT, "the gate", async {
        tokio::fs::write(&gate, "go\n").await.unwrap();
    })
    .await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the task",
    )
    .await;
    let (_, status, _) = pgtaskd(Some(&db.url), &["status", &id.to_string()]).await;
    assert!(status.contains("progress: "), "{status}");
    daemon.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_progress_is_dropped_and_the_task_and_the_daemon_go_on_within_bounded_memory() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // What the child holds open (only 0, 1, 2 and the progress pipe's write end as 3), then a
    // megabyte without a newline, 64 MB more without one, bad lines, one good line, the
    // descriptor closed, and a normal exit. Each bad line is the last of its read (only the
    // last line of a read is checked): the handler waits for the daemon's /metrics, at the
    // address its payload gives, to count its drop before it writes the next.
    let handler = python(
        &scratch,
        "hostile.py",
        "import os, stat, fcntl, sys, time, urllib.request\n\
         addr = sys.stdin.read()\n\
         if addr == 'warm':\n\
         \x20   print('warm')\n\
         \x20   sys.exit(0)\n\
         def dropped(reason):\n\
         \x20   text = urllib.request.urlopen('http://%s/metrics' % addr, timeout=5).read().decode()\n\
         \x20   for line in text.splitlines():\n\
         \x20       if line.startswith('pgtaskd_progress_dropped_total{reason=\"%s\"}' % reason):\n\
         \x20           return float(line.split()[-1])\n\
         \x20   return 0.0\n\
         def gate(reason, n):\n\
         \x20   deadline = time.time() + 30\n\
         \x20   while dropped(reason) < n:\n\
         \x20       if time.time() > deadline:\n\
         \x20           sys.exit('no drop counted for ' + reason)\n\
         \x20       time.sleep(0.01)\n\
         fd = int(os.environ['PGTASKD_PROGRESS_FD'])\n\
         open_fds = []\n\
         for n in range(256):\n\
         \x20   try:\n\
         \x20       os.fstat(n)\n\
         \x20       open_fds.append(n)\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         mode = os.fstat(fd).st_mode\n\
         access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE\n\
         out = os.fdopen(fd, 'wb')\n\
         out.write(b'{' * (1 << 20))\n\
         out.write(b'\\n')\n\
         chunk = b'x' * (1 << 20)\n\
         for _ in range(64):\n\
         \x20   out.write(chunk)\n\
         out.write(b'\\n')\n\
         out.flush()\n\
         gate('too_long', 2)\n\
         for line, reason, n in [(b'{not json', 'not_json', 1), (b'[1, 2]', 'not_object', 1), (b'\"text\"', 'not_object', 2), (b'{\"percent\": 500}', 'percent', 1), (b'{\"a\": \"\\\\u0000\"}', 'nul', 1)]:\n\
         \x20   out.write(line + b'\\n')\n\
         \x20   out.flush()\n\
         \x20   gate(reason, n)\n\
         out.write(b'{\"percent\": 10, \"ok\": true}\\n')\n\
         out.close()\n\
         print('fds', open_fds, 'fifo', stat.S_ISFIFO(mode), 'write-only', access == os.O_WRONLY)",
    );
    let mut daemon = DaemonProcess::start(
        &db,
        &config(&exec(&handler), ""),
        &["--http-listen", "127.0.0.1:0"],
    );
    let addr = daemon.http_addr().await;
    let hwm = |pid: i32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    // A first task that reports nothing, so that the daemon's own start and its first child
    // are behind the measure.
    let warm: i64 = within(
        WAIT,
        "an insert",
        client.query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('warm', 'jobs') RETURNING id",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    wait_count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.task_view WHERE id = {warm} AND status = 'SUCCEEDED'"
        ),
        1,
        "a first task",
    )
    .await;
    let before = hwm(daemon.pid());
    let id: i64 = within(
        WAIT,
        "an insert",
        client.query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue, max_attempts) VALUES ($1, 'jobs', 1) RETURNING id",
            &[&addr],
        ),
    )
    .await
    .unwrap()
    .get(0);
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the hostile task",
    )
    .await;
    let after = hwm(daemon.pid());
    println!("daemon peak RSS {before} kB before, {after} kB after 65 MB of unended lines");
    assert!(
        after < before + 32 * 1024,
        "peak RSS grew from {before} kB to {after} kB"
    );
    let output: String = within(
        WAIT,
        "the output",
        client.query_one("SELECT output FROM pgtaskd.task_view WHERE id = $1", &[&id]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        output.trim(),
        "fds [0, 1, 2, 3] fifo True write-only True",
        "only the standard streams and the progress pipe's write end"
    );
    assert_eq!(
        stored(&client, id).await,
        Some(json!({"percent": 10, "ok": true}))
    );
    for (reason, n) in [
        ("too_long", 2.0),
        ("not_json", 1.0),
        ("not_object", 2.0),
        ("percent", 1.0),
        ("nul", 1.0),
    ] {
        let name = format!("pgtaskd_progress_dropped_total{{reason=\"{reason}\"}}");
        assert_eq!(counter(&addr, &name).await, n, "{name}");
    }
    assert!(
        daemon.log_text().contains("progress line dropped"),
        "the drop is said"
    );
    // A handler that closes the descriptor at once, and one that never uses it: both fine.
    let closer = scratch.script("closer.sh", "exec 3>&-\necho closed");
    daemon.stop_cleanly().await;
    let mut daemon = DaemonProcess::start(&db, &config(&exec(&closer), ""), &[]);
    let id = insert(&client, 1).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the task that closed its descriptor",
    )
    .await;
    assert_eq!(stored(&client, id).await, None);
    daemon.stop_cleanly().await;
}
