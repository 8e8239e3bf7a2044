//! Idempotent enqueue: a key unique per queue, from SQL, the CLI and HTTP; thirty enqueues
//! racing with one key give one task; a producer whose enqueue's answer was lost after the
//! commit retries with its key and gets the same task, run once.

use std::sync::Arc;

use tokio::sync::Barrier;
use tokio_postgres::NoTls;

use crate::support::daemon::pgtaskd;
use crate::support::proxy::{Fault, Proxy};
use crate::support::{
    count, server_addr, server_user, wait_status, within, GatedAnalyzer, InProcessDaemon, TestDb,
    WAIT,
};
use pgtaskd::queue::{self, Enqueued, NewTask, TaskStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_concurrent_enqueues_with_one_key_give_one_task() {
    const PRODUCERS: usize = 30;
    let db = TestDb::new().await;
    for round in 0..3 {
        let key = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(PRODUCERS));
        let mut producers = Vec::new();
        for i in 0..PRODUCERS {
            let (client, barrier, key) = (db.client().await, Arc::clone(&barrier), key.clone());
            producers.push(tokio::spawn(async move {
                barrier.wait().await;
                if i % 2 == 0 {
                    let row = client
                        .query_one(
                            "SELECT pgtaskd.enqueue('same text', idempotency_key => $1)",
                            &[&key],
                        )
                        .await
                        .unwrap();
                    row.get::<_, i64>(0)
                } else {
                    let task = NewTask {
                        idempotency_key: Some(key),
                        ..NewTask::new("default", "same text")
                    };
                    let enqueued = queue::enqueue(&client, &task).await.unwrap();
                    assert!(!matches!(enqueued, Enqueued::KeyConflict(_)));
                    enqueued.id()
                }
            }));
        }
        let mut ids = Vec::new();
        for producer in producers {
            ids.push(within(WAIT, "a producer", producer).await.unwrap());
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "round {round}: {ids:?}");
    }
    let client = db.client().await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        3
    );
}

