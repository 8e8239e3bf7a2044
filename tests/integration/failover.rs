//! Failover: daemons given a list of servers follow the primary, as libpq clients do.
//!
//! A primary and a streaming standby of its own run on this machine ([`Cluster`]). The daemons
//! get both in one string with `target_session_attrs=read-write`, so every session they open
//! goes to whichever of the two accepts writes. The primary is crashed mid-drain and the
//! standby promoted; with synchronous replication no acknowledged commit is lost, and what was
//! in flight is settled by the daemons' own rules (a finish whose commit outcome was lost is
//! re-read, a claim whose answer was lost is given back), so every task ends once, with its
//! counts. Also: a daemon whose list starts with a standby works on the primary, and a write
//! that a read-only server refuses discards its session like any outage.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgtaskd::events::ANALYZER_RUN;
use pgtaskd::queue::TaskStatus;
use tokio_postgres::Client;

use crate::support::daemon::{pgtaskd, wait_listening};
use crate::support::{
    assert_all_succeeded, audit, connect, conninfo, count, enqueue, eventually, insert_payloads,
    wait_status, within, Cluster, DaemonProcess, TestDb, WAIT,
};

const TASKS: usize = 20_000;
const CONFIG: &str = "[worker]\nconcurrency = 8\nlease = \"10s\"\npoll_interval = \"200ms\"\n\
                      [database]\nconnect_timeout = \"2s\"\n";
const TERMINAL: &str =
    "SELECT count(*) FROM pgtaskd.task_view WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELED')";

/// Make every commit on the primary wait for the standby (`synchronous_standby_names`, with
/// the default `synchronous_commit = on`), and wait until the standby replicates that way.
/// Set after the base backup, so that the standby, once promoted, does not wait for a standby
/// of its own.
async fn replicate_synchronously(primary: &Client) {
    primary
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        .await
        .unwrap();
    primary
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    wait_streaming(primary, "sync").await;
}

/// Wait until one standby streams from `primary` with this `sync_state`.
async fn wait_streaming(primary: &Client, sync_state: &'static str) {
    eventually(WAIT, "the standby to stream", || async move {
        let streaming: i64 = primary
            .query_one(
                "SELECT count(*) FROM pg_stat_replication
                  WHERE state = 'streaming' AND sync_state = $1",
                &[&sync_state],
            )
            .await
            .ok()?
            .get(0);
        (streaming == 1).then_some(())
    })
    .await;
}

/// Set `synchronous_standby_names` to `names` (empty: reset to the default, none) on the
/// server of `db`, and wait until new sessions see it.
async fn set_standby_names(db: &TestDb, names: &str) {
    let client = db.client().await;
    let alter = if names.is_empty() {
        "ALTER SYSTEM RESET synchronous_standby_names".to_string()
    } else {
        format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'")
    };
    client.batch_execute(&alter).await.unwrap();
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    eventually(WAIT, "the setting in new sessions", || async {
        let fresh = db.client().await;
        let seen: String = fresh
            .query_one("SHOW synchronous_standby_names", &[])
            .await
            .ok()?
            .get(0);
        (seen == names).then_some(())
    })
    .await;
}

/// A client of database `dbname` on `cluster`.
async fn client_on(cluster: &Cluster, dbname: &str) -> Client {
    connect(&conninfo(&cluster.config("postgres"), dbname)).await
}

