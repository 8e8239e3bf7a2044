//! Vacuum health (docs/design.md, "Vacuum health"): the task table's bloat and the xmin
//! horizon in `/metrics`, a held horizon as a `/readyz` warning (still 200) and a log line,
//! read by a daemon whose role is neither superuser nor `pg_read_all_stats`, never showing
//! another session's query. Each test has a cluster of its own, so that no other test's
//! transaction holds the horizon. Roles granted before schema 9, and a schema migrated by an
//! owner without `pg_read_all_stats`, are in `vacuum_health_roles`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio_postgres::Client;

use crate::support::{
    connect, eventually, free_port, within, Cluster, DaemonProcess, TestDb, WAIT,
};

/// The secret an analyst's query carries; nothing pgtaskd serves may show it.
pub(crate) const SECRET: &str = "secret-7f3a-query-text";

/// A role made by `grant_daemon` (no superuser, no `pg_read_all_stats`) and its connection
/// string on `db`.
async fn daemon_role(db: &TestDb, owner: &Client) -> String {
    owner
        .batch_execute("CREATE ROLE vh_daemon LOGIN; SELECT pgtaskd.grant_daemon('vh_daemon');")
        .await
        .unwrap();
    let url = db.url.replace("user=postgres", "user=vh_daemon");
    assert_ne!(url, db.url, "the test URL names the user");
    url
}

