//! Test support: the PostgreSQL server the tests talk to, a database per test, the daemon
//! in-process or as a real process, and analyzers that tests can hold at a gate.
//!
//! The server is `PGTASKD_TEST_DATABASE_URL` when set (it needs CREATEDB), else a throwaway
//! cluster that this process starts with `initdb` and `postgres` from the installed server
//! binaries (as the `postgres` user when running as root: PostgreSQL refuses root). There is
//! no skipping: without either, tests fail with a message saying how to get one.

#![allow(dead_code)]

pub mod audit;
pub mod cluster;
pub mod daemon;
pub mod gate;
pub mod probe;
pub mod proxy;

use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use pgtaskd::config::Config;
use tokio_postgres::{Client, NoTls};

pub use cluster::{free_port, Cluster};

/// A connection string to a loopback port where nothing listens.
pub fn nowhere() -> String {
    let port = free_port();
    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2")
}
pub use daemon::{DaemonProcess, InProcessDaemon};
pub use gate::GatedAnalyzer;

/// How long any single await in a test may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(60);

/// Await `future`, failing the test after `limit`.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Poll `check` until it returns `Some`, failing after `limit`. For conditions that only the
/// database can tell (a row's state); the polling interval is not a synchronization.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(limit, what, async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// The server every test database is created on.
pub enum Server {
    External(tokio_postgres::Config),
    Local(Cluster),
}

impl Server {
    fn admin_config(&self) -> tokio_postgres::Config {
        match self {
            Server::External(config) => config.clone(),
            Server::Local(cluster) => cluster.config("postgres"),
        }
    }
}

/// The shared server of this test process, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("PGTASKD_TEST_DATABASE_URL") {
        Ok(url) => Server::External(
            tokio_postgres::Config::from_str(&url).unwrap_or_else(|err| {
                panic!("PGTASKD_TEST_DATABASE_URL is not a connection string: {err}")
            }),
        ),
        Err(_) => Server::Local(Cluster::start_shared()),
    })
}

