//! The idle flags table's own mechanics (docs/design.md, "Idle flags"): idle and busy turns
//! keep the table at one page; the trigger's function runs only while a flag is live (the
//! `pgtaskd.idle_until` hint); a daemon going idle while another goes busy keeps its flag
//! counted whichever commits last; the turn that orders those writes never deadlocks and
//! never stalls a flag.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::idle_notify::LIVE_FLAGS;
use crate::support::{count, eventually, within, Cluster, TestDb, WAIT};

/// A daemon goes idle and busy up to once per task at some rates: its flag must not leave a
/// dead row version behind that only `VACUUM` takes away, since every INSERT's trigger reads
/// every page of the table. Autovacuum is off for the table here, as it is on some servers.
/// On a cluster of its own: a transaction that holds a transaction id anywhere on the server
/// (another test's database included) keeps every later row version from being pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_busy_turns_leave_the_flags_table_at_one_page() {
    const TURNS: usize = 5_000;
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let owner = db.client().await;
    owner
        .batch_execute("ALTER TABLE pgtaskd.idle_daemons SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let daemon = db.client().await;
    let ttl = Duration::from_secs(5);
    within(WAIT * 6, "the idle and busy turns", async {
        for turn in 0..TURNS {
            pgtaskd::queue::flag_idle(&daemon, "turning-daemon", ttl)
                .await
                .unwrap();
            if turn == TURNS - 1 {
                assert_eq!(count(&owner, LIVE_FLAGS).await, 1, "flagged: live");
            }
            pgtaskd::queue::clear_idle(&daemon, "turning-daemon")
                .await
                .unwrap();
        }
    })
    .await;
    assert_eq!(count(&owner, LIVE_FLAGS).await, 0, "busy: not live");
    let pages = count(
        &owner,
        "SELECT pg_relation_size('pgtaskd.idle_daemons') / current_setting('block_size')::bigint",
    )
    .await;
    assert!(
        pages <= 2,
        "{TURNS} idle and busy turns left the flags table at {pages} pages"
    );
    pgtaskd::queue::remove_idle(&daemon, "turning-daemon")
        .await
        .unwrap();
    assert_eq!(
        count(&owner, "SELECT count(*) FROM pgtaskd.idle_daemons").await,
        0,
        "a stopping daemon's goodbye deletes its row"
    );
}

/// How many times the trigger's function ran for one INSERT of `producer`'s, counted in a
/// transaction that is then rolled back (`track_functions`; the view also shows counts of
/// earlier transactions not yet reported, so the count is taken before and after).
async fn function_calls_of_an_insert(producer: &Client) -> i64 {
    const CALLS: &str = "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions
                          WHERE schemaname = 'pgtaskd' AND funcname = 'notify_tasks'";
    within(WAIT, "a counted insert", async {
        producer
            .batch_execute("BEGIN; SET LOCAL track_functions = 'pl'")
            .await
            .unwrap();
        let before = count(producer, CALLS).await;
        producer
            .batch_execute("INSERT INTO pgtaskd.tasks (payload) VALUES ('counted')")
            .await
            .unwrap();
        let after = count(producer, CALLS).await;
        producer.batch_execute("ROLLBACK").await.unwrap();
        after - before
    })
    .await
}

const HOUR: Duration = Duration::from_secs(3600);

/// Flag each of `instances` idle for an hour, from `client`.
async fn flag_for_an_hour(client: &Client, instances: &[&str]) {
    within(WAIT, "the flags", async {
        for instance in instances {
            pgtaskd::queue::flag_idle(client, instance, HOUR)
                .await
                .unwrap();
        }
    })
    .await;
}

/// The starting point of each round: `daemon-b` idle (on `b`), `daemon-a` busy (on `a`).
async fn b_idle_a_busy(a: &Client, b: &Client) {
    flag_for_an_hour(b, &["daemon-b"]).await;
    within(
        WAIT,
        "daemon-a busy",
        pgtaskd::queue::clear_idle(a, "daemon-a"),
    )
    .await
    .unwrap();
}

/// Schema 14: the trigger's `WHEN` reads `pgtaskd.idle_until`, which every write of a flag
/// sets from the flags table, so the function runs only while some flag is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_calls_the_triggers_function_only_while_a_flag_is_live() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let daemon = db.client().await;
    assert_eq!(function_calls_of_an_insert(&owner).await, 0, "no flag yet");
    flag_for_an_hour(&daemon, &["daemon-a", "daemon-b"]).await;
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        1,
        "two live flags"
    );
    within(WAIT, "a cleared flag", async {
        pgtaskd::queue::clear_idle(&daemon, "daemon-a")
            .await
            .unwrap()
    })
    .await;
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        1,
        "the other flag still counts"
    );
    within(WAIT, "the other flag removed", async {
        pgtaskd::queue::remove_idle(&daemon, "daemon-b")
            .await
            .unwrap()
    })
    .await;
    assert_eq!(function_calls_of_an_insert(&owner).await, 0, "no live flag");
    // A flag that expires by itself (a killed daemon's) stops counting with no write.
    within(WAIT, "a short flag", async {
        pgtaskd::queue::flag_idle(&daemon, "daemon-a", Duration::from_secs(2))
            .await
            .unwrap()
    })
    .await;
    eventually(WAIT, "the short flag to expire", || async {
        (function_calls_of_an_insert(&owner).await == 0).then_some(())
    })
    .await;
    // An operator's DELETE counts as a write too.
    within(WAIT, "a flag, then the operator's delete", async {
        pgtaskd::queue::flag_idle(&daemon, "daemon-a", HOUR)
            .await
            .unwrap();
        assert_eq!(function_calls_of_an_insert(&owner).await, 1);
        owner
            .batch_execute("DELETE FROM pgtaskd.idle_daemons")
            .await
            .unwrap();
    })
    .await;
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        0,
        "flags deleted"
    );
}

