//! Producers' rights against the notify trigger (docs/design.md, "Idle flags"): a producer
//! with only INSERT on the tasks table notifies an idle daemon (the trigger reads the flags
//! with its owner's rights); a producer's search_path cannot reach into the trigger; a
//! producer that may not read the `pgtaskd.idle_until` hint still inserts, unnotified.

use std::sync::Arc;

use crate::idle_notify::{
    insert_notifies, listening, notified_before_marker, wait_done_promptly, wait_flags, RoundGate,
    LONG_POLL,
};
use crate::support::{count, within, Cluster, InProcessDaemon, TestDb, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_with_only_insert_on_the_table_notifies_an_idle_daemon() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    owner
        .batch_execute(
            "CREATE ROLE inserter LOGIN;
             GRANT USAGE ON SCHEMA pgtaskd TO inserter;
             GRANT INSERT (payload) ON pgtaskd.tasks TO inserter;",
        )
        .await
        .unwrap();
    let url = db.url.replace("user=postgres", "user=inserter");
    assert_ne!(url, db.url, "the test URL names the user");
    let (producer, mut messages, _guard) = listening(&url).await;
    let denied = producer
        .query("SELECT count(*) FROM pgtaskd.idle_daemons", &[])
        .await
        .expect_err("a producer cannot read the flags");
    assert_eq!(
        denied.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{denied:?}"
    );
    let daemon =
        InProcessDaemon::start(&db, db.config(LONG_POLL), Arc::new(RoundGate::default())).await;
    wait_flags(&owner, 1, "the daemon to flag itself idle").await;
    producer
        .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('no rights on the flags')")
        .await
        .unwrap();
    assert!(
        notified_before_marker(&producer, &mut messages, "marker").await,
        "the trigger reads the flags with its owner's rights"
    );
    let id = count(&owner, "SELECT max(id) FROM pgtaskd.task_view").await;
    wait_done_promptly(&owner, id, "the task").await;
    daemon.stop().await;
}

/// The trigger's function runs with its owner's rights and sets no search_path of its own
/// (schema 10: setting one on every call cost a fifth of the producers' commits), so it names
/// every function and operator it uses. A producer whose search_path puts its own `now()`,
/// `pg_notify` and `>` first must not get them called with the owner's rights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_search_path_cannot_reach_into_the_trigger() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    owner
        .batch_execute(
            "CREATE ROLE mallory LOGIN;
             SELECT pgtaskd.grant_producer('mallory');
             CREATE SCHEMA mallory AUTHORIZATION mallory;
             INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
             VALUES ('a-flagged-daemon', now() + interval '1 hour');",
        )
        .await
        .unwrap();
    let url = db.url.replace("user=postgres", "user=mallory");
    assert_ne!(url, db.url, "the test URL names the user");
    let (producer, mut messages, _guard) = listening(&url).await;
    producer
        .batch_execute(
            "CREATE FUNCTION mallory.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'now() hijacked as %', current_user; END $$;
             CREATE FUNCTION mallory.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'pg_notify hijacked as %', current_user; END $$;
             CREATE FUNCTION mallory.later(timestamptz, timestamptz) RETURNS boolean
             LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION '> hijacked as %', current_user; END $$;
             CREATE OPERATOR mallory.> (
                 LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = mallory.later);
             SET search_path = mallory, pg_catalog;",
        )
        .await
        .unwrap();
    // The traps are armed: unqualified names reach them in this session.
    for (sql, trap) in [
        ("SELECT now()", "now() hijacked"),
        ("SELECT pg_notify('x', '')", "pg_notify hijacked"),
        ("SELECT now() > now()", "hijacked"),
    ] {
        let err = producer
            .batch_execute(sql)
            .await
            .expect_err("the producer's own objects come first");
        assert!(format!("{err:?}").contains(trap), "{sql}: {err:?}");
    }
    producer
        .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('past the traps')")
        .await
        .expect("the trigger calls none of the producer's objects");
    assert!(
        notified_before_marker(&producer, &mut messages, "marker").await,
        "with a live flag, the insert notified through pg_catalog's pg_notify"
    );
}

/// The trigger's condition reads `pgtaskd.idle_until`, granted to PUBLIC. Where that grant
/// was revoked, a producer still inserts; its inserts just never notify (the daemons find
/// them at their poll tick), while a role that may read it still notifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_that_may_not_read_the_idle_hint_still_inserts() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    within(
        WAIT,
        "the role",
        owner.batch_execute(
            "CREATE ROLE unhinted LOGIN;
             SELECT pgtaskd.grant_producer('unhinted');
             REVOKE SELECT ON SEQUENCE pgtaskd.idle_until FROM PUBLIC;
             INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
             VALUES ('a-flagged-daemon', now() + interval '1 hour');",
        ),
    )
    .await
    .unwrap();
    let url = db.url.replace("user=postgres", "user=unhinted");
    assert_ne!(url, db.url, "the test URL names the user");
    let (producer, mut messages, _guard) = listening(&url).await;
    within(
        WAIT,
        "the unhinted insert",
        producer.batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('unhinted')"),
    )
    .await
    .expect("a role without SELECT on the sequence still inserts");
    assert!(
        !notified_before_marker(&producer, &mut messages, "marker unhinted").await,
        "its insert does not notify"
    );
    let (_, notified) = insert_notifies(&owner, &mut messages, "hinted").await;
    assert!(notified, "the owner's insert, with a live flag, notifies");
}