/// The TCP address of the shared server, for a proxy in front of it.
pub fn server_addr() -> std::net::SocketAddr {
    use tokio_postgres::config::Host;
    let config = server().admin_config();
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        _ => panic!("the fault proxy needs a TCP server address"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
        .expect("resolve the server address")
        .next()
        .expect("one address")
}

/// The user the tests connect as.
pub fn server_user() -> String {
    server()
        .admin_config()
        .get_user()
        .unwrap_or("postgres")
        .to_string()
}

/// A connection string with every part of `config` and the database `dbname`, in key=value
/// form (what a daemon process receives).
pub fn conninfo(config: &tokio_postgres::Config, dbname: &str) -> String {
    use tokio_postgres::config::Host;
    let mut parts = Vec::new();
    if let Some(host) = config.get_hosts().first() {
        match host {
            Host::Tcp(name) => parts.push(format!("host={name}")),
            Host::Unix(path) => parts.push(format!("host={}", path.display())),
        }
    }
    if let Some(port) = config.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = config.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(password) = config.get_password() {
        parts.push(format!("password={}", String::from_utf8_lossy(password)));
    }
    parts.push(format!("dbname={dbname}"));
    parts.join(" ")
}

/// Connect with a plain client, driving the connection on a task.
pub async fn connect(conninfo: &str) -> Client {
    let (client, connection) = within(WAIT, "a database connection", async {
        tokio_postgres::connect(conninfo, NoTls).await
    })
    .await
    .unwrap_or_else(|err| panic!("cannot connect to the test database ({conninfo}): {err}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A database of its own for one test, migrated, dropped when the value is dropped (also
/// when the test panics).
pub struct TestDb {
    pub name: String,
    pub url: String,
    admin: String,
}

impl TestDb {
    /// A fresh, migrated database.
    pub async fn new() -> TestDb {
        TestDb::empty().await.migrated().await
    }

    /// This database with the pgtaskd schema applied.
    async fn migrated(self) -> TestDb {
        let mut client = self.client().await;
        within(
            WAIT,
            "migrations",
            pgtaskd::db::migrate::migrate(&mut client),
        )
        .await
        .expect("migrations apply to a fresh database");
        self
    }

    /// A fresh database without the pgtaskd schema.
    pub async fn empty() -> TestDb {
        TestDb::create("").await
    }

    /// A fresh database created with extra `CREATE DATABASE` options.
    pub async fn create(options: &str) -> TestDb {
        TestDb::create_on(server().admin_config(), options).await
    }

    /// A fresh database without the pgtaskd schema, on a cluster of the test's own.
    pub async fn empty_on(cluster: &Cluster) -> TestDb {
        TestDb::create_on(cluster.config("postgres"), "").await
    }

    /// A fresh, migrated database on a cluster of the test's own.
    pub async fn on(cluster: &Cluster) -> TestDb {
        TestDb::create_on(cluster.config("postgres"), "")
            .await
            .migrated()
            .await
    }

    async fn create_on(admin_config: tokio_postgres::Config, options: &str) -> TestDb {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let admin_db = admin_config.get_dbname().unwrap_or("postgres").to_string();
        let admin = conninfo(&admin_config, &admin_db);
        let name = format!(
            "pgtaskd_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let client = connect(&admin).await;
        within(
            WAIT,
            "CREATE DATABASE",
            client.batch_execute(&format!("CREATE DATABASE {name} {options}")),
        )
        .await
        .unwrap_or_else(|err| panic!("cannot create test database {name}: {err:?}"));
        TestDb {
            url: conninfo(&admin_config, &name),
            name,
            admin,
        }
    }

    pub async fn client(&self) -> Client {
        connect(&self.url).await
    }

    /// A daemon configuration for this database, from `toml` plus the database URL.
    pub fn config(&self, toml: &str) -> Config {
        let mut config = Config::from_toml(toml, "test").expect("test config is valid");
        config.database.url = Some(self.url.clone());
        config
    }

    /// A pool of `size` sessions on this database.
    pub fn pool(&self, size: usize) -> pgtaskd::db::Pool {
        let mut config = self.config("");
        config.database.pool_size = size;
        pgtaskd::db::ConnectSettings::new(&config.database, "test")
            .expect("test URL parses")
            .pool()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop may run inside a runtime, or while unwinding: use a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for dropping the test database");
            runtime.block_on(async {
                let Ok(Ok((client, connection))) =
                    tokio::time::timeout(WAIT, tokio_postgres::connect(&admin, NoTls)).await
                else {
                    return;
                };
                tokio::spawn(connection);
                let _ = tokio::time::timeout(
                    WAIT,
                    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")),
                )
                .await;
            });
        });
        let _ = dropped.join();
    }
}

/// Enqueue one task through `pgtaskd.enqueue`; returns its id.
pub async fn enqueue(client: &Client, payload: &str) -> i64 {
    client
        .query_one("SELECT pgtaskd.enqueue($1)", &[&payload])
        .await
        .unwrap()
        .get(0)
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

/// Leave the task table as a drained queue's after its vacuum: statistics that say "no rows",
/// kept so (autovacuum off for the table) however the test then fills it.
pub async fn statistics_say_empty(client: &Client) {
    client
        .batch_execute(
            "ALTER TABLE pgtaskd.tasks SET (autovacuum_enabled = false);
             INSERT INTO pgtaskd.tasks (payload) SELECT 'probe ' || i FROM generate_series(1, 100) i;
             DELETE FROM pgtaskd.tasks;",
        )
        .await
        .unwrap();
    client
        .batch_execute("VACUUM ANALYZE pgtaskd.tasks")
        .await
        .unwrap();
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
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgtaskd.tasks",
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
            "SELECT id, payload, status, words, bytes, runes, attempt FROM pgtaskd.tasks",
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
