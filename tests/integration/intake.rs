//! Claiming ahead (`src/worker/intake.rs`): once tasks have proved fast, a claim takes more
//! tasks than there are free workers. Those wait in the daemon, RUNNING under its lease, for a
//! permit; at most `worker.concurrency` analyzers run at once, and a task claimed ahead that is
//! canceled, or whose daemon shuts down, before it got a worker is never analyzed.

use std::sync::Arc;

use pgtaskd::queue::{self, TaskStatus};
use tokio_postgres::Client;

use crate::support::gate::OpenOnDrop;
use crate::support::{
    count, eventually, expected_counts, insert_payloads, wait_count, GatedAnalyzer,
    InProcessDaemon, TestDb, WAIT,
};

/// Texts with this marker are held at the analyzer's gate; every other text passes at once.
const HOLD: &str = "[hold]";
/// Fast tasks the daemon runs first.
const FAST: usize = 20;
/// Held tasks enqueued in one statement once the daemon has seen fast tasks.
const HELD: usize = 7;

/// A daemon with one worker, which has seen fast tasks, busy with a held task, and the tasks it
/// claimed ahead of it (at least two) waiting for that worker.
struct ClaimedAhead {
    db: TestDb,
    client: Client,
    analyzer: Arc<GatedAnalyzer>,
    _open: OpenOnDrop,
    daemon: InProcessDaemon,
    /// The task the worker is held on.
    running: i64,
    /// Ids and texts of the tasks claimed ahead, none of which has been analyzed.
    ahead: Vec<(i64, String)>,
}

async fn claimed_ahead() -> ClaimedAhead {
    let db = TestDb::new().await;
    let client = db.client().await;
    // Every UPDATE statement takes 50 ms more, so that a claim's round trip dwarfs the time a
    // task takes however loaded the machine is: the daemon claims ahead on any machine. The
    // daemon's updates are of the state rows (pgtaskd.task_state, schema 36).
    client
        .batch_execute(
            "CREATE FUNCTION public.slow_update() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$;
             CREATE TRIGGER slow_update BEFORE UPDATE ON pgtaskd.task_state
                 FOR EACH STATEMENT EXECUTE FUNCTION public.slow_update();",
        )
        .await
        .unwrap();
    let analyzer = GatedAnalyzer::holding_only(HOLD);
    let open = analyzer.open_on_drop();
    let daemon = InProcessDaemon::start(
        &db,
        db.config("[worker]\nconcurrency = 1\n[shutdown]\ngrace = \"60s\"\n"),
        analyzer.clone(),
    )
    .await;
    // Fast tasks first: the daemon learns that a task takes far less than a claim's round trip.
    insert_payloads(&client, FAST).await;
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        FAST as i64,
        "the fast tasks to finish",
    )
    .await;

    let texts: Vec<String> = (0..HELD).map(|i| format!("{HOLD} task {i}")).collect();
    let ids: Vec<i64> = client
        .query(
            "INSERT INTO pgtaskd.tasks (payload) SELECT unnest($1::text[]) RETURNING id",
            &[&texts],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    analyzer.entered(FAST + 1).await;
    eventually(WAIT, "tasks to be claimed ahead of the held one", || {
        let client = &client;
        async move {
            let running = count(
                client,
                "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'",
            )
            .await;
            (running >= 3).then_some(())
        }
    })
    .await;
    let mut running = Vec::new();
    let mut ahead = Vec::new();
    for (id, text) in ids.iter().zip(&texts) {
        let task = queue::get(&client, *id).await.unwrap().unwrap();
        match (task.status, analyzer.calls_for(text)) {
            (TaskStatus::Running, 1) => running.push(*id),
            (TaskStatus::Running, 0) => ahead.push((*id, text.clone())),
            (TaskStatus::Queued, 0) => {}
            other => panic!("{text}: {other:?}"),
        }
    }
    assert_eq!(running.len(), 1, "one analyzer at a time");
    assert!(ahead.len() >= 2, "{} tasks claimed ahead", ahead.len());
    assert_eq!(analyzer.calls(), FAST + 1);
    ClaimedAhead {
        db,
        client,
        analyzer,
        _open: open,
        daemon,
        running: running[0],
        ahead,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_claimed_ahead_and_canceled_ends_canceled_without_being_analyzed() {
    let ClaimedAhead {
        db: _db,
        client,
        analyzer,
        _open,
        daemon,
        running: held,
        ahead,
    } = claimed_ahead().await;
    let (id, text) = &ahead[0];
    let row = client
        .query_one("SELECT pgtaskd.cancel($1)", &[id])
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("RUNNING"));
    let task = eventually(WAIT, "the canceled task to end", || {
        let client = &client;
        async move {
            queue::get(client, *id)
                .await
                .unwrap()
                .filter(|t| t.status.is_terminal())
        }
    })
    .await;
    assert_eq!(task.status, TaskStatus::Canceled);
    assert_eq!((task.words, task.bytes, task.runes), (0, 0, 0));
    assert_eq!(analyzer.calls_for(text), 0, "never analyzed");
    assert_eq!(
        queue::get(&client, held).await.unwrap().unwrap().status,
        TaskStatus::Running,
        "the worker is still busy with the held task"
    );

    analyzer.open();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status IN ('QUEUED', 'RUNNING')",
        0,
        "every other task to finish",
    )
    .await;
    daemon.stop().await;
    for (id, text) in &ahead[1..] {
        let task = queue::get(&client, *id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Succeeded, "{text}");
        assert_eq!((task.words, task.bytes, task.runes), expected_counts(text));
        assert_eq!(analyzer.calls_for(text), 1, "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_tasks_claimed_ahead_at_once_while_the_running_one_finishes() {
    let ClaimedAhead {
        db: _db,
        client,
        analyzer,
        _open,
        mut daemon,
        running: held,
        ahead,
    } = claimed_ahead().await;
    daemon.shutdown.trigger();
    for (id, text) in &ahead {
        let task = eventually(WAIT, "a task claimed ahead to be released", || {
            let client = &client;
            async move {
                queue::get(client, *id)
                    .await
                    .unwrap()
                    .filter(|t| t.status != TaskStatus::Running)
            }
        })
        .await;
        assert_eq!(task.status, TaskStatus::Queued, "{text}");
        assert_eq!(
            (task.attempt, task.lease_owner, task.lease_expires_at),
            (0, None, None),
            "{text}: a release costs no attempt"
        );
        assert_eq!(analyzer.calls_for(text), 0, "{text}: never analyzed");
    }
    assert_eq!(
        queue::get(&client, held).await.unwrap().unwrap().status,
        TaskStatus::Running,
        "the running task has its grace"
    );
    analyzer.open();
    daemon.join().await;
    let task = queue::get(&client, held).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_tasks_are_claimed_only_for_free_workers() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let analyzer = GatedAnalyzer::closed();
    let daemon = InProcessDaemon::start(
        &db,
        db.config("[worker]\nconcurrency = 2\npoll_interval = \"100ms\"\n"),
        analyzer.clone(),
    )
    .await;
    insert_payloads(&client, 6).await;
    analyzer.entered(2).await;
    // Nothing claims a third task while both workers are held: give five poll ticks (and a
    // notification) the chance.
    insert_payloads(&client, 1).await;
    for _ in 0..5 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(
            count(
                &client,
                "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING'"
            )
            .await,
            2
        );
    }
    analyzer.open();
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        7,
        "every task to finish",
    )
    .await;
    daemon.stop().await;
    assert_eq!(analyzer.calls(), 7);
}