/// Two daemons, one going idle while the other goes busy, each a write of the flags whose
/// trigger sets `pgtaskd.idle_until` from the flags it sees: the idle one's flag must count
/// whichever commits last. Forced both ways (the later writer tries for the earlier one's
/// turn while its transaction is open), then raced freely behind a barrier, 30 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_going_idle_while_another_goes_busy_keeps_its_flag_counted() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let a = Arc::new(db.client().await);
    let b = Arc::new(db.client().await);
    // The turn is tried without waiting, every 10 ms for at most half a second.
    let waiting_for_its_turn = "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event = 'PgSleep'";
    for busy_first in [true, false] {
        b_idle_a_busy(&a, &b).await;
        // The first writer's transaction stays open with its turn taken.
        let (first, first_sql) = if busy_first {
            (&b, "UPDATE pgtaskd.idle_daemons SET expires_at = '-infinity' WHERE instance = 'daemon-b'")
        } else {
            (
                &a,
                "INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
                  VALUES ('daemon-a', now() + interval '1 hour')
                  ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at",
            )
        };
        within(WAIT, "the first write", async {
            first.batch_execute("BEGIN").await.unwrap();
            first.batch_execute(first_sql).await.unwrap();
        })
        .await;
        let second = if busy_first {
            let a = a.clone();
            tokio::spawn(async move {
                pgtaskd::queue::flag_idle(&a, "daemon-a", HOUR)
                    .await
                    .map(|_| ())
            })
        } else {
            let b = b.clone();
            tokio::spawn(async move { pgtaskd::queue::clear_idle(&b, "daemon-b").await })
        };
        eventually(WAIT, "the second writer to wait for its turn", || async {
            (count(&owner, waiting_for_its_turn).await == 1).then_some(())
        })
        .await;
        within(WAIT, "the first commit", first.batch_execute("COMMIT"))
            .await
            .unwrap();
        within(WAIT, "the second write", second)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            count(&owner, LIVE_FLAGS).await,
            1,
            "busy first: {busy_first}"
        );
        assert_eq!(
            function_calls_of_an_insert(&owner).await,
            1,
            "busy first: {busy_first}: the idle daemon's flag counts"
        );
    }
    for round in 0..30 {
        b_idle_a_busy(&a, &b).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let idle = {
            let (a, barrier) = (a.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                pgtaskd::queue::flag_idle(&a, "daemon-a", HOUR)
                    .await
                    .map(|_| ())
            })
        };
        let busy = {
            let (b, barrier) = (b.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                pgtaskd::queue::clear_idle(&b, "daemon-b").await
            })
        };
        within(WAIT, "both writes", async {
            idle.await.unwrap().unwrap();
            busy.await.unwrap().unwrap();
        })
        .await;
        assert_eq!(
            function_calls_of_an_insert(&owner).await,
            1,
            "round {round}: the idle daemon's flag counts"
        );
    }
}

/// The turn is taken before any row is locked and never waited for long: an operator's
/// transaction that writes two flags does not deadlock with a daemon's write between them,
/// and one that holds the flags table's `SHARE UPDATE EXCLUSIVE` lock (an `ANALYZE` left open)
/// delays a daemon's flag by about half a second, not its lock timeout, and the flag still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_never_deadlocks_and_never_stalls_a_flag() {
    let db = TestDb::new().await;
    let owner = db.client().await;
    let operator = db.client().await;
    let daemon = Arc::new(db.client().await);
    flag_for_an_hour(&daemon, &["daemon-a", "daemon-b"]).await;
    within(
        WAIT,
        "the operator's first write",
        operator.batch_execute(
            "BEGIN; UPDATE pgtaskd.idle_daemons SET expires_at = now() + interval '2 hours'
                    WHERE instance = 'daemon-a'",
        ),
    )
    .await
    .unwrap();
    let busy = {
        let daemon = daemon.clone();
        tokio::spawn(async move { pgtaskd::queue::clear_idle(&daemon, "daemon-b").await })
    };
    within(
        WAIT,
        "the operator's second write",
        operator.batch_execute(
            "UPDATE pgtaskd.idle_daemons SET expires_at = now() + interval '2 hours'
              WHERE instance = 'daemon-b'; COMMIT",
        ),
    )
    .await
    .expect("no deadlock: the daemon's write holds no row while it tries for the turn");
    within(WAIT, "the daemon's write", busy)
        .await
        .unwrap()
        .expect("the daemon's write is not the deadlock's victim either");

    within(WAIT, "an analyze left open", async {
        operator
            .batch_execute("UPDATE pgtaskd.idle_daemons SET expires_at = '-infinity'")
            .await
            .unwrap();
        operator
            .batch_execute("BEGIN; ANALYZE pgtaskd.idle_daemons")
            .await
            .unwrap();
    })
    .await;
    assert_eq!(function_calls_of_an_insert(&owner).await, 0, "no live flag");
    let started = Instant::now();
    within(
        Duration::from_secs(20),
        "a flag while the turn is held by someone else",
        pgtaskd::queue::flag_idle(&daemon, "daemon-a", HOUR),
    )
    .await
    .expect("the flag is written without its turn");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the flag waited {:?}, about half a second expected",
        started.elapsed()
    );
    assert_eq!(
        function_calls_of_an_insert(&owner).await,
        1,
        "a flag written without the turn still raises the value"
    );
    within(WAIT, "the analyze's end", operator.batch_execute("COMMIT"))
        .await
        .unwrap();
}
