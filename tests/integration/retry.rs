//! Retry: FAILED and CANCELED tasks are put back as new (SQL and CLI), every other state is
//! refused.

use tokio_postgres::Client;

use crate::support::daemon::pgtaskd;
use crate::support::{wait_count, within, GatedAnalyzer, InProcessDaemon, TestDb, WAIT};

/// Rows in each state, written as the owner: (FAILED, CANCELED, QUEUED, RUNNING, SUCCEEDED).
/// The tasks are inserted, then their state rows (`pgtaskd.task_state`, schema 36) set.
pub(crate) async fn one_task_per_state(client: &Client) -> [i64; 5] {
    let rows = within(
        WAIT,
        "the rows",
        client.query(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('f'), ('c'), ('q'), ('r'), ('s')
             RETURNING id",
            &[],
        ),
    )
    .await
    .unwrap();
    let ids: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    within(
        WAIT,
        "the rows' states",
        client.execute(
            "UPDATE pgtaskd.task_state AS s
                SET status = v.status, attempt = v.attempt,
                    cancel_requested = v.cancel_requested, words = v.words, bytes = v.bytes,
                    runes = v.runes, error = v.error, lease_owner = v.lease_owner,
                    lease_expires_at = v.lease_expires_at, started_at = v.started_at,
                    finished_at = v.finished_at
               FROM pgtaskd.tasks AS t,
                    (VALUES ('f', 'FAILED', 3, false, 0::int8, 0::int8, 0::int8,
                             'lease lost 3 times', NULL::text, NULL::timestamptz, now(), now()),
                            ('c', 'CANCELED', 1, true, 0, 0, 0, NULL, NULL, NULL, now(), now()),
                            ('q', 'QUEUED', 0, false, 0, 0, 0, NULL, NULL, NULL, NULL, NULL),
                            ('r', 'RUNNING', 1, false, 0, 0, 0, NULL, 'someone',
                             now() + interval '1h', now(), NULL),
                            ('s', 'SUCCEEDED', 1, false, 1, 1, 1, NULL, NULL, NULL, now(), now()))
                    AS v(payload, status, attempt, cancel_requested, words, bytes, runes, error,
                         lease_owner, lease_expires_at, started_at, finished_at)
              WHERE t.id = s.id AND t.id = ANY ($1) AND v.payload = t.payload",
            &[&ids],
        ),
    )
    .await
    .unwrap();
    ids.try_into().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_puts_failed_and_canceled_tasks_back_as_new_and_refuses_the_rest() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let [failed, canceled, queued, running, succeeded] = one_task_per_state(&client).await;

    for (id, was) in [(failed, "FAILED"), (canceled, "CANCELED")] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["retry", &id.to_string()]).await;
        assert!(status.success(), "{stdout}{stderr}");
        assert_eq!(stdout.trim(), format!("QUEUED (was {was})"));
        let row = client
            .query_one(
                "SELECT status, attempt, cancel_requested, error, started_at IS NULL,
                        finished_at IS NULL, run_at <= now()
                   FROM pgtaskd.task_view WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), "QUEUED");
        assert_eq!(row.get::<_, i32>(1), 0, "attempt is reset");
        assert!(!row.get::<_, bool>(2), "no cancel request");
        assert_eq!(row.get::<_, Option<&str>>(3), None, "no error");
        assert!(
            row.get::<_, bool>(4) && row.get::<_, bool>(5),
            "no start or finish"
        );
        assert!(row.get::<_, bool>(6), "due now");
    }
    for (id, what) in [
        (queued, "QUEUED"),
        (running, "RUNNING"),
        (succeeded, "SUCCEEDED"),
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["retry", &id.to_string()]).await;
        assert_eq!(status.code(), Some(4), "{what}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains(what), "{stderr}");
    }
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["retry", "999999"]).await;
    assert_eq!(status.code(), Some(3), "{stderr}");
    let running_row: (String, i32) = client
        .query_one(
            "SELECT status, attempt FROM pgtaskd.task_view WHERE id = $1",
            &[&running],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(
        running_row,
        ("RUNNING".to_string(), 1),
        "a refused retry changes nothing"
    );

    // The retried tasks run again.
    let daemon = InProcessDaemon::start(&db, db.config(""), GatedAnalyzer::counting()).await;
    wait_count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.task_view WHERE id IN ({failed}, {canceled}) \
               AND status = 'SUCCEEDED' AND attempt = 1"
        ),
        2,
        "the retried tasks",
    )
    .await;
    daemon.stop().await;
}

/// `pgtaskd retry ID --with-dependents` brings back the tasks a failure canceled, which wait
/// again; the plain retry of a task with a parent says WAITING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_with_dependents_brings_back_what_the_failure_canceled_and_says_so() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let root: i64 = client
        .query_one("SELECT pgtaskd.enqueue('root')", &[])
        .await
        .unwrap()
        .get(0);
    let rows = client
        .query(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) VALUES ('a', ARRAY[$1::bigint]) RETURNING id",
            &[&root],
        )
        .await
        .unwrap();
    let a: i64 = rows[0].get(0);
    let b: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) VALUES ('b', ARRAY[$1::bigint]) RETURNING id",
            &[&a],
        )
        .await
        .unwrap()
        .get(0);
    // The root fails: a and b are canceled in its commit.
    let claimed = client
        .query_one(
            "SELECT task_id, task_claim FROM pgtaskd.claim(ARRAY['default'], 1, 't', 60000, \
             1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    let token: i64 = claimed.get(1);
    client
        .query(
            "SELECT * FROM pgtaskd.finish(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY['FAILED'], \
             ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY['bad'], \
             ARRAY[NULL::text], ARRAY[NULL::float8], true)",
            &[&token, &root],
        )
        .await
        .unwrap();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'CANCELED'",
        2,
        "a and b canceled",
    )
    .await;

    // A plain retry of the middle task: it waits again for the root, and says so.
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["retry", &a.to_string()]).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stdout.trim(),
        "CANCELED (was CANCELED)",
        "its parent failed: canceled again"
    );

    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &["retry", &root.to_string(), "--with-dependents"],
    )
    .await;
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stdout,
        format!("QUEUED (was FAILED)\n2 dependents back, waiting again: {a}, {b}\n")
    );
    let statuses: Vec<String> = client
        .query("SELECT status FROM pgtaskd.task_view ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(statuses, ["QUEUED", "WAITING", "WAITING"]);
    let problems: i64 = client
        .query_one("SELECT count(*) FROM pgtaskd.check_deps()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(problems, 0);
}
