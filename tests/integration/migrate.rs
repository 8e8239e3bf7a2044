//! Migrations: applied once, under a lock; a schema or database pgtaskd does not know is
//! refused with exit 78, by `run` and by every one-shot command. What particular schema
//! versions do to an existing database is in `upgrades`.

use crate::support::daemon::pgtaskd;
use crate::support::{within, TestDb, WAIT};

#[tokio::test]
async fn migrate_twice_is_a_no_op() {
    let db = TestDb::empty().await;
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["migrate"]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("applied migration 1"));
    assert!(stdout.contains("applied migration 2"));
    assert!(stdout.contains("applied migration 3"));
    assert!(stdout.contains("applied migration 4"));
    assert!(stdout.contains("applied migration 5"));
    assert!(stdout.contains("applied migration 6"));
    assert!(stdout.contains("applied migration 9"));
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["migrate"]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("schema is up to date"), "{stdout}");
    let client = db.client().await;
    let row = client
        .query_one("SELECT count(*) FROM pgtaskd.schema_migrations", &[])
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        pgtaskd::db::migrate::MIGRATIONS.len() as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_apply_each_version_once() {
    let db = TestDb::empty().await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move { pgtaskd(Some(&url), &["migrate"]).await })
        })
        .collect();
    let mut applied = 0;
    for run in runs {
        let (status, stdout, stderr) = run.await.unwrap();
        assert!(status.success(), "{stderr}");
        applied += stdout.matches("applied migration").count();
    }
    let versions = pgtaskd::db::migrate::MIGRATIONS.len();
    assert_eq!(
        applied, versions,
        "each migration was applied by exactly one run"
    );
}

#[tokio::test]
async fn run_refuses_a_database_without_the_schema() {
    let db = TestDb::empty().await;
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["run"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("pgtaskd migrate"), "{stderr}");
}

#[tokio::test]
async fn run_refuses_a_schema_newer_than_the_binary() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO pgtaskd.schema_migrations (version, name) VALUES (999, '0999_future')",
            &[],
        )
        .await
        .unwrap();
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["run"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("version 999, newer than this binary"),
        "{stderr}"
    );
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["migrate"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
}

#[tokio::test]
async fn a_database_that_is_not_utf8_is_refused() {
    let db =
        TestDb::create("ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'").await;
    for args in [&["migrate"][..], &["run", "--migrate"]] {
        let (status, _, stderr) = pgtaskd(Some(&db.url), args).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stderr}");
        assert!(stderr.contains("needs UTF8"), "{stderr}");
    }
    let client = db.client().await;
    let row = client
        .query_one("SELECT to_regnamespace('pgtaskd') IS NULL", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "nothing was installed");
}

/// A fresh database migrated up to `version`, and a session on it.
pub(crate) async fn database_at(version: i32) -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::empty().await;
    let mut client = db.client().await;
    within(
        WAIT,
        "an older schema",
        pgtaskd::db::migrate::migrate_to(&mut client, version),
    )
    .await
    .unwrap();
    (db, client)
}

/// Every one-shot command, with the arguments it needs.
const ONE_SHOT_COMMANDS: &[&[&str]] = &[
    &["enqueue", "text"],
    &["status", "1"],
    &["cancel", "1"],
    &["retry", "1"],
    &["list"],
    &["stats"],
    &["pause", "reports"],
    &["resume", "reports"],
    &["wait", "1", "--timeout", "1s"],
];

/// A statement of an older or newer schema can succeed and mean something else: the one-shot
/// commands check the version before their statement, and say what `run` says.
#[tokio::test]
async fn one_shot_commands_refuse_an_older_schema_and_a_newer_one() {
    let (older, client) = database_at(pgtaskd::db::migrate::LATEST_VERSION - 1).await;
    for args in ONE_SHOT_COMMANDS {
        let (status, stdout, stderr) = pgtaskd(Some(&older.url), args).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stdout} {stderr}");
        assert!(
            stderr.contains("older than this binary") && stderr.contains("run `pgtaskd migrate`"),
            "{args:?}: {stderr}"
        );
    }
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pgtaskd.tasks) + (SELECT count(*) FROM pgtaskd.paused_queues)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 0, "nothing was written");

    let newer = TestDb::new().await;
    newer
        .client()
        .await
        .execute(
            "INSERT INTO pgtaskd.schema_migrations (version, name) VALUES (999, '0999_future')",
            &[],
        )
        .await
        .unwrap();
    for args in ONE_SHOT_COMMANDS {
        let (status, stdout, stderr) = pgtaskd(Some(&newer.url), args).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stdout} {stderr}");
        assert!(
            stderr.contains("version 999, newer than this binary")
                && stderr.contains("upgrade pgtaskd"),
            "{args:?}: {stderr}"
        );
    }
}
