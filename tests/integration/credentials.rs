//! Settings the database refuses (a wrong password, an unknown role, no `pg_hba.conf` entry, a
//! missing database, a password it asks for and is not given) and databases without the
//! schema are configuration errors: exit 78 with the server's words and a hint, at once. Only a
//! refusal that comes after the daemon has run (a rotated password) is waited out, and
//! readiness says why.

use std::process::ExitStatus;

use reqwest::StatusCode;

use crate::support::daemon::binary;
use crate::support::probe::{get, wait_answer};
use crate::support::{eventually, free_port, within, Cluster, DaemonProcess, TestDb, WAIT};

/// The cluster's `pg_hba.conf`: the tests' superuser as before, and, over TCP, a role that
/// must give a password, a role that does not exist under trust (so that the server says it
/// does not exist), and no entry for anyone else.
const PASSWORD_HBA: &str = "\
local all all trust
host all postgres 127.0.0.1/32 trust
host all ghost 127.0.0.1/32 trust
host all alice 127.0.0.1/32 scram-sha-256
";

/// A cluster of its own where `alice` (a superuser) must log in with `password`.
async fn password_cluster(password: &str) -> Cluster {
    let cluster = Cluster::start_with(&[], &[("pg_hba.conf", PASSWORD_HBA)]);
    let admin = crate::support::conninfo(&cluster.config("postgres"), "postgres");
    let client = crate::support::connect(&admin).await;
    within(
        WAIT,
        "CREATE ROLE alice",
        client.batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE alice LOGIN SUPERUSER PASSWORD '{password}'"
        )),
    )
    .await
    .expect("create the role alice");
    cluster
}

fn url(cluster: &Cluster, user: &str, password: Option<&str>, dbname: &str) -> String {
    let mut url = format!(
        "host=127.0.0.1 port={} user={user} dbname={dbname} connect_timeout=5",
        cluster.port
    );
    if let Some(password) = password {
        url.push_str(&format!(" password={password}"));
    }
    url
}

