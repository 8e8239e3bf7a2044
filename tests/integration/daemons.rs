//! The daemons connected (docs/design.md, "Daemons connected"), with real daemon processes:
//! each records itself in `pgtaskd.daemons` with its queues (every lane's, once) and version,
//! `pgtaskd daemons` lists it, a clean stop deletes it, a SIGKILL leaves it stale and any
//! daemon forgets rows gone for an hour; a queue with due tasks that no live daemon serves is
//! unserved in `stats`, `GET /stats` and `/metrics`, and `enqueue` to it warns (exit 0);
//! roles granted before schema 20 and after get the table's rights their grant says.

use serde_json::Value;
use tokio_postgres::Client;

use crate::support::daemon::pgtaskd;
use crate::support::{eventually, free_port, within, DaemonProcess, TestDb, WAIT};

/// A daemon serving `default` and, in a lane of its own, `jobs`; its heartbeat every second
/// (five poll intervals, at least a second), so stale after three.
fn config(port: Option<u16>) -> String {
    let http = port
        .map(|port| format!("[http]\nlisten = \"127.0.0.1:{port}\"\n\n"))
        .unwrap_or_default();
    format!(
        "{http}[worker]\nqueues = [\"default\", \"jobs\"]\npoll_interval = \"200ms\"\n\n[queues.jobs]\nhandler = \"text-stats\"\nconcurrency = 1\n"
    )
}