/// Every `(id, attempt, claim)` in an [`ANALYZER_RUN`] debug line.
fn analyzer_runs(log: &str) -> Vec<(i64, i32, i64)> {
    log.lines()
        .filter(|line| line.contains(ANALYZER_RUN))
        .filter_map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(name))
                    .and_then(|value| value.parse::<i64>().ok())
            };
            Some((field("id=")?, field("attempt=")? as i32, field("claim=")?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_crash_mid_drain_and_a_promoted_synchronous_standby_lose_no_task_and_finish_none_twice(
) {
    let primary = Cluster::start_primary();
    let db = TestDb::on(&primary).await;
    let client = db.client().await;
    audit::install(&client).await;
    let standby = Cluster::start_standby_of(&primary);
    within(
        WAIT,
        "synchronous replication",
        replicate_synchronously(&client),
    )
    .await;
    within(WAIT, "the backlog", insert_payloads(&client, TASKS)).await;

    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write",
        primary.port, standby.port, db.name
    );
    let standby_client = client_on(&standby, &db.name).await;
    let mut daemons = [
        DaemonProcess::start_url(&url, CONFIG, &[]),
        DaemonProcess::start_url(&url, CONFIG, &[]),
    ];
    eventually(WAIT, "a fifth of the backlog to finish", || {
        let client = &client;
        async move { (count(client, TERMINAL).await >= (TASKS / 5) as i64).then_some(()) }
    })
    .await;

    // The crash, timed by the server's clock, which the new primary's finished_at shares.
    let crashed_at: String = within(
        WAIT,
        "the clock",
        standby_client.query_one("SELECT clock_timestamp()::text", &[]),
    )
    .await
    .unwrap()
    .get(0);
    primary.stop_server(false);
    let crashed = Instant::now();
    standby.promote();
    let promoted = crashed.elapsed();

    let new_primary = standby_client;
    let at_promotion = within(WAIT, "a count", count(&new_primary, TERMINAL)).await;
    assert!(
        at_promotion < TASKS as i64,
        "the crash came after the drain: every task was already terminal"
    );
    eventually(WAIT, "every task to be terminal on the new primary", || {
        let client = &new_primary;
        async move { (count(client, TERMINAL).await == TASKS as i64).then_some(()) }
    })
    .await;
    let drained = crashed.elapsed();
    let first_finish_ms: f64 = within(
        WAIT,
        "the first finish",
        new_primary.query_one(
            "SELECT (extract(epoch FROM min(finished_at) - $1::text::timestamptz) * 1000)::float8
               FROM pgtaskd.task_view WHERE finished_at > $1::text::timestamptz",
            &[&crashed_at],
        ),
    )
    .await
    .unwrap()
    .get(0);
    println!(
        "failover: {at_promotion} of {TASKS} tasks terminal at the crash; standby promoted \
         {} ms after it; first finish on the new primary {first_finish_ms:.0} ms after it; \
         all terminal after {} ms",
        promoted.as_millis(),
        drained.as_millis()
    );

    assert_eq!(assert_all_succeeded(&new_primary, None).await, TASKS);
    assert_eq!(audit::transitions_out_of_terminal(&new_primary).await, 0);
    assert_eq!(audit::tasks_finished_twice(&new_primary).await, 0);
    let attempts: HashMap<i64, i32> = new_primary
        .query("SELECT id, attempt FROM pgtaskd.task_view", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    println!(
        "failover: {} tasks needed more than one claim",
        attempts.values().filter(|a| **a > 1).count()
    );

    for daemon in &mut daemons {
        daemon.stop_cleanly().await;
    }
    let mut runs: HashMap<i64, usize> = HashMap::new();
    let mut run_attempts = Vec::new();
    for daemon in &daemons {
        for (id, attempt, claim) in analyzer_runs(&daemon.log_text()) {
            *runs.entry(claim).or_default() += 1;
            run_attempts.push((id, attempt));
        }
    }
    assert!(!runs.is_empty(), "the debug log names the analyzer's runs");
    for (claim, n) in &runs {
        assert_eq!(
            *n, 1,
            "claim {claim}: the analyzer ran {n} times for one claim token"
        );
    }
    for (id, attempt) in &run_attempts {
        assert!(
            attempt <= &attempts[id],
            "task {id}: a run for attempt {attempt} beyond its claims"
        );
    }
}

/// The operators' failover: two busy daemons with four workers each and a short lease, the
/// primary crashed once 3,000 tasks have SUCCEEDED (with a large batched finish in flight),
/// the standby promoted. The standby was copied after `synchronous_standby_names` was set,
/// so the promoted server holds every commit for a standby of its own that is not there.
/// Every task ends SUCCEEDED once, and the new primary sees tasks finish again within 30 s
/// of the promotion: the daemons' sessions do not wait for that standby, and nothing waits for
/// a pooled session that never frees. (The time the rest of the backlog takes is the drain's
/// rate on a loaded machine, printed, not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_finishes_every_task_once_and_resumes_within_30_s_of_the_promotion() {
    const LOADED: &str = "[worker]\nconcurrency = 4\nlease = \"5s\"\npoll_interval = \"1s\"\n";
    let primary = Cluster::start_primary();
    let db = TestDb::on(&primary).await;
    let client = db.client().await;
    audit::install(&client).await;
    // Set before the base backup: the standby, once promoted, keeps it.
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "SELECT pg_reload_conf()",
    ] {
        within(WAIT, sql, client.batch_execute(sql)).await.unwrap();
    }
    let standby = Cluster::start_standby_of(&primary);
    within(
        WAIT,
        "synchronous replication",
        wait_streaming(&client, "sync"),
    )
    .await;
    within(WAIT, "the backlog", insert_payloads(&client, TASKS)).await;

    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write&connect_timeout=2",
        primary.port, standby.port, db.name
    );
    let standby_client = client_on(&standby, &db.name).await;
    let env = [("RUST_LOG", "pgtaskd=info")];
    let mut daemons = [
        DaemonProcess::start_with_env(&url, LOADED, &[], &env),
        DaemonProcess::start_with_env(&url, LOADED, &[], &env),
    ];
    const SUCCEEDED: &str = "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'";
    eventually(WAIT, "3,000 tasks to succeed", || {
        let client = &client;
        async move { (count(client, SUCCEEDED).await >= 3_000).then_some(()) }
    })
    .await;
    primary.stop_server(false);
    standby.promote();
    let promoted = Instant::now();

    let new_primary = standby_client;
    // The promoted server holds every commit the daemons saw acknowledged (the standby was
    // synchronous); 100 more finished there means the daemons work on it again.
    let at_promotion = within(WAIT, "a count", count(&new_primary, SUCCEEDED)).await;
    eventually(
        Duration::from_secs(120),
        "tasks to finish on the new primary",
        || {
            let client = &new_primary;
            async move { (count(client, SUCCEEDED).await >= at_promotion + 100).then_some(()) }
        },
    )
    .await;
    let resumed = promoted.elapsed();
    eventually(
        Duration::from_secs(300),
        "every task to be terminal on the new primary",
        || {
            let client = &new_primary;
            async move { (count(client, TERMINAL).await == TASKS as i64).then_some(()) }
        },
    )
    .await;
    println!(
        "failover under load: {at_promotion} of {TASKS} tasks SUCCEEDED at the promotion, \
         100 more {} ms after it, all terminal {} ms after it",
        resumed.as_millis(),
        promoted.elapsed().as_millis()
    );
    assert_eq!(assert_all_succeeded(&new_primary, None).await, TASKS);
    assert_eq!(audit::transitions_out_of_terminal(&new_primary).await, 0);
    assert_eq!(audit::tasks_finished_twice(&new_primary).await, 0);
    for daemon in &mut daemons {
        daemon.stop_cleanly().await;
    }
    assert!(
        resumed < Duration::from_secs(30),
        "tasks finished on the new primary only {resumed:?} after the promotion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_host_list_starts_with_a_standby_works_on_the_primary() {
    let primary = Cluster::start_primary();
    let db = TestDb::on(&primary).await;
    let client = db.client().await;
    let standby = Cluster::start_standby_of(&primary);
    wait_streaming(&client, "async").await;

    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname={} \
         target_session_attrs=read-write",
        standby.port, primary.port, db.name
    );
    let mut daemon = DaemonProcess::start_url(&url, CONFIG, &[]);
    wait_listening(&db, 1).await;
    let id = within(
        WAIT,
        "enqueue",
        enqueue(&client, "the standby comes first in the list"),
    )
    .await;
    wait_status(&client, id, TaskStatus::Succeeded).await;

    let standby_client = client_on(&standby, &db.name).await;
    eventually(
        Duration::from_secs(10),
        "no pgtaskd session on the standby",
        || {
            let client = &standby_client;
            async move {
                let sessions = count(
                    client,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgtaskd/%'",
                )
                .await;
                (sessions == 0).then_some(())
            }
        },
    )
    .await;

    // The one-shot commands take the same list.
    let (status, stdout, stderr) = pgtaskd(Some(&url), &["status", &id.to_string()]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("SUCCEEDED"), "{stdout}");

    daemon.stop_cleanly().await;
}

