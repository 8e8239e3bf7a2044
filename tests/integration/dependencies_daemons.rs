//! Dependencies through real daemons (docs/dependencies.md): releases wake idle daemons, a
//! handler is told its parents, and `kill -9` of daemons in turn through random graphs runs
//! every task once its parents ended.

use std::collections::HashMap;
use std::time::Duration;

use crate::handlers::Scratch;
use crate::support::{count, eventually, wait_count, DaemonProcess, TestDb, WAIT};

/// Each hop of a chain woken by its release: well under this poll interval.
const IDLE: &str = "[worker]\nconcurrency = 4\npoll_interval = \"60s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_runs_in_order_each_hop_woken_by_its_parents_commit() {
    const HOPS: i64 = 200;
    let db = TestDb::new().await;
    let mut daemon = DaemonProcess::start(&db, IDLE, &[]);
    daemon.wait_for_log("listening for notifications").await;
    let client = db.client().await;
    let first: i64 = client
        .query_one("SELECT pgtaskd.enqueue('hop 0')", &[])
        .await
        .unwrap()
        .get(0);
    // Each task waits for the one before it, all in one statement.
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) \
             SELECT 'hop ' || n, ARRAY[$1::bigint + n - 1] FROM generate_series(1, $2::bigint) AS n",
            &[&first, &(HOPS - 1)],
        )
        .await
        .unwrap();
    // Far within one poll interval: only the releases' notifications can move it along.
    crate::support::within(
        Duration::from_secs(40),
        "the chain, woken hop by hop",
        wait_count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
            HOPS,
            "every hop to succeed",
        ),
    )
    .await;
    let out_of_order = count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view AS c JOIN pgtaskd.task_view AS p \
           ON p.id = c.depends_on[1] WHERE c.started_at < p.finished_at OR c.runs <> 1",
    )
    .await;
    assert_eq!(
        out_of_order, 0,
        "each hop ran once, after the one before ended"
    );
    daemon.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_handler_is_told_its_parents_and_how_each_ended() {
    let scratch = Scratch::new();
    let handler = scratch.script(
        "parents",
        r#"p=$(cat)
if [ "$p" = fail ]; then echo "asked to fail" >&2; exit 65; fi
printf '%s|%s' "${PGTASKD_PARENTS-unset}" "${PGTASKD_PARENT_COUNT-unset}""#,
    );
    let db = TestDb::new().await;
    let config = format!(
        "[worker]\nqueues = [\"jobs\"]\npoll_interval = \"200ms\"\n\n[queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\n",
        handler.display()
    );
    let mut daemon = DaemonProcess::start(&db, &config, &[]);
    daemon.wait_for_log("listening for notifications").await;
    let client = db.client().await;
    let insert = |payload: &'static str, parents: Option<Vec<i64>>| {
        let client = &client;
        async move {
            client
                .query_one(
                    "INSERT INTO pgtaskd.tasks (queue, payload, depends_on, on_dep_failure) \
                     VALUES ('jobs', $1, $2, 'run') RETURNING id",
                    &[&payload, &parents],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    let good = insert("good", None).await;
    let bad = insert("fail", None).await;
    let child = insert("child", Some(vec![good, bad])).await;
    let output: String = eventually(WAIT, "the child to succeed", || {
        let client = &client;
        async move {
            client
                .query_opt(
                    "SELECT output FROM pgtaskd.task_view WHERE id = $1 AND status = 'SUCCEEDED'",
                    &[&child],
                )
                .await
                .unwrap()
                .map(|row| row.get(0))
        }
    })
    .await;
    assert_eq!(output, format!("{good}=SUCCEEDED,{bad}=FAILED|2"));
    let plain: String = client
        .query_one(
            "SELECT output FROM pgtaskd.task_view WHERE id = $1",
            &[&good],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        plain, "unset|unset",
        "a task without parents is told nothing of them"
    );
    daemon.stop_cleanly().await;
}

/// Three daemons killed with -9 in turn while random graphs stream in, fan-ins of hundreds
/// among them: every task ends SUCCEEDED, none started before each of its parents ended,
/// and the auditor finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_killed_in_turn_through_random_graphs_run_every_task_after_its_parents() {
    const ROUNDS: usize = 12;
    const TASKS_PER_ROUND: usize = 150;
    const CONFIG: &str = "[worker]\nconcurrency = 4\nlease = \"1s\"\npoll_interval = \"500ms\"\n";
    let seed = std::env::var("PGTASKD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261207_u64);
    println!("dependencies chaos seed {seed} (set PGTASKD_CHAOS_SEED to replay)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut running: Vec<DaemonProcess> = (0..3)
        .map(|_| DaemonProcess::start(&db, CONFIG, &[]))
        .collect();
    let mut dead = Vec::new();
    let mut ids: Vec<i64> = Vec::new();
    let mut kills = 0;
    for round in 0..ROUNDS {
        for i in 0..TASKS_PER_ROUND {
            // Most tasks wait for a few earlier ones; every 50th for hundreds.
            let fan_in = if i % 50 == 49 { 300 } else { rng.usize(0..4) };
            let mut parents: Vec<i64> = (0..fan_in.min(ids.len()))
                .map(|_| ids[rng.usize(..ids.len())])
                .collect();
            parents.sort_unstable();
            parents.dedup();
            let parents = (!parents.is_empty()).then_some(parents);
            let id: i64 = client
                .query_one(
                    "INSERT INTO pgtaskd.tasks (payload, depends_on, max_attempts) \
                     VALUES ($1, $2, 50) RETURNING id",
                    &[&format!("round {round} task {i}"), &parents],
                )
                .await
                .unwrap()
                .get(0);
            ids.push(id);
        }
        let victim = rng.usize(..running.len());
        let mut daemon = running.swap_remove(victim);
        daemon.signal(libc::SIGKILL);
        daemon.wait().await;
        dead.push(daemon);
        running.push(DaemonProcess::start(&db, CONFIG, &[]));
        kills += 1;
    }
    let total = ids.len() as i64;
    crate::support::within(
        WAIT * 3,
        "every task of the graphs to succeed",
        wait_count(
            &client,
            "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
            total,
            "every task to succeed",
        ),
    )
    .await;
    let early = count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view AS c \
          CROSS JOIN LATERAL unnest(c.depends_on) AS x(parent) \
          JOIN pgtaskd.task_view AS p ON p.id = x.parent \
         WHERE c.started_at < p.finished_at",
    )
    .await;
    assert_eq!(early, 0, "no task started before one of its parents ended");
    let problems = count(&client, "SELECT count(*) FROM pgtaskd.check_deps()").await;
    assert_eq!(problems, 0);
    let by_status: HashMap<String, i64> = client
        .query(
            "SELECT status, count(*) FROM pgtaskd.task_view GROUP BY status",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    println!("{kills} kills; {by_status:?}");
    for mut daemon in running {
        daemon.stop_cleanly().await;
    }
}

/// `pgtaskd graph FILE`: the refs and ids printed parents first; a cycle is exit 2 naming it,
/// an `after` naming a task that does not exist exit 3, and neither inserts anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graph_command_inserts_parents_first_and_refuses_a_cycle() {
    let scratch = Scratch::new();
    let db = TestDb::new().await;
    let client = db.client().await;
    let write = |name: &str, text: &str| {
        let path = scratch.path(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let cycle = write(
        "cycle.json",
        r#"[{"ref": "a", "payload": "1", "after": ["b"]}, {"ref": "b", "payload": "2", "after": ["a"]}]"#,
    );
    let (status, _, stderr) =
        crate::support::daemon::pgtaskd(Some(&db.url), &["graph", &cycle]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cycle: a -> b -> a"), "{stderr}");
    let unknown = write(
        "unknown.json",
        r#"[{"ref": "a", "payload": "1", "after": [999]}]"#,
    );
    let (status, _, stderr) =
        crate::support::daemon::pgtaskd(Some(&db.url), &["graph", &unknown]).await;
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("task depends on task 999, which does not exist"),
        "{stderr}"
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.tasks").await,
        0
    );

    let good = write(
        "good.json",
        r#"[{"ref": "c", "payload": "3", "after": ["a", "b"]}, {"ref": "b", "payload": "2", "after": ["a"]}, {"ref": "a", "payload": "1"}]"#,
    );
    let (status, stdout, stderr) =
        crate::support::daemon::pgtaskd(Some(&db.url), &["graph", &good]).await;
    assert!(status.success(), "{stderr}");
    let lines: Vec<(String, i64)> = stdout
        .lines()
        .map(|line| {
            let (name, id) = line.split_once('\t').unwrap();
            (name.to_string(), id.parse().unwrap())
        })
        .collect();
    let names: Vec<&str> = lines.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"], "parents first");
    let waiting = count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'WAITING'",
    )
    .await;
    assert_eq!(waiting, 2);
}

/// A reader sampling through a drain by two daemons never sees a stranded child: in no
/// snapshot is a task WAITING whose parents have all SUCCEEDED, since each release commits
/// with its parent's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_sampling_through_a_drain_never_sees_a_stranded_child() {
    const PARENTS: i64 = 1_000;
    const CHILDREN: i64 = 3_000;
    const CONFIG: &str = "[worker]\nconcurrency = 4\npoll_interval = \"500ms\"\n";
    let db = TestDb::new().await;
    let client = db.client().await;
    let reader = db.client().await;
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload) SELECT 'parent ' || i FROM generate_series(1, $1::bigint) AS i",
            &[&PARENTS],
        )
        .await
        .unwrap();
    // Each child waits for one to three parents, or for an earlier child (chains).
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (payload, depends_on) \
             SELECT 'child ' || i, ARRAY(SELECT DISTINCT 1 + ((i * 7919 + k * 104729) % (\
                        $1::bigint + CASE WHEN i % 3 = 0 THEN i - 1 ELSE 0 END)) \
                                    FROM generate_series(1, 1 + i % 3) AS k) \
               FROM generate_series(1, $2::bigint) AS i",
            &[&PARENTS, &CHILDREN],
        )
        .await
        .unwrap();
    let daemons: Vec<DaemonProcess> = (0..2)
        .map(|_| DaemonProcess::start(&db, CONFIG, &[]))
        .collect();
    let total = PARENTS + CHILDREN;
    let mut samples = 0u64;
    let mut waiting_seen = 0i64;
    crate::support::within(WAIT * 3, "the drain, sampled", async {
        loop {
            let row = reader
                .query_one(
                    "SELECT (SELECT count(*) FROM pgtaskd.task_view AS c \
                              WHERE c.status = 'WAITING' \
                                AND NOT EXISTS (SELECT 1 FROM unnest(c.depends_on) AS x(parent) \
                                                  JOIN pgtaskd.task_view AS p ON p.id = x.parent \
                                                 WHERE p.status <> 'SUCCEEDED')), \
                            (SELECT count(*) FROM pgtaskd.task_view WHERE status = 'WAITING'), \
                            (SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED')",
                    &[],
                )
                .await
                .unwrap();
            let (stranded, waiting, succeeded): (i64, i64, i64) =
                (row.get(0), row.get(1), row.get(2));
            samples += 1;
            waiting_seen = waiting_seen.max(waiting);
            assert_eq!(
                stranded, 0,
                "sample {samples}: a WAITING task whose parents have all SUCCEEDED"
            );
            if succeeded == total {
                break;
            }
        }
    })
    .await;
    println!("{samples} samples through the drain of {total} tasks, none stranded");
    assert!(
        samples > 1 && waiting_seen > 0,
        "sampled while tasks waited"
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.check_deps()").await,
        0
    );
    for mut daemon in daemons {
        daemon.stop_cleanly().await;
    }
}
