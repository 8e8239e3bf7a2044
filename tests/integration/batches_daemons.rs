//! Batches through real daemons (docs/dependencies.md, "Batches"): the callback of a batch
//! of 10,000 runs once, told its counts, while daemons are killed with -9 in turn.

use crate::handlers::Scratch;
use crate::support::{count, eventually, wait_count, DaemonProcess, TestDb, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_10000_runs_its_callback_once_through_kills_of_its_daemons() {
    const MEMBERS: i64 = 10_000;
    const CHUNK: i64 = 1_000;
    let scratch = Scratch::new();
    let runs = scratch.path("callback-runs");
    let handler = scratch.script(
        "callback",
        &format!(
            r#"line="$PGTASKD_TASK_ID $PGTASKD_BATCH ${{PGTASKD_BATCH_SUCCEEDED-unset}} ${{PGTASKD_BATCH_FAILED-unset}} ${{PGTASKD_BATCH_CANCELED-unset}}"
echo "$line" >> "{}"
printf '%s' "$line""#,
            runs.display()
        ),
    );
    let config = format!(
        "[worker]\nqueues = [\"default\", \"callbacks\"]\nconcurrency = 4\nlease = \"1s\"\npoll_interval = \"500ms\"\n\n\
         [queues.callbacks]\nhandler = \"exec\"\ncommand = [\"{}\"]\n",
        handler.display()
    );
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut running: Vec<DaemonProcess> = (0..3)
        .map(|_| DaemonProcess::start(&db, &config, &[]))
        .collect();
    let batch: i64 = client
        .query_one(
            "SELECT pgtaskd.open_batch('callbacks', 'success', 'report')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let callback: i64 = client
        .query_one(
            "SELECT callback FROM pgtaskd.batches WHERE id = $1",
            &[&batch],
        )
        .await
        .unwrap()
        .get(0);

    // Members stream in by thousands; after each, one daemon is killed with -9 and another
    // started, so that members are claimed, run and finished by daemons that die.
    let mut kills = 0;
    for chunk in 0..MEMBERS / CHUNK {
        client
            .execute(
                "INSERT INTO pgtaskd.tasks (payload, batch_id, max_attempts) \
                 SELECT 'member ' || i || ' of chunk ' || $2::bigint, $1, 50 \
                   FROM generate_series(1, $3::bigint) AS i",
                &[&batch, &chunk, &CHUNK],
            )
            .await
            .unwrap();
        let victim = fastrand::usize(..running.len());
        let mut daemon = running.swap_remove(victim);
        daemon.signal(libc::SIGKILL);
        daemon.wait().await;
        running.push(DaemonProcess::start(&db, &config, &[]));
        kills += 1;
    }
    let state: String = client
        .query_one("SELECT pgtaskd.seal_batch($1)", &[&batch])
        .await
        .unwrap()
        .get(0);
    // One more kill once the drain is under way, with members still to run.
    let under_way = eventually(WAIT, "members to run after the seal", || {
        let client = &client;
        async move {
            let done = count(
                client,
                &format!(
                    "SELECT count(*) FROM pgtaskd.task_view WHERE batch_id = {batch} AND status = 'SUCCEEDED'"
                ),
            )
            .await;
            (done > 0).then_some(done)
        }
    })
    .await;
    if under_way < MEMBERS {
        let mut daemon = running.swap_remove(0);
        daemon.signal(libc::SIGKILL);
        daemon.wait().await;
        running.push(DaemonProcess::start(&db, &config, &[]));
        kills += 1;
    }
    crate::support::within(
        WAIT * 3,
        "the callback to succeed",
        wait_count(
            &client,
            &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {callback} AND status = 'SUCCEEDED'"),
            1,
            "the callback to succeed",
        ),
    )
    .await;

    let members_succeeded = count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE batch_id = {batch} AND status = 'SUCCEEDED'"),
    )
    .await;
    assert_eq!(members_succeeded, MEMBERS);
    let late = count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.task_view AS c, pgtaskd.task_view AS m \
              WHERE c.id = {callback} AND m.batch_id = {batch} AND c.started_at < m.finished_at"
        ),
    )
    .await;
    assert_eq!(late, 0, "the callback started after every member ended");
    assert_eq!(
        scratch.lines("callback-runs"),
        vec![format!("{callback} {batch} {MEMBERS} 0 0")],
        "the callback ran once, told its batch and counts"
    );
    let callback_runs = count(
        &client,
        &format!("SELECT runs::bigint FROM pgtaskd.task_view WHERE id = {callback}"),
    )
    .await;
    assert_eq!(callback_runs, 1);
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.check_deps()").await,
        0
    );
    println!("batch of {MEMBERS}: sealed {state}, {kills} kills, callback ran once");
    for mut daemon in running {
        daemon.stop_cleanly().await;
    }
}