#[tokio::test]
async fn a_write_refused_as_read_only_is_unavailability_and_its_session_is_discarded() {
    let db = TestDb::new().await;
    let pool = db.pool(2);
    let session = within(WAIT, "a pooled session", pool.get()).await.unwrap();
    within(
        WAIT,
        "SET",
        session.batch_execute("SET default_transaction_read_only = on"),
    )
    .await
    .unwrap();
    let err = session
        .bounded(pgtaskd::queue::enqueue(
            &session,
            &pgtaskd::queue::NewTask::new("default", "refused"),
        ))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );
    drop(session);
    assert_eq!(pool.status(), (0, 0), "the read-only session was discarded");

    let session = within(WAIT, "a pooled session", pool.get()).await.unwrap();
    let enqueued = session
        .bounded(pgtaskd::queue::enqueue(
            &session,
            &pgtaskd::queue::NewTask::new("default", "accepted"),
        ))
        .await
        .unwrap();
    assert!(matches!(enqueued, pgtaskd::queue::Enqueued::Created(id) if id > 0));
}

/// Claim the queued tasks of the default queue as `owner`: `(id, token)` of each.
async fn claim_all(client: &Client, owner: &str) -> Vec<(i64, i64)> {
    let rows = within(
        WAIT,
        "a claim",
        client.query(
            "SELECT task_id, task_claim FROM pgtaskd.claim(ARRAY['default'], 100, $1, 60000, \
             1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL",
            &[&owner],
        ),
    )
    .await
    .unwrap();
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// One claim, one token, across a failover that lost WAL: a standby that fell behind the
/// primary's last claims is promoted, and its sequence of tokens is where the lost WAL left
/// it. The claims it then makes of the same tasks take tokens above every token of the old
/// timeline (the timeline is part of each token), so the finish of a claim the failover lost
/// writes nothing over them. A cluster never promoted keeps the tokens of its sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_that_missed_claims_gives_none_of_their_tokens_again() {
    let primary = Cluster::start_primary();
    let db = TestDb::on(&primary).await;
    let client = db.client().await;
    let standby = Cluster::start_standby_of(&primary);
    insert_payloads(&client, 3).await;
    let standby_client = client_on(&standby, &db.name).await;
    eventually(WAIT, "the tasks on the standby", || {
        let client = &standby_client;
        async move { (count(client, "SELECT count(*) FROM pgtaskd.tasks").await == 3).then_some(()) }
    })
    .await;
    drop(standby_client);
    // The standby stops before the claims: their WAL never reaches it.
    standby.stop_server(true);
    let lost = claim_all(&client, "daemon-a").await;
    assert_eq!(lost.len(), 3, "{lost:?}");
    assert!(
        lost.iter().all(|&(_, token)| token < 1 << 47),
        "timeline 1 keeps the sequence's tokens: {lost:?}"
    );
    drop(client);
    primary.stop_server(false);
    standby.start_server();
    standby.promote();
    let new_primary = client_on(&standby, &db.name).await;
    let queued = eventually(WAIT, "the new primary to take writes", || {
        let client = &new_primary;
        async move {
            let read_only: bool = client
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .ok()?
                .get(0);
            (!read_only).then_some(())
        }
    });
    queued.await;
    let again = claim_all(&new_primary, "daemon-b").await;
    assert_eq!(
        again.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        lost.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        "the same tasks, claimed again"
    );
    let highest_lost = lost.iter().map(|&(_, token)| token).max().unwrap();
    for &(id, token) in &again {
        assert!(
            token > highest_lost,
            "task {id}: token {token} after the failover, {highest_lost} before it"
        );
    }
    // The lost claims' finishes find no claim of theirs.
    let ids: Vec<i64> = lost.iter().map(|&(id, _)| id).collect();
    let tokens: Vec<i64> = lost.iter().map(|&(_, token)| token).collect();
    let n = ids.len();
    let written: i64 = new_primary
        .query_one(
            "SELECT count(written) FROM pgtaskd.finish($1, $2, $3, $4, $4, $4, $5, $5, $6, false)",
            &[
                &tokens,
                &ids,
                &vec!["SUCCEEDED".to_string(); n],
                &vec![1i64; n],
                &vec![None::<String>; n],
                &vec![None::<f64>; n],
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        written, 0,
        "a lost claim's finish wrote over the new claims"
    );
    let running = count(
        &new_primary,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'RUNNING' AND lease_owner = 'daemon-b'",
    )
    .await;
    assert_eq!(running, 3);
}

/// The synchronous standby goes away under a running daemon whose statements have no
/// timeout and a pool of two sessions: the commits of its sessions opened before wait for
/// it, holding their tasks' rows, every session of the pool among them. The replication
/// watch, on a session of its own, ends those waits (the commits stay made on the primary),
/// so that every task finishes, once, without the standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_left_waiting_for_a_synchronous_standby_that_went_away_are_ended() {
    let primary = Cluster::start_primary();
    let db = TestDb::on(&primary).await;
    let client = db.client().await;
    let standby = Cluster::start_standby_of(&primary);
    replicate_synchronously(&client).await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 2\npoll_interval = \"200ms\"\n\
         [database]\nstatement_timeout = \"0s\"\npool_size = 2\n",
        &[],
    );
    // Producers that do not wait for the standby themselves.
    let quiet = db.client().await;
    quiet
        .batch_execute("SET synchronous_commit = local")
        .await
        .unwrap();
    let first = enqueue(&quiet, "one two").await;
    assert_eq!(
        wait_status(&client, first, TaskStatus::Succeeded)
            .await
            .words,
        2
    );

    standby.stop_server(true);
    eventually(WAIT, "the standby to be gone", || async {
        let left = count(&client, "SELECT count(*) FROM pg_stat_replication").await;
        (left == 0).then_some(())
    })
    .await;
    let mut ids = Vec::new();
    for payload in ["three four five", "six seven", "eight"] {
        ids.push(enqueue(&quiet, payload).await);
    }
    for (id, words) in ids.iter().zip([3, 2, 1]) {
        let task = wait_status(&client, *id, TaskStatus::Succeeded).await;
        assert_eq!(task.words, words, "task {id}");
    }
    daemon
        .wait_for_log("ended the waits of this daemon's sessions")
        .await;
    let waiting = count(
        &client,
        "SELECT count(*) FROM pg_stat_activity
          WHERE wait_event = 'SyncRep' AND application_name LIKE 'pgtaskd/%'",
    )
    .await;
    assert_eq!(waiting, 0, "daemon sessions still waiting for the standby");

    set_standby_names(&db, "").await;
    daemon.stop_cleanly().await;
}

