//! What a handler is told about its task (schema 30, docs/handlers.md "What a handler is
//! told"): a key that is the same for every claim of a task and different for every task and
//! database, a run number that grows with every start and never goes back (not even through
//! a shutdown's release or a retry), and every failed attempt's error kept, bounded.

use tokio_postgres::Client;

use crate::handlers::Scratch;
use crate::support::{eventually, within, DaemonProcess, TestDb, WAIT};

/// Claim the one QUEUED task of queue `queue` as `owner`: (id, attempt, token, run, key).
async fn claim(client: &Client, queue: &str, owner: &str) -> (i64, i32, i64, i32, String) {
    let row = within(
        WAIT,
        "a claim",
        client.query_one(
            "SELECT task_id, task_attempt, task_claim, task_run, task_key \
               FROM pgtaskd.claim(ARRAY[$1::text], 1, $2, 60000, 1048576, true, 1048576, NULL, NULL) \
              WHERE task_id IS NOT NULL",
            &[&queue, &owner],
        ),
    )
    .await
    .expect("one task to claim");
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

async fn one<T: for<'a> tokio_postgres::types::FromSql<'a>>(client: &Client, sql: &str) -> T {
    within(WAIT, sql, client.query_one(sql, &[]))
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err:?}"))
        .get(0)
}

#[tokio::test]
async fn the_key_stays_and_the_run_grows_through_a_release_a_failure_and_a_retry() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id: i64 = one(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('x', 'keys') RETURNING id",
    )
    .await;
    let view_key: String = one(
        &client,
        &format!("SELECT task_key FROM pgtaskd.task_view WHERE id = {id}"),
    )
    .await;
    let site: String = one(&client, "SELECT id FROM pgtaskd.site").await;
    let created: i64 = one(
        &client,
        &format!(
            "SELECT (extract(epoch FROM created_at) * 1000000)::bigint FROM pgtaskd.tasks WHERE id = {id}"
        ),
    )
    .await;
    assert_eq!(view_key, format!("{site}-{id}-{created}"));
    assert_eq!(site.len(), 16, "{site}");
    assert!(site.bytes().all(|b| b.is_ascii_hexdigit()), "{site}");

    // First claim; a shutdown gives it back: the attempt is not counted, the run is.
    let (_, attempt, token, run, key) = claim(&client, "keys", "a").await;
    assert_eq!((attempt, run), (1, 1));
    assert_eq!(key, view_key, "the claim spells the key as the view does");
    within(
        WAIT,
        "a release",
        client.query(
            "SELECT * FROM pgtaskd.release($1, $2, true)",
            &[&id, &token],
        ),
    )
    .await
    .unwrap();
    let (_, attempt, token, run, key) = claim(&client, "keys", "b").await;
    assert_eq!(
        (attempt, run),
        (1, 2),
        "told attempt 1 again, but run 2: a re-run"
    );
    assert_eq!(key, view_key);

    // A failed attempt, put back at once: its error is kept.
    within(
        WAIT,
        "a failed attempt",
        client.query(
            "SELECT * FROM pgtaskd.finish(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY['FAILED'], \
             ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY['exited with status 3'], \
             ARRAY[NULL::text], ARRAY[0::float8], false)",
            &[&token, &id],
        ),
    )
    .await
    .unwrap();
    let (_, attempt, token, run, key) = claim(&client, "keys", "c").await;
    assert_eq!((attempt, run), (2, 3));
    assert_eq!(key, view_key);

    // The last attempt fails for good; a retry resets the attempt, never the run.
    within(
        WAIT,
        "the final failure",
        client.query(
            "SELECT * FROM pgtaskd.finish(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY['FAILED'], \
             ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY['bad input'], \
             ARRAY[NULL::text], ARRAY[NULL::float8], false)",
            &[&token, &id],
        ),
    )
    .await
    .unwrap();
    let retried: String = one(&client, &format!("SELECT pgtaskd.retry({id})")).await;
    assert_eq!(retried, "FAILED");
    let (_, attempt, _, run, key) = claim(&client, "keys", "d").await;
    assert_eq!((attempt, run), (1, 4));
    assert_eq!(key, view_key, "a retried task keeps its key");

    let history: Vec<(i32, i32, String)> = within(
        WAIT,
        "the history",
        client.query(
            "SELECT (e->>'attempt')::int, (e->>'run')::int, e->>'error' \
               FROM pgtaskd.task_view, jsonb_array_elements(errors) AS e WHERE id = $1",
            &[&id],
        ),
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect();
    assert_eq!(
        history,
        [
            (1, 2, "exited with status 3".to_string()),
            (2, 3, "bad input".to_string())
        ]
    );
}

#[tokio::test]
async fn two_databases_give_their_tasks_of_the_same_id_different_keys() {
    let (first, second) = (TestDb::new().await, TestDb::new().await);
    let mut keys = Vec::new();
    for db in [&first, &second] {
        let client = db.client().await;
        let id: i64 = one(
            &client,
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('x') RETURNING id",
        )
        .await;
        assert_eq!(id, 1, "a fresh database's first task");
        keys.push(
            one::<String>(
                &client,
                "SELECT task_key FROM pgtaskd.task_view WHERE id = 1",
            )
            .await,
        );
    }
    assert_ne!(keys[0], keys[1], "two sites' task 1 must not collide");
}