#[tokio::test]
async fn a_key_names_its_task_after_it_finished_per_queue_and_on_conflict_do_nothing_works() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let first: i64 = client
        .query_one("SELECT pgtaskd.enqueue('a', idempotency_key => 'k')", &[])
        .await
        .unwrap()
        .get(0);
    client
        .execute("SELECT pgtaskd.cancel($1)", &[&first])
        .await
        .unwrap();
    let again: i64 = client
        .query_one("SELECT pgtaskd.enqueue('b', idempotency_key => 'k')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, first, "the finished task still holds its key");
    let elsewhere: i64 = client
        .query_one(
            "SELECT pgtaskd.enqueue('a', 'other', idempotency_key => 'k')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(elsewhere, first, "keys are per queue");
    let inserted = client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, idempotency_key) VALUES ('c', 'k')
             ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(inserted, 0);
    let unkeyed: i64 = client
        .query_one("SELECT pgtaskd.enqueue('a')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(unkeyed > elsewhere);
    let task = NewTask {
        idempotency_key: Some("k".into()),
        ..NewTask::new("default", "another payload")
    };
    assert_eq!(
        queue::enqueue(&client, &task).await.unwrap(),
        Enqueued::KeyConflict(first)
    );
}

#[tokio::test]
async fn a_producer_role_may_enqueue_with_a_key_and_nothing_more() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let role = format!("producer_{}", db.name);
    client
        .batch_execute(&format!(
            "CREATE ROLE {role}; SELECT pgtaskd.grant_producer('{role}');"
        ))
        .await
        .unwrap();
    let check = |table: &'static str, privilege: &'static str, column: &'static str| {
        let (client, role) = (&client, role.clone());
        async move {
            client
                .query_one(
                    "SELECT has_column_privilege($1, $2::text, $3, $4)",
                    &[&role, &table, &column, &privilege],
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    assert!(check("pgtaskd.tasks", "INSERT", "idempotency_key").await);
    assert!(!check("pgtaskd.tasks", "UPDATE", "idempotency_key").await);
    // The status is in the state rows since schema 36.
    assert!(!check("pgtaskd.task_state", "INSERT", "status").await);
    let may: bool = client
        .query_one(
            "SELECT has_function_privilege($1, 'pgtaskd.enqueue(text, text, int, timestamptz, int, text)', 'EXECUTE')",
            &[&role],
        )
        .await
        .unwrap()
        .get(0);
    assert!(may);
    client
        .batch_execute(&format!(
            "SET ROLE {role}; SELECT pgtaskd.enqueue('as a producer', idempotency_key => 'p'); RESET ROLE;
             REVOKE ALL ON ALL TABLES IN SCHEMA pgtaskd FROM {role};
             REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgtaskd FROM {role};
             REVOKE ALL ON SCHEMA pgtaskd FROM {role}; DROP ROLE {role};"
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_retries_after_its_commit_answer_was_dropped_and_one_task_runs_once() {
    let db = TestDb::new().await;
    let direct = db.client().await;
    let proxy = Proxy::start(server_addr(), Fault::DropAfterReply, "idempotency_key =>").await;
    let (through_proxy, connection) = within(
        WAIT,
        "a connection through the proxy",
        tokio_postgres::connect(&proxy.conninfo(&server_user(), &db.name), NoTls),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let enqueue = "SELECT pgtaskd.enqueue($1, idempotency_key => $2)";
    let payload = "sent twice, stored once";
    let lost = within(
        WAIT,
        "the enqueue whose answer is dropped",
        through_proxy.query_one(enqueue, &[&payload, &"order-17"]),
    )
    .await;
    assert!(lost.is_err(), "the answer never came");
    assert!(proxy.triggered());
    // The producer does not know whether it committed: it sends the same enqueue again.
    let id: i64 = direct
        .query_one(enqueue, &[&payload, &"order-17"])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        count(&direct, "SELECT count(*) FROM pgtaskd.task_view").await,
        1
    );

    let analyzer = GatedAnalyzer::counting();
    let daemon = InProcessDaemon::start(&db, db.config(""), analyzer.clone()).await;
    wait_status(&direct, id, TaskStatus::Succeeded).await;
    daemon.stop().await;
    assert_eq!(analyzer.calls_for(payload), 1);
}

#[tokio::test]
async fn enqueue_with_a_key_from_the_cli_prints_the_same_id_and_refuses_another_payload() {
    let db = TestDb::new().await;
    let (status, first, stderr) = pgtaskd(Some(&db.url), &["enqueue", "x", "--key", "k1"]).await;
    assert!(status.success(), "{stderr}");
    let (status, again, _) = pgtaskd(Some(&db.url), &["enqueue", "x", "--key", "k1"]).await;
    assert!(status.success());
    assert_eq!(first, again);
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["enqueue", "y", "--key", "k1"]).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("idempotency key"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_key_header_answers_the_same_id_or_422_for_another_payload() {
    let db = TestDb::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = db.config(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    let daemon = InProcessDaemon::start(&db, config, GatedAnalyzer::closed()).await;
    let http = reqwest::Client::new();
    let post = |body: &'static str, key: Option<&'static str>| {
        let mut request = http
            .post(format!("http://127.0.0.1:{port}/tasks"))
            .header("content-type", "text/plain")
            .body(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        async move {
            let response = within(WAIT, "an HTTP answer", request.send())
                .await
                .unwrap();
            let status = response.status();
            let body: serde_json::Value = response.json().await.unwrap();
            (status, body)
        }
    };
    let (status, first) = post("same", Some("abc-1")).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{first}");
    let (status, again) = post("same", Some("abc-1")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{again}");
    assert_eq!(again["id"], first["id"]);
    let (status, conflict) = post("other", Some("abc-1")).await;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{conflict}"
    );
    assert_eq!(conflict["id"], first["id"]);
    assert!(conflict["error"]
        .as_str()
        .unwrap()
        .contains("Idempotency-Key"));
    let (status, body) = post("same", Some("bad key")).await;
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{body}");
    let (status, unkeyed) = post("same", None).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    assert_ne!(unkeyed["id"], first["id"]);
    daemon.stop().await;
}