/// `pgtaskd run` as `url`'s role, reading the vacuum health every 100 ms and warning of a
/// horizon held for 1 s; returns it and its HTTP port once `/readyz` is 200.
pub(crate) async fn start_daemon(url: &str) -> (DaemonProcess, u16) {
    let port = free_port();
    let toml = format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n\
         [worker]\nqueues = [\"default\"]\n\
         [vacuum_health]\ncheck_interval = \"100ms\"\nxmin_horizon_warning = \"1s\"\n"
    );
    let daemon = DaemonProcess::start_url(url, &toml, &[]);
    let ready = tokio::time::timeout(WAIT, async {
        loop {
            if let Some((StatusCode::OK, _)) = get(port, "/readyz").await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "not ready within {WAIT:?}:\n{}",
        daemon.log_text()
    );
    (daemon, port)
}

/// `GET path`: its status and body; `None` while nothing answers.
async fn get(port: u16, path: &str) -> Option<(StatusCode, String)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let response = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .ok()?;
    let status = response.status();
    Some((status, response.text().await.ok()?))
}

/// The value of the metric line that starts with `series ` (name and labels), if any.
pub(crate) fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// Poll `/metrics` until `check` accepts it; returns it.
pub(crate) async fn wait_metrics(port: u16, what: &str, check: impl Fn(&str) -> bool) -> String {
    let check = &check;
    eventually(WAIT, what, || async move {
        let (status, text) = get(port, "/metrics").await?;
        (status == StatusCode::OK && check(&text)).then_some(text)
    })
    .await
}

/// Poll `/readyz` until its warnings satisfy `check`; returns its body (always 200).
pub(crate) async fn wait_readyz(port: u16, what: &str, check: impl Fn(&[String]) -> bool) -> Value {
    let check = &check;
    eventually(WAIT, what, || async move {
        let (status, text) = get(port, "/readyz").await?;
        assert_eq!(
            status,
            StatusCode::OK,
            "a held horizon never fails readiness: {text}"
        );
        let body: Value = serde_json::from_str(&text).unwrap();
        let warnings: Vec<String> = body["warnings"]
            .as_array()
            .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        check(&warnings).then_some(body)
    })
    .await
}

/// The role `vh_analyst` (application_name `analyst-report`) opens a REPEATABLE READ
/// transaction that reads [`SECRET`] and stays idle in it. Returns its session and pid.
pub(crate) async fn analyst_holds_a_snapshot(url: &str) -> (Client, i32) {
    let analyst = connect(&format!(
        "{} application_name=analyst-report",
        url.replace("user=postgres", "user=vh_analyst")
    ))
    .await;
    let pid: i32 = analyst
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    within(
        WAIT,
        "the analyst's snapshot",
        analyst.batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT '{SECRET}'"
        )),
    )
    .await
    .unwrap();
    (analyst, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_snapshot_or_prepared_transaction_shows_in_metrics_readyz_and_the_log_until_it_ends()
{
    let cluster = Cluster::start_with(&[("max_prepared_transactions", "2")], &[]);
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    let daemon_url = daemon_role(&db, &owner).await;
    owner
        .batch_execute("CREATE ROLE vh_analyst LOGIN")
        .await
        .unwrap();
    let (mut daemon, port) = start_daemon(&daemon_url).await;
    wait_metrics(port, "a first reading", |m| {
        value(m, "pgtaskd_xmin_horizon_held") == Some(0.0)
    })
    .await;

    // An analyst, of another role, holds a REPEATABLE READ snapshot, idle in its transaction.
    let (analyst, pid) = analyst_holds_a_snapshot(&db.url).await;

    let holder = format!(
        "pgtaskd_xmin_horizon_holder{{kind=\"session\",pid=\"{pid}\",name=\"analyst-report\",\
         state=\"idle in transaction\"}}"
    );
    let metrics = wait_metrics(port, "the held horizon in /metrics", |m| {
        value(m, &holder) == Some(1.0)
    })
    .await;
    assert_eq!(value(&metrics, "pgtaskd_xmin_horizon_held"), Some(1.0));
    let age = value(
        &metrics,
        "pgtaskd_xmin_horizon_age_seconds{kind=\"session\"}",
    )
    .unwrap_or_else(|| panic!("no session horizon age in\n{metrics}"));
    assert!(age >= 1.0, "held past the 1 s threshold: {age}");
    assert!(
        value(
            &metrics,
            "pgtaskd_xmin_horizon_age_transactions{kind=\"session\"}"
        )
        .is_some(),
        "{metrics}"
    );
    assert!(!metrics.contains(SECRET), "no query text in /metrics");
    let body = wait_readyz(port, "the /readyz warning", |w| {
        w.iter().any(|w| w.contains(&format!("pid {pid}")))
    })
    .await;
    let warning = body["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("application_name \"analyst-report\", idle in transaction"),
        "{warning}"
    );
    assert_eq!(body["status"], "ready");
    assert!(
        !body.to_string().contains(SECRET),
        "no query text in /readyz"
    );
    daemon
        .wait_for_log("xmin horizon held back: vacuum cannot remove")
        .await;

    // The daemon's role cannot see the analyst's state or query itself; through the function
    // it sees the state, and still no query.
    let as_daemon = connect(&daemon_url).await;
    let row = as_daemon
        .query_one(
            "SELECT state, query FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0), None);
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some("<insufficient privilege>")
    );
    let row = as_daemon
        .query_one(
            "SELECT row_to_json(h)::text, h.holder_state, h.sees_all_sessions \
               FROM pgtaskd.vacuum_health() AS h",
            &[],
        )
        .await
        .unwrap();
    let all: String = row.get(0);
    assert!(!all.contains(SECRET), "{all}");
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some("idle in transaction"),
        "{all}"
    );
    assert!(
        row.get::<_, bool>(2),
        "the owner (a superuser) sees all: {all}"
    );

    // The snapshot ends: everything clears, and the log said it once.
    analyst.batch_execute("COMMIT").await.unwrap();
    wait_readyz(port, "the warning to clear", |w| w.is_empty()).await;
    let metrics = wait_metrics(port, "the horizon to clear", |m| {
        value(m, "pgtaskd_xmin_horizon_held") == Some(0.0)
    })
    .await;
    assert!(
        !metrics.contains("pgtaskd_xmin_horizon_holder{"),
        "{metrics}"
    );
    daemon.wait_for_log("xmin horizon released").await;
    let log = daemon.log_text();
    assert_eq!(
        log.matches("xmin horizon held back: vacuum cannot remove")
            .count(),
        1,
        "one line when it became held, none per reading:\n{log}"
    );
    assert!(!log.contains(SECRET), "no query text in the log");

    // A prepared transaction (one that took a transaction id) holds it the same way.
    owner
        .batch_execute("BEGIN; SELECT txid_current(); PREPARE TRANSACTION 'vh-test'")
        .await
        .unwrap();
    let metrics = wait_metrics(port, "the prepared transaction in /metrics", |m| {
        value(
            m,
            "pgtaskd_xmin_horizon_holder{kind=\"prepared_transaction\",pid=\"\",name=\"\",state=\"\"}",
        ) == Some(1.0)
    })
    .await;
    assert!(
        value(
            &metrics,
            "pgtaskd_xmin_horizon_age_seconds{kind=\"prepared_transaction\"}"
        )
        .is_some_and(|age| age >= 1.0),
        "{metrics}"
    );
    wait_readyz(port, "the prepared transaction in /readyz", |w| {
        w.iter().any(|w| w.contains("by a prepared transaction"))
    })
    .await;
    owner
        .batch_execute("COMMIT PREPARED 'vh-test'")
        .await
        .unwrap();
    wait_readyz(port, "the warning to clear again", |w| w.is_empty()).await;
    wait_metrics(port, "the horizon to clear again", |m| {
        value(m, "pgtaskd_xmin_horizon_held") == Some(0.0)
    })
    .await;

    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_tuples_and_vacuums_of_the_task_table_show_in_metrics() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    // No autovacuum may remove the dead tuples before they are seen. The table the metrics
    // are about is the state rows' (pgtaskd.task_state, schema 36), the one that takes the
    // churn.
    owner
        .batch_execute("ALTER TABLE pgtaskd.task_state SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let daemon_url = daemon_role(&db, &owner).await;
    let (mut daemon, port) = start_daemon(&daemon_url).await;
    let metrics = wait_metrics(port, "a first reading", |m| {
        value(m, "pgtaskd_table_tuples{state=\"dead\"}").is_some()
    })
    .await;
    for series in [
        "pgtaskd_table_bytes{part=\"heap\"}",
        "pgtaskd_table_bytes{part=\"toast\"}",
        "pgtaskd_table_bytes{part=\"indexes\"}",
        "pgtaskd_table_vacuum_count{by=\"autovacuum\"}",
        "pgtaskd_vacuum_health_reading_age_seconds",
    ] {
        assert!(value(&metrics, series).is_some(), "{series} in\n{metrics}");
    }
    assert_eq!(
        value(&metrics, "pgtaskd_table_vacuum_age_seconds{by=\"vacuum\"}"),
        None,
        "never vacuumed: no series"
    );

    // 500 rows of a queue nobody serves, deleted: 500 dead tuples (their state rows go with
    // them).
    owner
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload, queue)
                  SELECT repeat('x', 100), 'elsewhere' FROM generate_series(1, 500);
             DELETE FROM pgtaskd.tasks WHERE queue = 'elsewhere';",
        )
        .await
        .unwrap();
    let metrics = wait_metrics(port, "the dead tuples in /metrics", |m| {
        value(m, "pgtaskd_table_tuples{state=\"dead\"}").is_some_and(|n| n >= 500.0)
    })
    .await;
    assert!(
        value(&metrics, "pgtaskd_table_bytes{part=\"heap\"}").is_some_and(|b| b >= 8192.0),
        "{metrics}"
    );

    // A VACUUM (no horizon held on this cluster) removes them and is counted.
    owner
        .batch_execute("VACUUM pgtaskd.task_state")
        .await
        .unwrap();
    let metrics = wait_metrics(port, "the vacuum in /metrics", |m| {
        value(m, "pgtaskd_table_vacuum_count{by=\"vacuum\"}") == Some(1.0)
    })
    .await;
    assert_eq!(
        value(&metrics, "pgtaskd_table_tuples{state=\"dead\"}"),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        value(&metrics, "pgtaskd_table_vacuum_age_seconds{by=\"vacuum\"}")
            .is_some_and(|age| (0.0..60.0).contains(&age)),
        "{metrics}"
    );

    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
}