/// `pgtaskd daemons --json`: one object per daemon.
async fn daemons(url: &str) -> Vec<Value> {
    let (status, stdout, stderr) = pgtaskd(Some(url), &["daemons", "--json"]).await;
    assert!(status.success(), "pgtaskd daemons --json: {stderr}");
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Wait until `pgtaskd daemons` lists `n` daemons, `stale` of them stale; returns them.
async fn wait_listed(url: &str, n: usize, stale: usize) -> Vec<Value> {
    eventually(
        WAIT,
        &format!("pgtaskd daemons to list {n} daemon(s), {stale} stale"),
        || async move {
            let rows = daemons(url).await;
            let stales = rows.iter().filter(|r| r["stale"] == true).count();
            (rows.len() == n && stales == stale).then_some(rows)
        },
    )
    .await
}

async fn exec(client: &Client, sql: &str) {
    client.batch_execute(sql).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_daemon_is_listed_with_its_queues_and_version_and_gone_after_a_clean_stop() {
    let db = TestDb::new().await;
    let mut daemon = DaemonProcess::start(&db, &config(None), &[]);
    let rows = wait_listed(&db.url, 1, 0).await;
    let row = &rows[0];
    assert_eq!(
        row["queues"],
        serde_json::json!(["default", "jobs"]),
        "every lane's queues, once: {row}"
    );
    assert_eq!(row["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(row["heartbeat_every_s"], 1.0);
    let instance = row["instance"].as_str().unwrap().to_string();
    assert!(
        instance.contains(&format!(":{}:", daemon.pid())),
        "the instance id names the daemon's pid: {instance}"
    );
    assert!(row["started_at"].is_string() && row["heartbeat_at"].is_string());

    // The heartbeat moves while the daemon runs.
    let first = row["heartbeat_at"].clone();
    eventually(WAIT, "a second heartbeat", || {
        let url = &db.url;
        let first = &first;
        async move {
            let rows = daemons(url).await;
            (rows.len() == 1 && &rows[0]["heartbeat_at"] != first).then_some(())
        }
    })
    .await;

    let (status, stdout, _) = pgtaskd(Some(&db.url), &["daemons"]).await;
    assert!(status.success());
    assert!(stdout.starts_with("INSTANCE"), "{stdout}");
    assert!(
        stdout.contains(&instance) && stdout.contains("default,jobs") && stdout.contains(" ago"),
        "{stdout}"
    );
    assert!(!stdout.contains("stale"), "{stdout}");

    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
    assert!(
        daemons(&db.url).await.is_empty(),
        "a clean stop deletes the row"
    );
    let (status, stdout, _) = pgtaskd(Some(&db.url), &["daemons"]).await;
    assert!(status.success());
    assert_eq!(stdout, "no daemon connected\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_daemon_turns_stale_and_rows_gone_for_an_hour_are_forgotten() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut killed = DaemonProcess::start(&db, &config(None), &[]);
    wait_listed(&db.url, 1, 0).await;
    killed.signal(libc::SIGKILL);
    killed.wait().await;
    // Three heartbeat periods (3 s) after its last one.
    let rows = wait_listed(&db.url, 1, 1).await;
    assert!(
        rows[0]["heartbeat_age_s"].as_f64().unwrap() >= 3.0,
        "{rows:?}"
    );
    let (_, stdout, _) = pgtaskd(Some(&db.url), &["daemons"]).await;
    assert!(stdout.contains("(stale)"), "{stdout}");
    // A stale daemon serves nothing.
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["enqueue", "x"]).await;
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("no connected daemon serves queue \"default\""),
        "{stderr}"
    );

    // A row whose heartbeat is two hours old is deleted by the next daemon's heartbeat; the
    // stale one (seconds old) stays.
    exec(
        &client,
        "INSERT INTO pgtaskd.daemons (instance, version, queues, started_at, heartbeat_at, heartbeat_every)
         VALUES ('gone:1:000000', '0.0.1', '{default}', now() - interval '3 hours',
                 now() - interval '2 hours', interval '10 seconds')",
    )
    .await;
    let mut daemon = DaemonProcess::start(&db, &config(None), &[]);
    let rows = wait_listed(&db.url, 2, 1).await;
    assert!(
        rows.iter().all(|r| r["instance"] != "gone:1:000000"),
        "{rows:?}"
    );
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_no_daemon_serves_is_unserved_in_stats_and_metrics_and_enqueue_warns() {
    let db = TestDb::new().await;
    let port = free_port();
    let mut daemon = DaemonProcess::start(&db, &config(Some(port)), &[]);
    wait_listed(&db.url, 1, 0).await;

    let (status, stdout, stderr) =
        pgtaskd(Some(&db.url), &["enqueue", "--queue", "nosuchqueue", "x"]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.trim().parse::<i64>().is_ok(), "the id: {stdout}");
    assert_eq!(
        stderr,
        "warning: no connected daemon serves queue \"nosuchqueue\"; the task waits until one does (pgtaskd daemons lists them)\n"
    );
    // A served queue: no warning. Paused, so that its task stays due.
    let (status, _, _) = pgtaskd(Some(&db.url), &["pause", "jobs"]).await;
    assert!(status.success());
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["enqueue", "--queue", "jobs", "y"]).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(stderr, "", "no warning for a served queue");

    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["stats", "--json"]).await;
    assert!(status.success(), "{stderr}");
    let stats: Value = serde_json::from_str(&stdout).unwrap();
    let queue = |stats: &Value, name: &str| -> Value {
        stats["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == name)
            .unwrap_or_else(|| panic!("no queue {name} in {stats}"))
            .clone()
    };
    let unserved = queue(&stats, "nosuchqueue");
    assert_eq!(unserved["due"], 1);
    assert_eq!(
        (&unserved["served"], &unserved["unserved"]),
        (&Value::Bool(false), &Value::Bool(true))
    );
    let served = queue(&stats, "jobs");
    assert_eq!(served["due"], 1);
    assert_eq!(
        (&served["served"], &served["unserved"]),
        (&Value::Bool(true), &Value::Bool(false))
    );

    let (_, stdout, _) = pgtaskd(Some(&db.url), &["stats"]).await;
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {stdout}"))
            .to_string()
    };
    assert!(line("nosuchqueue").contains(" unserved "), "{stdout}");
    assert!(line("jobs").contains(" paused "), "{stdout}");

    // What the dashboard reads, and the gauge.
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let request = http.get(format!("http://127.0.0.1:{port}{path}")).send();
        async move {
            let response = within(WAIT, "an HTTP response", request).await.unwrap();
            assert_eq!(response.status().as_u16(), 200);
            within(WAIT, "an HTTP body", response.text()).await.unwrap()
        }
    };
    let body: Value = serde_json::from_str(&get("/stats").await).unwrap();
    assert_eq!(queue(&body, "nosuchqueue")["unserved"], true);
    assert_eq!(queue(&body, "jobs")["unserved"], false);
    let metrics = get("/metrics").await;
    for line in [
        "pgtaskd_queue_unserved{queue=\"nosuchqueue\"} 1",
        "pgtaskd_queue_unserved{queue=\"jobs\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
    let page = get("/ui").await;
    assert!(
        page.contains("\"unserved\""),
        "the dashboard names the state"
    );
    // POST /tasks warns as enqueue does, in its answer.
    let post = |queue: &str| {
        let request = http
            .post(format!("http://127.0.0.1:{port}/tasks"))
            .json(&serde_json::json!({ "payload": "z", "queue": queue }))
            .send();
        async move {
            let response = within(WAIT, "POST /tasks", request).await.unwrap();
            assert_eq!(response.status().as_u16(), 202);
            within(WAIT, "its body", response.json::<Value>())
                .await
                .unwrap()
        }
    };
    let answer = post("nosuchqueue").await;
    assert_eq!(
        answer["warning"],
        "no connected daemon serves queue \"nosuchqueue\"; the task waits until one does (GET /stats lists the daemons)",
        "{answer}"
    );
    let answer = post("jobs").await;
    assert!(answer.get("warning").is_none(), "{answer}");

    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
}

/// Roles granted at schema 19 get the table's rights from the migration, as roles granted at
/// schema 20 get them from the grant functions: the daemon writes it, producers and operators
/// read it, and a role with nothing gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_granted_before_schema_20_and_after_get_the_daemons_table_as_their_grant_says() {
    let db = TestDb::empty().await;
    let mut owner = db.client().await;
    within(
        WAIT,
        "migrating to 19",
        pgtaskd::db::migrate::migrate_to(&mut owner, 19),
    )
    .await
    .unwrap();
    let tag = format!("{:08x}", fastrand::u32(..));
    let role = |kind: &str| format!("dm_{kind}_{tag}");
    let grant = |kind: &str, function: &str| {
        format!(
            "CREATE ROLE {0}; SELECT pgtaskd.{function}('{0}');",
            role(kind)
        )
    };
    exec(
        &owner,
        &[
            grant("old_daemon", "grant_daemon"),
            grant("old_ops", "grant_operator"),
            grant("old_app", "grant_producer"),
            format!("CREATE ROLE {};", role("stranger")),
        ]
        .concat(),
    )
    .await;
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    exec(
        &owner,
        &[
            grant("new_daemon", "grant_daemon"),
            grant("new_ops", "grant_operator"),
            grant("new_app", "grant_producer"),
        ]
        .concat(),
    )
    .await;
    let may = |kind: &str, right: &str| {
        let sql = format!(
            "SELECT has_table_privilege('{}', 'pgtaskd.daemons', '{right}')",
            role(kind)
        );
        let owner = &owner;
        async move { owner.query_one(&sql, &[]).await.unwrap().get::<_, bool>(0) }
    };
    for kind in ["old_daemon", "new_daemon"] {
        for right in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
            assert!(may(kind, right).await, "{kind} {right}");
        }
    }
    for kind in ["old_ops", "new_ops", "old_app", "new_app"] {
        assert!(may(kind, "SELECT").await, "{kind} reads");
        for right in ["INSERT", "UPDATE", "DELETE"] {
            assert!(!may(kind, right).await, "{kind} may not {right}");
        }
    }
    assert!(!may("stranger", "SELECT").await);
    for kind in [
        "old_daemon",
        "old_ops",
        "old_app",
        "new_daemon",
        "new_ops",
        "new_app",
        "stranger",
    ] {
        exec(
            &owner,
            &format!("DROP OWNED BY {0}; DROP ROLE {0};", role(kind)),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_without_the_queues_handler_refuses_to_start_and_other_differences_are_logged() {
    let db = TestDb::new().await;
    let section = |command: &str| {
        format!(
            "[worker]\nqueues = [\"default\", \"jobs\"]\npoll_interval = \"200ms\"\n\n\
             [queues.jobs]\nhandler = \"exec\"\ncommand = [{command}]\n"
        )
    };
    let mut first = DaemonProcess::start(&db, &section("\"cat\""), &[]);
    let rows = wait_listed(&db.url, 1, 0).await;
    let handlers = rows[0]["handlers"].as_array().expect("handlers recorded");
    assert_eq!(handlers.len(), 2, "{}", rows[0]);
    assert_eq!(handlers[0], "text-stats");
    let exec = handlers[1].as_str().unwrap().to_string();
    assert!(
        exec.starts_with("exec:") && exec.len() == "exec:".len() + 8,
        "{exec}"
    );

    // No [queues.jobs] here: its tasks would be analyzed and marked SUCCEEDED, their command
    // never run. The daemon refuses to start, and is not left listed.
    let mut drifted = DaemonProcess::start(&db, "", &["--queues", "jobs"]);
    assert_eq!(
        drifted.wait().await.code(),
        Some(78),
        "{}",
        drifted.log_text()
    );
    let log = drifted.log_text();
    assert!(
        log.contains("queue \"jobs\" is run by daemon")
            && log.contains("with its exec handler")
            && log.contains("[queues.jobs]"),
        "{log}"
    );
    assert_eq!(daemons(&db.url).await.len(), 1);

    // Another command for the same queue: a rolling change goes through this state, so both
    // daemons run, and each logs the difference once.
    let mut other = DaemonProcess::start(&db, &section("\"wc\", \"-c\""), &[]);
    let said = "another daemon runs this queue with another handler or command";
    other.wait_for_log(said).await;
    first.wait_for_log(said).await;
    let rows = wait_listed(&db.url, 2, 0).await;
    assert_ne!(rows[0]["handlers"][1], rows[1]["handlers"][1], "{rows:?}");
    for mut daemon in [first, other] {
        daemon.signal(libc::SIGTERM);
        assert!(daemon.wait().await.success(), "{}", daemon.log_text());
        assert_eq!(
            daemon.log_text().matches(said).count(),
            1,
            "logged once: {}",
            daemon.log_text()
        );
    }
}

/// Two daemons' configurations for queue `jobs`: one runs it with an `exec` handler that
/// answers "ran", the other has no section for it (and serves `other` too).
fn drifted_configs(scratch: &crate::handlers::Scratch) -> (String, &'static str) {
    let handler = scratch.script("ran.sh", "echo ran");
    let with_section = format!(
        "[worker]\nqueues = [\"jobs\"]\npoll_interval = \"200ms\"\n\
         [queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\n",
        handler.display()
    );
    let without = "[worker]\nqueues = [\"jobs\", \"other\"]\npoll_interval = \"200ms\"\n";
    (with_section, without)
}

/// Insert `n` tasks into `jobs`, wait until every task of it succeeded, and check that each
/// ran its command (an analyzed one has no output); `what` names the case.
async fn insert_and_see_every_task_run(client: &Client, n: i64, what: &str) {
    within(
        WAIT,
        "the tasks",
        client.batch_execute(&format!(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT 'jobs', 'x' FROM generate_series(1, {n})"
        )),
    )
    .await
    .unwrap();
    crate::support::wait_count(
        client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'jobs' AND status <> 'SUCCEEDED'",
        0,
        "every task to succeed",
    )
    .await;
    let analyzed = crate::support::count(
        client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE queue = 'jobs' AND output IS NULL",
    )
    .await;
    assert_eq!(
        analyzed, 0,
        "{what}: tasks of jobs analyzed, their command never run"
    );
}

/// The other order: the daemon without the section runs already when the one with it starts
/// (a restart of the latter, or both at once). From its next heartbeat it leaves the queue
/// out of its claims, so every task of the queue runs its command; it claims the queue again
/// once the other is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_without_the_queues_handler_stops_claiming_it_when_one_with_it_comes() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = crate::handlers::Scratch::new();
    let (with_section, without) = drifted_configs(&scratch);
    let mut plain = DaemonProcess::start(&db, without, &[]);
    wait_listed(&db.url, 1, 0).await;
    let mut exec = DaemonProcess::start(&db, &with_section, &[]);
    plain
        .wait_for_log("this daemon stops claiming the queue")
        .await;
    exec.wait_for_log("another daemon runs this queue with another handler or command")
        .await;
    insert_and_see_every_task_run(&client, 40, "").await;

    // The daemon with the section gone, the other claims the queue again.
    exec.signal(libc::SIGTERM);
    assert!(exec.wait().await.success(), "{}", exec.log_text());
    plain
        .wait_for_log("this daemon claims the queue again")
        .await;
    plain.signal(libc::SIGTERM);
    assert!(plain.wait().await.success(), "{}", plain.log_text());
}

/// Two daemons started at the same moment, one with the queue's section and one without:
/// their starts are serialised, so the one without either refuses to start (it came second)
/// or, having come first, withholds the queue once the other is there. Either way no task
/// of the queue is analyzed instead of run. Three trials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_started_at_once_never_analyze_a_queue_one_of_them_runs_with_a_handler() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = crate::handlers::Scratch::new();
    let (with_section, without) = drifted_configs(&scratch);
    for trial in 0..3 {
        let mut exec = DaemonProcess::start(&db, &with_section, &[]);
        let mut plain = DaemonProcess::start(&db, without, &[]);
        let refused = eventually(WAIT, "the daemon without the section to step aside", || {
            let log = plain.log_text();
            async move {
                if log.contains("is run by daemon") {
                    Some(true)
                } else if log.contains("this daemon stops claiming the queue") {
                    Some(false)
                } else {
                    None
                }
            }
        })
        .await;
        insert_and_see_every_task_run(&client, 10, &format!("trial {trial}, refused: {refused}"))
            .await;
        if refused {
            assert_eq!(plain.wait().await.code(), Some(78), "{}", plain.log_text());
        } else {
            plain.signal(libc::SIGTERM);
            assert!(plain.wait().await.success(), "{}", plain.log_text());
        }
        exec.signal(libc::SIGTERM);
        assert!(exec.wait().await.success(), "{}", exec.log_text());
    }
}

/// A daemon whose registration waited on the start lock past `statement_timeout` (another
/// starting daemon's commit held it) hands no session back inside the failed transaction:
/// the rescuer and the rest never meet "current transaction is aborted".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_timed_out_on_the_start_lock_leaves_no_session_in_a_failed_transaction() {
    let db = TestDb::new().await;
    let holder = db.client().await;
    // The lock every starting daemon takes (src/queue/daemons.rs, START_LOCK).
    holder
        .batch_execute("SELECT pg_advisory_lock(8099570429445893732)")
        .await
        .unwrap();
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\npoll_interval = \"200ms\"\n[database]\nstatement_timeout = \"1s\"\npool_size = 1\n",
        &[],
    );
    daemon
        .wait_for_log("could not record this daemon in pgtaskd.daemons")
        .await;
    holder
        .batch_execute("SELECT pg_advisory_unlock(8099570429445893732)")
        .await
        .unwrap();
    // With one session, everything after the registration uses the one it failed on.
    let client = db.client().await;
    let id: i64 = client
        .query_one("SELECT pgtaskd.enqueue('one two')", &[])
        .await
        .unwrap()
        .get(0);
    eventually(WAIT, "the task to succeed", || async {
        let row = client
            .query_one("SELECT status FROM pgtaskd.task_view WHERE id = $1", &[&id])
            .await
            .ok()?;
        (row.get::<_, String>(0) == "SUCCEEDED").then_some(())
    })
    .await;
    assert!(
        !daemon.log_text().contains("current transaction is aborted"),
        "{}",
        daemon.log_text()
    );
    daemon.stop_cleanly().await;
}