#[tokio::test]
async fn the_error_history_keeps_the_last_ten_each_cut_and_counts_a_lost_lease() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let long = "é".repeat(3000);
    let mut history: Option<serde_json::Value> = None;
    for attempt in 1..=12 {
        let text: String = within(
            WAIT,
            "error_history",
            client.query_one(
                "SELECT pgtaskd.error_history($1::text::jsonb, $2, $3, $4)::text",
                &[
                    &history.as_ref().map(|h| h.to_string()),
                    &attempt,
                    &(attempt + 1),
                    &format!("{attempt}: {long}END"),
                ],
            ),
        )
        .await
        .unwrap()
        .get(0);
        history = Some(serde_json::from_str(&text).unwrap());
    }
    let entries = history.unwrap();
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 10, "the last ten");
    assert_eq!(entries[0]["attempt"], 3, "the oldest two dropped");
    assert_eq!(entries[9]["attempt"], 12);
    assert_eq!(entries[9]["run"], 13);
    let error = entries[9]["error"].as_str().unwrap();
    assert_eq!(
        error.chars().count(),
        2000,
        "each error cut to 2,000 characters"
    );
    assert!(error.starts_with("12: é"), "its head: what failed");
    assert!(error.ends_with("éEND"), "and its tail: where stderr ends");
    // A history written by hand that is not an array starts again.
    let restarted: String = one(
        &client,
        "SELECT pgtaskd.error_history('{\"x\": 1}'::jsonb, 1, 1, 'e')::text",
    )
    .await;
    assert!(restarted.starts_with("[{"), "{restarted}");

    // A lost lease is a failed attempt.
    let id: i64 = one(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('x', 'lost') RETURNING id",
    )
    .await;
    let (_, _, token, _, _) = claim(&client, "lost", "gone-daemon").await;
    within(
        WAIT,
        "the lease expiring",
        client.execute("SELECT pgtaskd.extend_lease($1, $2, -1000)", &[&id, &token]),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "a rescue",
        client.query("SELECT * FROM pgtaskd.rescue(10, 'rescuer')", &[]),
    )
    .await
    .unwrap();
    let lost: String = one(
        &client,
        &format!("SELECT errors->0->>'error' FROM pgtaskd.task_view WHERE id = {id}"),
    )
    .await;
    assert_eq!(lost, "lease lost (last held by gone-daemon)");
}

/// A shutdown gives a started exec task back; the next daemon's run is told the same attempt
/// and key, a higher run, and the producer's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_given_back_by_a_shutdown_is_told_apart_from_the_next() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let told = scratch.path("told");
    let handler = scratch.script(
        "told.sh",
        &format!(
            "echo \"$PGTASKD_ATTEMPT $PGTASKD_RUN $PGTASKD_TASK_KEY ${{PGTASKD_IDEMPOTENCY_KEY-none}}\" >> {}\n\
             if [ \"$PGTASKD_RUN\" = 1 ]; then exec sleep 600; fi\n\
             echo done",
            told.display()
        ),
    );
    let config = format!(
        "[worker]\nqueues = [\"jobs\"]\npoll_interval = \"200ms\"\n\n\
         [shutdown]\ngrace = \"100ms\"\n\n\
         [queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\n",
        handler.display()
    );
    let mut first = DaemonProcess::start(&db, &config, &[]);
    let id: i64 = one(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue, idempotency_key) \
         VALUES ('x', 'jobs', 'order-17') RETURNING id",
    )
    .await;
    eventually(WAIT, "the first run to start", || async {
        (scratch.lines("told").len() == 1).then_some(())
    })
    .await;
    first.signal(libc::SIGTERM);
    let exit = first.wait().await;
    assert_eq!(exit.code(), Some(0), "{}", first.log_text());
    let (status, attempt, runs): (String, i32, i32) = {
        let row = within(
            WAIT,
            "the task",
            client.query_one(
                "SELECT status, attempt, runs FROM pgtaskd.task_view WHERE id = $1",
                &[&id],
            ),
        )
        .await
        .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(
        (status.as_str(), attempt, runs),
        ("QUEUED", 0, 1),
        "given back unfinished"
    );

    let mut second = DaemonProcess::start(&db, &config, &[]);
    crate::support::wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the second run",
    )
    .await;
    let key: String = one(
        &client,
        &format!("SELECT task_key FROM pgtaskd.task_view WHERE id = {id}"),
    )
    .await;
    assert_eq!(
        scratch.lines("told"),
        [format!("1 1 {key} order-17"), format!("1 2 {key} order-17")]
    );
    second.signal(libc::SIGTERM);
    assert_eq!(second.wait().await.code(), Some(0), "{}", second.log_text());
}