/// `pgtaskd ARGS` against `url`, with no libpq variable of the test's environment in the way.
async fn pgtaskd(url: &str, args: &[&str]) -> (ExitStatus, String, String) {
    let mut command = tokio::process::Command::new(binary());
    command.args(args).env_remove("PGTASKD_CONFIG");
    for name in ["PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE"] {
        command.env_remove(name);
    }
    command.env("PGTASKD_DATABASE_URL", url);
    let output = within(WAIT, &format!("pgtaskd {args:?}"), command.output())
        .await
        .expect("pgtaskd runs");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_the_database_refuses_exit_78_with_the_servers_message_and_a_hint() {
    let cluster = password_cluster("right").await;
    let db = TestDb::on(&cluster).await;
    let cases = [
        (
            "a wrong password",
            url(&cluster, "alice", Some("wrong"), &db.name),
            "password authentication failed for user \"alice\"",
            "~/.pgpass",
        ),
        (
            "a password required but not given",
            url(&cluster, "alice", None, &db.name),
            "the server asked for a password",
            "~/.pgpass",
        ),
        (
            "an unknown role",
            url(&cluster, "ghost", None, &db.name),
            "role \"ghost\" does not exist",
            "PGUSER",
        ),
        (
            "no pg_hba.conf entry",
            url(&cluster, "mallory", Some("x"), &db.name),
            "no pg_hba.conf entry",
            "pg_hba.conf",
        ),
        (
            "a missing database",
            url(&cluster, "postgres", None, "no_such_database"),
            "database \"no_such_database\" does not exist",
            "PGDATABASE",
        ),
        (
            "a startup setting the server does not know",
            format!(
                "{} options='-c bogus_param=1'",
                url(&cluster, "postgres", None, &db.name)
            ),
            "unrecognized configuration parameter \"bogus_param\"",
            "options=-c",
        ),
        (
            "a startup setting's value the server refuses",
            format!(
                "{} options='-c statement_timeout=xyz'",
                url(&cluster, "postgres", None, &db.name)
            ),
            "statement_timeout",
            "options=-c",
        ),
    ];
    for (what, url, message, hint) in cases {
        let (status, stdout, stderr) = pgtaskd(&url, &["status", "1"]).await;
        assert_eq!(status.code(), Some(78), "{what}: {stderr}");
        assert!(stdout.is_empty(), "{what}: {stdout}");
        assert!(stderr.contains(message), "{what}: {stderr}");
        assert!(stderr.contains(hint), "{what}: {stderr}");
        assert!(!stderr.contains("unavailable"), "{what}: {stderr}");
    }
    // The hint says where the password must come from, since pgtaskd does not read ~/.pgpass.
    let (_, _, stderr) = pgtaskd(&url(&cluster, "alice", None, &db.name), &["status", "1"]).await;
    assert!(stderr.contains("PGPASSWORD"), "{stderr}");
    // The right password works, and is told apart from all of the above.
    let (status, _, stderr) = pgtaskd(
        &url(&cluster, "alice", Some("right"), &db.name),
        &["status", "1"],
    )
    .await;
    assert_eq!(status.code(), Some(3), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_wrong_password_exits_78_at_once_instead_of_waiting() {
    let cluster = password_cluster("right").await;
    let db = TestDb::on(&cluster).await;
    let mut daemon =
        DaemonProcess::start_url(&url(&cluster, "alice", Some("wrong"), &db.name), "", &[]);
    let status = daemon.wait().await;
    assert_eq!(status.code(), Some(78), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(
        log.contains("password authentication failed for user \"alice\""),
        "{log}"
    );
    assert!(log.contains("~/.pgpass"), "{log}");
    assert!(!log.contains("waiting for it"), "{log}");
}

#[tokio::test]
async fn status_enqueue_and_cancel_without_the_schema_exit_78_with_the_migrate_hint() {
    let db = TestDb::empty().await;
    for args in [&["status", "1"][..], &["enqueue", "x"], &["cancel", "1"]] {
        let (status, stdout, stderr) = pgtaskd(&db.url, args).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(
            stderr.contains("run `pgtaskd migrate`"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("SQLSTATE"), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_and_readyz_says_why_while_run_waits_for_the_database_at_start() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    cluster.stop_server(true);
    let port = free_port();
    let mut daemon = DaemonProcess::start(
        &db,
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n[database]\nconnect_timeout = \"1s\"\n"),
        &[],
    );
    daemon
        .wait_for_log("database unavailable; waiting for it")
        .await;
    wait_answer(port, "/healthz", StatusCode::OK, "/healthz while waiting").await;
    let body = wait_answer(
        port,
        "/readyz",
        StatusCode::SERVICE_UNAVAILABLE,
        "/readyz while waiting",
    )
    .await;
    assert_eq!(body["status"], "not ready", "{body}");
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("waiting for the database") && reason.contains("unavailable"),
        "{body}"
    );
    cluster.start_server();
    wait_answer(
        port,
        "/readyz",
        StatusCode::OK,
        "/readyz once the database is up",
    )
    .await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_rotated_under_a_running_daemon_is_waited_out_and_readyz_says_why() {
    let cluster = password_cluster("right").await;
    let db = TestDb::on(&cluster).await;
    let port = free_port();
    let mut daemon = DaemonProcess::start_url(
        &url(&cluster, "alice", Some("right"), &db.name),
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"),
        &[],
    );
    wait_answer(port, "/readyz", StatusCode::OK, "the daemon to be ready").await;

    // Rotate the password, then end the daemon's sessions: every new one is refused.
    let admin = db.client().await;
    let rotate = |password: &'static str| {
        let admin = &admin;
        async move {
            within(
                WAIT,
                "ALTER ROLE",
                admin.batch_execute(&format!("ALTER ROLE alice PASSWORD '{password}'")),
            )
            .await
            .expect("change alice's password");
        }
    };
    rotate("rotated").await;
    within(
        WAIT,
        "pg_terminate_backend",
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE application_name LIKE 'pgtaskd/%'",
            &[],
        ),
    )
    .await
    .expect("terminate the daemon's sessions");
    let body = eventually(WAIT, "/readyz to name the refusal", || async {
        get(port, "/readyz").await.filter(|(status, body)| {
            *status == StatusCode::SERVICE_UNAVAILABLE
                && body["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("password authentication failed"))
        })
    })
    .await
    .1;
    assert_eq!(body["status"], "not ready", "{body}");
    wait_answer(port, "/healthz", StatusCode::OK, "/healthz while refused").await;
    daemon
        .wait_for_log("the database refused the listener's session")
        .await;

    // Put the password back: the daemon recovers by itself and works again.
    rotate("right").await;
    wait_answer(port, "/readyz", StatusCode::OK, "/readyz after the fix").await;
    let id = crate::support::enqueue(&admin, "after the rotation").await;
    crate::support::wait_status(&admin, id, pgtaskd::queue::TaskStatus::Succeeded).await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_run_migrate_name_the_database_but_never_the_password() {
    let password = "pw-never-shown-7f3a";
    let cluster = password_cluster(password).await;
    let db = TestDb::empty_on(&cluster).await;
    let alice = url(&cluster, "alice", Some(password), &db.name);
    let named = format!(
        "database \"{}\" on host 127.0.0.1, port {}, as user \"alice\"",
        db.name, cluster.port
    );
    let (status, stdout, stderr) = pgtaskd(&alice, &["migrate"]).await;
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.starts_with(&format!("migrating {named}\n")),
        "{stdout}"
    );
    assert!(
        !format!("{stdout}{stderr}").contains(password),
        "{stdout}{stderr}"
    );

    let mut daemon = DaemonProcess::start_url(&alice, "", &["--migrate"]);
    daemon.wait_for_log(&format!("migrating {named}")).await;
    daemon.wait_for_log("schema checked").await;
    daemon.stop_cleanly().await;
    let log = daemon.log_text();
    assert!(
        log.contains("database=") && log.contains("user=alice"),
        "{log}"
    );
    assert!(!log.contains(password), "{log}");
}

/// A password on the command line is readable by every local user (`/proc/PID/cmdline`): the
/// daemon says so, and where to give it instead; one in `PGTASKD_DATABASE_URL` is not warned of.
#[tokio::test]
async fn a_password_in_the_database_url_flag_is_warned_of() {
    let db = TestDb::new().await;
    let with_password = if db.url.contains("password=") {
        db.url.clone()
    } else {
        // The tests' server trusts the connection: the password is not checked.
        format!("{} password=on-the-command-line", db.url)
    };
    let config = "[worker]\nqueues = [\"default\"]\n";
    let mut flagged = DaemonProcess::start(&db, config, &["--database-url", &with_password]);
    flagged
        .wait_for_log("--database-url holds a password, which every local user can read")
        .await;
    flagged.wait_for_log("listening for notifications").await;
    flagged.stop_cleanly().await;
    let mut from_env = DaemonProcess::start_url(&with_password, config, &[]);
    from_env.wait_for_log("listening for notifications").await;
    assert!(
        !from_env.log_text().contains("holds a password"),
        "{}",
        from_env.log_text()
    );
    from_env.stop_cleanly().await;
}
