//! Least privilege: a producer role may insert, read and cancel, and nothing else; the
//! daemon works under its own role, without DDL.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::support::{connect, wait_count, Cluster, DaemonProcess, TestDb};

async fn role_client(db: &TestDb, role: &str) -> (Client, String) {
    let url = db.url.replace("user=postgres", &format!("user={role}"));
    assert_ne!(url, db.url, "the test URL names the user");
    (connect(&url).await, url)
}

/// A cluster of the test's own (roles are cluster-wide) with a migrated database, its owner's
/// client, and a login role `role` granted by `pgtaskd.{grant}(role)`, with its client and URL.
async fn database_with_role(grant: &str, role: &str) -> (Cluster, TestDb, Client, Client, String) {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    owner
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; SELECT pgtaskd.{grant}('{role}');"
        ))
        .await
        .unwrap();
    let (client, url) = role_client(&db, role).await;
    (cluster, db, owner, client, url)
}

async fn denied(client: &Client, sql: &str) {
    let err = client.batch_execute(sql).await.expect_err(sql);
    assert_eq!(
        err.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{sql}: {err}"
    );
}

/// A role without the rights a command needs is a configuration error (78, as a refused
/// password is), saying the server's words: a producer's `retry`, a role granted nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_role_has_no_right_to_exits_78() {
    let (_cluster, db, owner, _producer, url) =
        database_with_role("grant_producer", "producer").await;
    owner
        .batch_execute(
            "CREATE ROLE nobody LOGIN; \
             INSERT INTO pgtaskd.tasks (payload) VALUES ('x');",
        )
        .await
        .unwrap();
    let (status, _, stderr) = crate::support::daemon::pgtaskd(Some(&url), &["retry", "1"]).await;
    assert_eq!(status.code(), Some(78), "a producer's retry: {stderr}");
    assert!(stderr.contains("permission denied"), "{stderr}");
    let url = db.url.replace("user=postgres", "user=nobody");
    for args in [&["status", "1"][..], &["stats"], &["enqueue", "x"]] {
        let (status, _, stderr) = crate::support::daemon::pgtaskd(Some(&url), args).await;
        assert_eq!(status.code(), Some(78), "{args:?} as nobody: {stderr}");
        assert!(stderr.contains("permission denied"), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_may_insert_read_and_cancel_and_nothing_else() {
    let (_cluster, _db, _owner, producer, url) =
        database_with_role("grant_producer", "producer").await;

    // The CLI too: its schema check reads pgtaskd.schema_migrations.
    let (status, stdout, stderr) =
        crate::support::daemon::pgtaskd(Some(&url), &["enqueue", "from the cli"]).await;
    assert!(status.success(), "pgtaskd enqueue as a producer: {stderr}");
    let cli_id: i64 = stdout.trim().parse().expect("an id");
    let (status, stdout, stderr) =
        crate::support::daemon::pgtaskd(Some(&url), &["status", &cli_id.to_string()]).await;
    assert!(status.success(), "pgtaskd status as a producer: {stderr}");
    assert!(stdout.contains("QUEUED"), "{stdout}");
    // `stats` reads which queues are paused (schema 26).
    let (status, stdout, stderr) = crate::support::daemon::pgtaskd(Some(&url), &["stats"]).await;
    assert!(status.success(), "pgtaskd stats as a producer: {stderr}");
    assert!(stdout.contains("default"), "{stdout}");
    denied(
        &producer,
        "INSERT INTO pgtaskd.paused_queues (queue) VALUES ('x')",
    )
    .await;

    producer
        .batch_execute(
            "INSERT INTO pgtaskd.tasks (payload, queue, priority) VALUES ('mine', 'default', 1)",
        )
        .await
        .unwrap();
    let id: i64 = producer
        .query_one("SELECT pgtaskd.enqueue('also mine')", &[])
        .await
        .unwrap()
        .get(0);
    let status: String = producer
        .query_one("SELECT status FROM pgtaskd.task_view WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "QUEUED");
    let canceled: String = producer
        .query_one("SELECT pgtaskd.cancel($1)", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(canceled, "CANCELED");

    // The state is the daemon's, in rows of their own since schema 36 (pgtaskd.task_state,
    // which a producer may read only); the task rows a producer inserts, never updates.
    denied(&producer, "UPDATE pgtaskd.tasks SET priority = 5").await;
    denied(
        &producer,
        "UPDATE pgtaskd.task_state SET status = 'SUCCEEDED'",
    )
    .await;
    denied(&producer, "UPDATE pgtaskd.task_state SET words = 1").await;
    denied(
        &producer,
        "UPDATE pgtaskd.task_state SET lease_owner = 'me'",
    )
    .await;
    denied(
        &producer,
        "INSERT INTO pgtaskd.task_state (id, queue, priority, run_at, max_attempts, status)
         VALUES (1000000, 'default', 0, now(), 3, 'SUCCEEDED')",
    )
    .await;
    denied(&producer, "DELETE FROM pgtaskd.task_state").await;
    denied(&producer, "DELETE FROM pgtaskd.tasks").await;
    // The view is read-only, to every role (schema 24): since schema 36 it joins the task to
    // its state row, and PostgreSQL refuses to write through a join before it looks at rights
    // ("cannot update view", 55000).
    for write in [
        "UPDATE pgtaskd.task_view SET status = 'SUCCEEDED'",
        "INSERT INTO pgtaskd.task_view (payload) VALUES ('x')",
        "DELETE FROM pgtaskd.task_view",
    ] {
        let err = producer.batch_execute(write).await.expect_err(write);
        assert!(
            [
                Some(&SqlState::INSUFFICIENT_PRIVILEGE),
                Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE)
            ]
            .contains(&err.code()),
            "{write}: {err}"
        );
    }
    denied(&producer, "CREATE TABLE pgtaskd.mine (x int)").await;
    denied(&producer, "SELECT pgtaskd.grant_daemon('producer')").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_runs_under_its_role_without_ddl_rights() {
    let (_cluster, _db, owner, worker, url) = database_with_role("grant_daemon", "worker").await;
    denied(&worker, "CREATE TABLE pgtaskd.mine (x int)").await;
    denied(&worker, "DROP TABLE pgtaskd.tasks").await;
    denied(
        &worker,
        "ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify",
    )
    .await;

    let mut daemon = DaemonProcess::start_url(&url, "[retention]\nfinished_after = \"1h\"\n", &[]);
    daemon.wait_for_log("listening for notifications").await;
    owner
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'w ' || i FROM generate_series(1, 100) i",
            &[],
        )
        .await
        .unwrap();
    wait_count(
        &owner,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        100,
        "the tasks",
    )
    .await;
    let (status, stdout, stderr) =
        crate::support::daemon::pgtaskd(Some(&url), &["cancel", "1"]).await;
    assert_eq!(
        status.code(),
        Some(4),
        "cancel under the daemon role: {stdout}{stderr}"
    );
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    assert!(
        !daemon.log_text().contains("permission denied"),
        "{}",
        daemon.log_text()
    );
}

/// The flag triggers run with their owner's rights. A daemon's role writes flags, and can
/// create types and functions in its temporary schema, which is searched first for type
/// names: none of them may be taken over (schema 15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_role_cannot_borrow_the_owners_rights_through_its_temporary_schema() {
    let (_cluster, _db, owner, worker, _) = database_with_role("grant_daemon", "worker").await;
    let mut planted = String::from(
        "CREATE FUNCTION pg_temp.borrowed(v pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $f$
         BEGIN
             IF current_user <> session_user THEN
                 RAISE EXCEPTION 'ran with the rights of %', current_user;
             END IF;
             RETURN true;
         END $f$;",
    );
    for name in [
        "text",
        "bool",
        "int4",
        "int8",
        "float8",
        "timestamptz",
        "regclass",
    ] {
        planted.push_str(&format!(
            "CREATE DOMAIN pg_temp.{name} AS pg_catalog.{name} CHECK (pg_temp.borrowed(VALUE::pg_catalog.text));"
        ));
    }
    worker.batch_execute(&planted).await.unwrap();
    for write in [
        "INSERT INTO pgtaskd.idle_daemons (instance, expires_at) VALUES ('mine', now() + interval '1 minute')",
        "INSERT INTO pgtaskd.idle_daemons (instance, expires_at) VALUES ('mine', now() + interval '2 minutes')
           ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at",
        "UPDATE pgtaskd.idle_daemons SET expires_at = now() WHERE instance = 'mine'",
        "DELETE FROM pgtaskd.idle_daemons WHERE instance = 'mine'",
        "INSERT INTO pgtaskd.tasks (payload) VALUES ('enqueued by the daemon role')",
    ] {
        worker
            .batch_execute(write)
            .await
            .unwrap_or_else(|err| panic!("{write}: {err:?}"));
    }
    let superuser: bool = owner
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = 'worker'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!superuser);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_role_granted_before_schema_3_may_claim_finish_and_prune_after_the_upgrade() {
    let cluster = Cluster::start();
    let db = TestDb::empty_on(&cluster).await;
    let mut owner = db.client().await;
    // Schema 2, as an earlier pgtaskd left it, with a daemon role granted then.
    pgtaskd::db::migrate::migrate_to(&mut owner, 2)
        .await
        .unwrap();
    owner
        .batch_execute("CREATE ROLE worker LOGIN; SELECT pgtaskd.grant_daemon('worker');")
        .await
        .unwrap();
    let later: Vec<i32> = pgtaskd::db::migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|&v| v > 2)
        .collect();
    assert_eq!(
        pgtaskd::db::migrate::migrate(&mut owner).await.unwrap(),
        later
    );
    let finish =
        "pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[], boolean)";
    let may: bool = owner
        .query_one(
            &format!("SELECT has_function_privilege('worker', '{finish}', 'EXECUTE')"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        may,
        "the upgrade grants the new finish to the daemon's role"
    );
    let nobody: bool = owner
        .query_one(
            &format!("SELECT has_function_privilege('public', '{finish}', 'EXECUTE')"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!nobody, "and to nobody else");
    let flags: bool = owner
        .query_one(
            "SELECT has_table_privilege('worker', 'pgtaskd.idle_daemons', 'INSERT, UPDATE, DELETE')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(flags, "the upgrade lets the daemon's role flag itself idle");
    let prune = "pgtaskd.prune(float8, bigint, timestamptz)";
    let (may, anyone): (bool, bool) = {
        let row = owner
            .query_one(
                &format!(
                    "SELECT has_function_privilege('worker', '{prune}', 'EXECUTE'),
                            has_function_privilege('public', '{prune}', 'EXECUTE')"
                ),
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(
        may && !anyone,
        "the upgrade grants retention's batch (schema 13) to the daemon's role only"
    );

    let (_, url) = role_client(&db, "worker").await;
    owner
        .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('after the upgrade')")
        .await
        .unwrap();
    // Retention on: the finished task is then pruned under the same role.
    let mut daemon = DaemonProcess::start_url(&url, "[retention]\nfinished_after = \"1s\"\n", &[]);
    wait_count(
        &owner,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED' OR finished_at IS NULL",
        0,
        "the task to finish and be pruned under the daemon's role",
    )
    .await;
    daemon.signal(libc::SIGTERM);
    assert_eq!(daemon.wait().await.code(), Some(0), "{}", daemon.log_text());
    assert!(
        !daemon.log_text().contains("permission denied"),
        "{}",
        daemon.log_text()
    );
}