/// An asynchronous standby connected to a primary whose `synchronous_standby_names` names
/// another one, which is not there: every commit still waits, so the daemon's sessions must
/// commit locally, as with no standby at all (`pg_stat_replication` is not empty, but none of
/// its standbys is `sync` or `quorum`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_standby_does_not_count_as_the_synchronous_one_that_is_missing() {
    let primary = Cluster::start_primary();
    let db = TestDb::on(&primary).await;
    let client = db.client().await;
    let _standby = Cluster::start_standby_of(&primary);
    wait_streaming(&client, "async").await;
    set_standby_names(&db, "absent_standby").await;
    wait_streaming(&client, "async").await;

    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 2\npoll_interval = \"200ms\"\n",
        &[],
    );
    daemon.wait_for_log("send no notifications").await;
    let quiet = db.client().await;
    quiet
        .batch_execute("SET synchronous_commit = local")
        .await
        .unwrap();
    let id: i64 = quiet
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('one two three') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let task = wait_status(&client, id, TaskStatus::Succeeded).await;
    assert_eq!(task.words, 3);

    set_standby_names(&db, "").await;
    daemon.stop_cleanly().await;
}

/// A server that holds commits for a synchronous standby that is not connected, and a
/// producer whose transaction notified (its own channel, or the insert trigger's) and now
/// waits in its commit: it holds the lock every NOTIFY of the cluster takes at commit, for
/// as long as the standby stays away. The daemon's sessions there commit locally and send no
/// notifications ("No commit waits for a standby that is not there"), so tasks still finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_stuck_after_its_notify_on_a_server_missing_its_standby_holds_up_no_finish() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let client = db.client().await;
    set_standby_names(&db, "absent_standby").await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 2\npoll_interval = \"200ms\"\n",
        &[],
    );
    daemon.wait_for_log("send no notifications").await;

    // The producer: it notified, and its commit waits for the standby.
    let producer = db.client().await;
    let producer_pid: i32 = producer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let stuck = tokio::spawn(async move {
        producer
            .batch_execute(
                "BEGIN; INSERT INTO pgtaskd.tasks (payload) VALUES ('stuck producer'); \
                 NOTIFY app_channel; COMMIT",
            )
            .await
    });
    eventually(WAIT, "the producer to wait for the standby", || async {
        let waiting = count(
            &client,
            &format!(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE pid = {producer_pid} AND wait_event = 'SyncRep'"
            ),
        )
        .await;
        (waiting == 1).then_some(())
    })
    .await;

    // A task from a producer that does not wait (as the daemon's own sessions do).
    let quiet = db.client().await;
    quiet
        .batch_execute("SET synchronous_commit = local; SET pgtaskd.notify = off")
        .await
        .unwrap();
    let id: i64 = quiet
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('one two') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let task = wait_status(&client, id, TaskStatus::Succeeded).await;
    assert_eq!(task.words, 2);

    // A daemon started now starts (its check that notifications reach PostgreSQL would wait
    // behind the producer's commit) and finishes tasks beside the first.
    let mut late = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 2\npoll_interval = \"200ms\"\n",
        &[],
    );
    late.wait_for_log("going on without the check").await;
    late.wait_for_log("send no notifications").await;
    daemon.signal(libc::SIGSTOP);
    let id: i64 = quiet
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload) VALUES ('three four five') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let task = wait_status(&client, id, TaskStatus::Succeeded).await;
    assert_eq!(task.words, 3);
    daemon.signal(libc::SIGCONT);
    late.stop_cleanly().await;

    // Let the producer go, and the database be dropped without waiting for a standby.
    client
        .batch_execute(&format!("SELECT pg_terminate_backend({producer_pid})"))
        .await
        .unwrap();
    let _ = within(WAIT, "the producer to end", stuck).await;
    set_standby_names(&db, "").await;
    daemon.stop_cleanly().await;
}
