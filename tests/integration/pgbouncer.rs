//! pgtaskd behind a real PgBouncer in transaction pooling mode (docs/operations.md, "Behind
//! PgBouncer"): the pool and the one-shot commands go through the pooler with
//! `database.pooler = "transaction"`, the LISTEN session goes to PostgreSQL itself through
//! `database.listen_url`, and a LISTEN session pointed at the pooler is a configuration error
//! (exit 78) that says to give it a direct connection.

use std::time::{Duration, Instant};

use crate::support::daemon::{pgtaskd, tempfile_path::TempPath};
use crate::support::pgbouncer::PgBouncer;
use crate::support::{
    assert_all_succeeded, count, insert_payloads, wait_count, within, DaemonProcess, TestDb, WAIT,
};

/// The daemon's configuration behind `bouncer`: the pool through it, LISTEN direct, a poll
/// interval so long that only a notification can wake it.
fn behind(db: &TestDb) -> String {
    format!(
        "[database]\n\
         pooler = \"transaction\"\n\
         listen_url = \"{}\"\n\
         [worker]\n\
         poll_interval = \"1h\"\n",
        db.url
    )
}

/// `pgtaskd --config FILE ARGS` with `database.url` through `bouncer`.
async fn cli(
    bouncer: &PgBouncer,
    db: &TestDb,
    config: &TempPath,
    args: &[&str],
) -> (std::process::ExitStatus, String, String) {
    let mut all = vec!["--config", config.path().to_str().unwrap()];
    all.extend_from_slice(args);
    pgtaskd(Some(&bouncer.url(&db.name)), &all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_behind_pgbouncer_drains_2000_tasks_once_and_wakes_on_notifications() {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(&[]);
    let client = db.client().await;
    let mut daemon = DaemonProcess::start_url(&bouncer.url(&db.name), &behind(&db), &[]);
    daemon.wait_for_log("listening for notifications").await;

    let drain = Instant::now();
    insert_payloads(&client, 2000).await;
    let all_done = "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'";
    wait_count(
        &client,
        all_done,
        2000,
        "2,000 tasks drained through pgbouncer",
    )
    .await;
    let drained_in = drain.elapsed();

    // Idle now, with an hour to the next poll: only the notification can start this one.
    let started = Instant::now();
    let id = crate::support::enqueue(&client, "one more, while idle").await;
    within(Duration::from_secs(10), "the woken task", async {
        crate::support::wait_status(&client, id, pgtaskd::queue::TaskStatus::Succeeded).await
    })
    .await;
    let woke_in = started.elapsed();

    assert_eq!(assert_all_succeeded(&client, Some(1)).await, 2001);
    let log = daemon.log_text();
    for trouble in ["prepared statement", "unsupported startup parameter"] {
        assert!(
            !log.contains(trouble),
            "{trouble:?} in the daemon's log:\n{log}"
        );
    }
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
    assert!(
        woke_in < Duration::from_secs(5),
        "the idle daemon took {woke_in:?} to run a new task"
    );
    eprintln!(
        "behind pgbouncer: 2,000 tasks drained in {drained_in:?}; \
         a task inserted while idle finished in {woke_in:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_works_through_pgbouncer_in_transaction_mode() {
    let db = TestDb::empty().await;
    let bouncer = PgBouncer::start(&[]);
    let config = TempPath::write(&behind(&db));

    let (status, stdout, stderr) = cli(&bouncer, &db, &config, &["migrate"]).await;
    assert!(
        status.success(),
        "migrate through pgbouncer: {stdout}{stderr}"
    );
    let (status, stdout, stderr) =
        cli(&bouncer, &db, &config, &["check-config", "--connect"]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("pooler = transaction"), "{stdout}");
    let (status, stdout, stderr) = cli(&bouncer, &db, &config, &["enqueue", "a b c"]).await;
    assert!(status.success(), "{stderr}");
    let id: i64 = stdout.trim().parse().expect("enqueue prints the id");
    let file = TempPath::write("from a file, through the pooler");
    let (status, stdout, stderr) = cli(
        &bouncer,
        &db,
        &config,
        &["enqueue", "--file", file.path().to_str().unwrap()],
    )
    .await;
    assert!(status.success(), "enqueue --file: {stderr}");
    let from_file: i64 = stdout.trim().parse().unwrap();

    let (status, stdout, stderr) = cli(&bouncer, &db, &config, &["status", &id.to_string()]).await;
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.starts_with(&format!("task {id}: QUEUED")),
        "{stdout}"
    );
    let (status, stdout, stderr) = cli(&bouncer, &db, &config, &["list", "--json"]).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    let (status, stdout, stderr) = cli(
        &bouncer,
        &db,
        &config,
        &["list", "--queue", "default", "--limit", "1"],
    )
    .await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains(&from_file.to_string()), "{stdout}");
    let (status, _, stderr) = cli(&bouncer, &db, &config, &["cancel", &id.to_string()]).await;
    assert!(status.success(), "{stderr}");
    let (status, stdout, stderr) = cli(&bouncer, &db, &config, &["stats", "--json"]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("default"), "{stdout}");
    for run in 0..3 {
        // Again and again: a named statement would now collide or be missing.
        let (status, _, stderr) = cli(&bouncer, &db, &config, &["status", &id.to_string()]).await;
        assert!(status.success(), "status, run {run}: {stderr}");
    }
    let client = db.client().await;
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'CANCELED'"
        )
        .await,
        1
    );
    // `wait` LISTENs: on database.listen_url, whose session reaches PostgreSQL itself.
    let (status, stdout, stderr) = cli(
        &bouncer,
        &db,
        &config,
        &["wait", &id.to_string(), "--timeout", "10s"],
    )
    .await;
    assert_eq!(status.code(), Some(1), "a CANCELED task: {stdout}{stderr}");
    assert!(stdout.contains("CANCELED"), "{stdout}");

    // Without database.pooler, pgtaskd sends its startup options and PgBouncer refuses them:
    // a configuration error that says what to set.
    let (status, _, stderr) = pgtaskd(Some(&bouncer.url(&db.name)), &["stats"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("database.pooler = \"transaction\""),
        "{stderr}"
    );
}

