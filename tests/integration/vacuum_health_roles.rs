//! Vacuum health read by roles other than a superuser owner (docs/design.md, "Vacuum health"):
//! roles granted before schema 9 may read it after the migration, and with a schema migrated
//! by an owner without `pg_read_all_stats` a held horizon is still named and aged by the
//! daemon. Each test has a cluster of its own, so that no other test's transaction holds the
//! horizon.

use crate::support::{connect, within, Cluster, TestDb, WAIT};
use crate::vacuum_health::{
    analyst_holds_a_snapshot, start_daemon, value, wait_metrics, wait_readyz, SECRET,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_granted_before_schema_9_may_read_the_vacuum_health_after_the_migration() {
    let cluster = Cluster::start();
    let db = TestDb::empty_on(&cluster).await;
    let mut owner = db.client().await;
    within(
        WAIT,
        "migrating to 6",
        pgtaskd::db::migrate::migrate_to(&mut owner, 6),
    )
    .await
    .unwrap();
    owner
        .batch_execute(
            "CREATE ROLE vh_old_daemon LOGIN; SELECT pgtaskd.grant_daemon('vh_old_daemon');
             CREATE ROLE vh_old_ops LOGIN; SELECT pgtaskd.grant_operator('vh_old_ops');
             CREATE ROLE vh_stranger LOGIN; GRANT USAGE ON SCHEMA pgtaskd TO vh_stranger;",
        )
        .await
        .unwrap();
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    for role in ["vh_old_daemon", "vh_old_ops"] {
        let client = connect(&db.url.replace("user=postgres", &format!("user={role}"))).await;
        let dead: i64 = client
            .query_one("SELECT dead_tuples FROM pgtaskd.vacuum_health()", &[])
            .await
            .unwrap_or_else(|err| panic!("{role}: {err}"))
            .get(0);
        assert_eq!(dead, 0, "{role}");
    }
    let stranger = connect(&db.url.replace("user=postgres", "user=vh_stranger")).await;
    let err = stranger
        .query_one("SELECT * FROM pgtaskd.vacuum_health()", &[])
        .await
        .expect_err("a role without a grant may not");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_owner_without_pg_read_all_stats_the_horizon_is_still_seen_and_aged_by_the_daemon()
{
    let cluster = Cluster::start();
    let db = TestDb::empty_on(&cluster).await;
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE vh_owner LOGIN; GRANT CREATE ON DATABASE {} TO vh_owner;
             CREATE ROLE vh_analyst LOGIN; CREATE ROLE vh_daemon LOGIN;",
            db.name
        ))
        .await
        .unwrap();
    let mut owner = connect(&db.url.replace("user=postgres", "user=vh_owner")).await;
    within(
        WAIT,
        "migrating as vh_owner",
        pgtaskd::db::migrate::migrate(&mut owner),
    )
    .await
    .unwrap();
    owner
        .batch_execute("SELECT pgtaskd.grant_daemon('vh_daemon')")
        .await
        .unwrap();
    let daemon_url = db.url.replace("user=postgres", "user=vh_daemon");
    let (mut daemon, port) = start_daemon(&daemon_url).await;
    daemon.wait_for_log("has no pg_read_all_stats").await;

    let (analyst, pid) = analyst_holds_a_snapshot(&db.url).await;
    // No state and no start for another role's session: the daemon ages it from when it
    // first saw it, and still names it.
    let holder = format!(
        "pgtaskd_xmin_horizon_holder{{kind=\"session\",pid=\"{pid}\",name=\"analyst-report\",\
         state=\"\"}}"
    );
    let metrics = wait_metrics(port, "the held horizon in /metrics", |m| {
        value(m, &holder) == Some(1.0)
    })
    .await;
    assert!(
        value(
            &metrics,
            "pgtaskd_xmin_horizon_age_seconds{kind=\"session\"}"
        )
        .is_some_and(|age| age >= 1.0),
        "{metrics}"
    );
    assert!(!metrics.contains(SECRET));
    let body = wait_readyz(port, "the /readyz warning", |w| {
        w.iter().any(|w| w.contains(&format!("pid {pid}")))
    })
    .await;
    assert!(!body.to_string().contains(SECRET));
    analyst.batch_execute("COMMIT").await.unwrap();
    wait_readyz(port, "the warning to clear", |w| w.is_empty()).await;

    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
}
