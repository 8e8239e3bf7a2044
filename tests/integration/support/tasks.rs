//! Test support over the tasks table: enqueue and insert tasks, wait for a count or a status,
//! read what a call touched, hold the xmin horizon, and check the daemon's results against
//! [`expected_counts`], the oracle, on the [`payload`]s tests insert.

use tokio_postgres::Client;

use super::{eventually, within, TestDb, WAIT};

/// Enqueue one task through `pgtaskd.enqueue`; returns its id.
pub async fn enqueue(client: &Client, payload: &str) -> i64 {
    client
        .query_one("SELECT pgtaskd.enqueue($1)", &[&payload])
        .await
        .unwrap()
        .get(0)
}

/// Set the state of task `id` directly: `set` is the `SET` list of an `UPDATE` of its state
/// row (`pgtaskd.task_state`, schema 36: `pgtaskd.tasks` holds only the producer's columns,
/// so a test that wants a task in another state than QUEUED inserts it, then sets this).
pub async fn set_state(client: &Client, id: i64, set: &str) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            &format!("UPDATE pgtaskd.task_state SET {set} WHERE id = $1"),
            &[&id],
        )
        .await
}

/// Insert tasks `payload(0..n)` in one `INSERT ... SELECT`; returns the payloads.
pub async fn insert_payloads(client: &Client, n: usize) -> Vec<String> {
    let payloads: Vec<String> = (0..n).map(payload).collect();
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT unnest($1::text[])",
            &[&payloads],
        )
        .await
        .unwrap();
    payloads
}

/// Leave the task tables as a drained queue's after its vacuum: statistics that say "no rows",
/// kept so (autovacuum off for the tables) however the test then fills them. The tables:
/// `pgtaskd.tasks`, the state rows of `pgtaskd.task_state` (schema 36) and the edges of
/// `pgtaskd.task_deps` (schema 37), which the daemon's statements and the producer's
/// triggers read.
pub async fn statistics_say_empty(client: &Client) {
    client
        .batch_execute(
            "ALTER TABLE pgtaskd.tasks SET (autovacuum_enabled = false);
             ALTER TABLE pgtaskd.task_state SET (autovacuum_enabled = false);
             ALTER TABLE pgtaskd.task_deps SET (autovacuum_enabled = false);
             INSERT INTO pgtaskd.tasks (payload) SELECT 'probe ' || i FROM generate_series(1, 100) i;
             DELETE FROM pgtaskd.tasks;",
        )
        .await
        .unwrap();
    // One statement a call: VACUUM cannot run in the implicit transaction of several.
    for table in ["pgtaskd.tasks", "pgtaskd.task_state", "pgtaskd.task_deps"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .unwrap();
    }
}

/// Shared buffers (hit or read) one call of `call` touched: the function's own statements
/// included, which run inside the call's scan.
pub async fn blocks_touched(client: &Client, call: &str) -> i64 {
    let plan: Vec<String> = client
        .query(
            &format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM {call}"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    // The first `Buffers:` line is the top node's (planning's come after).
    let Some(line) = plan
        .iter()
        .find(|line| line.trim_start().starts_with("Buffers:"))
    else {
        return 0;
    };
    let shared = line.split(',').next().unwrap_or_default();
    ["hit=", "read="]
        .iter()
        .filter_map(|key| {
            let at = shared.find(key)? + key.len();
            shared[at..].split_whitespace().next()?.parse::<i64>().ok()
        })
        .sum()
}

/// The single `bigint` a query returns.
pub async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// A session of `db` holding a `REPEATABLE READ` snapshot, and with it the xmin horizon: no
/// row version that becomes dead after this call can be removed until the session commits or
/// is dropped.
pub async fn hold_snapshot(db: &TestDb) -> Client {
    let holder = db.client().await;
    within(
        WAIT,
        "a snapshot to be taken",
        holder.batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgtaskd.task_view",
        ),
    )
    .await
    .unwrap();
    holder
}

/// Wait until `sql` counts `want`.
pub async fn wait_count(client: &Client, sql: &str, want: i64, what: &str) {
    eventually(WAIT, what, || async move {
        (count(client, sql).await == want).then_some(())
    })
    .await;
}

/// Wait until task `id` has status `want`; returns the row.
pub async fn wait_status(
    client: &Client,
    id: i64,
    want: pgtaskd::queue::TaskStatus,
) -> pgtaskd::queue::Task {
    eventually(WAIT, &format!("task {id} to be {want}"), || async move {
        pgtaskd::queue::get(client, id)
            .await
            .unwrap()
            .filter(|t| t.status == want)
    })
    .await
}

/// Assert that every row of the table is SUCCEEDED with the counts of its payload, and, when
/// given, with this attempt. Returns how many rows there are.
pub async fn assert_all_succeeded(client: &Client, attempt: Option<i32>) -> usize {
    let rows = client
        .query(
            "SELECT id, payload, status, words, bytes, runes, attempt FROM pgtaskd.task_view",
            &[],
        )
        .await
        .unwrap();
    for row in &rows {
        let id: i64 = row.get(0);
        let text: &str = row.get(1);
        assert_eq!(row.get::<_, &str>(2), "SUCCEEDED", "task {id}");
        let counts = (
            row.get::<_, i64>(3),
            row.get::<_, i64>(4),
            row.get::<_, i64>(5),
        );
        assert_eq!(counts, expected_counts(text), "task {id}");
        if let Some(attempt) = attempt {
            assert_eq!(row.get::<_, i32>(6), attempt, "task {id}");
        }
    }
    rows.len()
}

/// The three counts of a text, by the obvious definition (`split_whitespace` is Unicode
/// White_Space, as Go's `strings.Fields`): the oracle the daemon's results are checked against.
pub fn expected_counts(text: &str) -> (i64, i64, i64) {
    (
        text.split_whitespace().count() as i64,
        text.len() as i64,
        text.chars().count() as i64,
    )
}

/// A deterministic, varied payload for task number `i`: ASCII, multi-byte, and every kind of
/// space.
pub fn payload(i: usize) -> String {
    const WORDS: &[&str] = &[
        "the",
        "naïve",
        "日本語",
        "emoji🚀",
        "Straße",
        "𝔘𝔫𝔦",
        "x",
        "crème",
        "\u{200B}",
        "a",
    ];
    const SPACES: &[&str] = &[" ", "\n", "\t", "\u{3000}", "\u{00A0}", "  ", "\u{2028}"];
    let mut rng = fastrand::Rng::with_seed(i as u64);
    let n = rng.usize(0..40);
    let mut text = String::new();
    for k in 0..n {
        if k > 0 || rng.bool() {
            text.push_str(SPACES[rng.usize(..SPACES.len())]);
        }
        text.push_str(WORDS[rng.usize(..WORDS.len())]);
    }
    text
}