/// A database whose sessions default to `serializable` (sessions started after it get it).
async fn serializable_by_default() -> TestDb {
    let db = TestDb::new().await;
    within(
        WAIT,
        "a serializable default",
        db.client().await.batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation = 'serializable'",
            db.name
        )),
    )
    .await
    .unwrap();
    db
}

/// Start a daemon whose LISTEN session goes through `bouncer`, and check that it exits 78
/// saying to give database.listen_url a direct connection.
async fn refused_at_start(bouncer: &PgBouncer, db: &TestDb, listen_url: Option<&str>) -> String {
    let mut toml = "[database]\npooler = \"transaction\"\n".to_string();
    if let Some(url) = listen_url {
        toml.push_str(&format!("listen_url = \"{url}\"\n"));
    }
    let mut daemon = DaemonProcess::start_url(&bouncer.url(&db.name), &toml, &[]);
    let status = within(WAIT, "the daemon to refuse", daemon.wait()).await;
    let log = daemon.log_text();
    assert_eq!(status.code(), Some(78), "{log}");
    assert!(
        log.contains("set database.listen_url to a direct connection"),
        "{log}"
    );
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_listen_session_goes_through_the_pooler_exits_78() {
    let db = TestDb::new().await;
    // PgBouncer as installed: it refuses the startup options the LISTEN session sends.
    let strict = PgBouncer::start(&[]);
    let log = refused_at_start(&strict, &db, Some(&strict.url(&db.name))).await;
    assert!(log.contains("refused the startup options"), "{log}");
    // check-config --connect says the same.
    let config = TempPath::write(&format!(
        "[database]\npooler = \"transaction\"\nlisten_url = \"{}\"\n",
        strict.url(&db.name)
    ));
    let (status, _, stderr) = cli(&strict, &db, &config, &["check-config", "--connect"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("set database.listen_url to a direct connection"),
        "{stderr}"
    );

    // One told to ignore them: the LISTEN works, and a notification never arrives.
    let lenient = PgBouncer::start(&["ignore_startup_parameters = options"]);
    let started = Instant::now();
    let log = refused_at_start(&lenient, &db, None).await;
    assert!(
        log.contains("database.listen_url (not set, so the same as database.url)")
            && log.contains("did not arrive"),
        "{log}"
    );
    eprintln!(
        "a LISTEN session behind the pooler was refused {:?} after start",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_pooler_a_role_whose_sessions_default_to_serializable_is_refused_at_start() {
    let db = serializable_by_default().await;
    // Started after the ALTER: its server sessions are new, and get the default.
    let bouncer = PgBouncer::start(&[]);
    let mut daemon = DaemonProcess::start_url(&bouncer.url(&db.name), &behind(&db), &[]);
    let status = within(WAIT, "the daemon to refuse", daemon.wait()).await;
    let log = daemon.log_text();
    assert_eq!(status.code(), Some(78), "{log}");
    assert!(
        log.contains("default_transaction_isolation is \"serializable\"")
            && log.contains("SET default_transaction_isolation = 'read committed';"),
        "{log}"
    );
}

/// A pooler told to drop the startup options (`ignore_startup_parameters = options`) with
/// `database.pooler` left at its default: the sessions get the database's defaults instead of
/// the options'. A `serializable` default refused every finish (the tasks stayed RUNNING while
/// the daemon said it was ready); it is refused at start, saying the options were dropped, and
/// `check-config --connect` says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_options_dropped_by_the_pooler_are_refused_at_start() {
    let db = serializable_by_default().await;
    let lenient = PgBouncer::start(&["ignore_startup_parameters = options"]);
    let toml = format!("[database]\nlisten_url = \"{}\"\n", db.url);
    let mut daemon = DaemonProcess::start_url(&lenient.url(&db.name), &toml, &[]);
    let status = within(WAIT, "the daemon to refuse", daemon.wait()).await;
    let log = daemon.log_text();
    assert_eq!(status.code(), Some(78), "{log}");
    assert!(
        log.contains("default_transaction_isolation is \"serializable\"")
            && log.contains("the options are dropped on the way"),
        "{log}"
    );
    let config = TempPath::write(&toml);
    let (status, _, stderr) = cli(&lenient, &db, &config, &["check-config", "--connect"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("the options are dropped on the way"),
        "{stderr}"
    );
}
