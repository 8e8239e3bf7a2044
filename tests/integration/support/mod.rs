//! Test support: the PostgreSQL server the tests talk to, a database per test, the daemon
//! in-process or as a real process, analyzers that tests can hold at a gate, and (in `tasks`)
//! helpers over the tasks table.
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
pub mod pgbouncer;
pub mod probe;
pub mod proxy;
pub mod tasks;

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
pub use tasks::{
    assert_all_succeeded, blocks_touched, count, enqueue, expected_counts, hold_snapshot,
    insert_payloads, payload, set_state, statistics_say_empty, wait_count, wait_status,
};

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

/// The first column of every row `sql` answers, as text: what a test compares a read with.
pub async fn texts(client: &Client, sql: &str) -> Vec<String> {
    within(WAIT, sql, client.query(sql, &[]))
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
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

/// A database that refuses new sessions and whose sessions were ended: an outage of one
/// database while its server runs. [`Refusal::allow`] ends it.
pub struct Refusal {
    admin: Client,
    name: String,
}

impl TestDb {
    /// `ALLOW_CONNECTIONS false` and every session of this database ended, from a session on
    /// the administrative database.
    pub async fn refuse_connections(&self) -> Refusal {
        let admin = connect(&self.admin).await;
        let refuse = format!(
            "ALTER DATABASE {0} ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = '{0}' AND pid <> pg_backend_pid();",
            self.name
        );
        within(WAIT, "refusing connections", admin.batch_execute(&refuse))
            .await
            .unwrap_or_else(|err| panic!("cannot refuse connections to {}: {err:?}", self.name));
        // A session whose start passed the database's check before the ALTER committed, but
        // was not yet listed when the others were terminated, would live on (and serve a
        // request the test expects refused): terminated again until three looks in a row,
        // 50 ms apart, find none.
        let remaining = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = '{0}' AND pid <> pg_backend_pid()",
            self.name
        );
        let mut quiet = 0;
        within(WAIT, "every session of the database ended", async {
            while quiet < 3 {
                let found: i64 = admin
                    .query_one(&remaining, &[])
                    .await
                    .unwrap_or_else(|err| panic!("cannot list the sessions: {err:?}"))
                    .get(0);
                quiet = if found == 0 { quiet + 1 } else { 0 };
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        Refusal {
            admin,
            name: self.name.clone(),
        }
    }
}

impl Refusal {
    /// Allow sessions again. The catalog row may be updated concurrently (a vacuum's
    /// `datfrozenxid`): an error is printed and the statement tried again until [`WAIT`].
    pub async fn allow(self) {
        let allow = format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", self.name);
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match within(
                WAIT,
                "allowing connections",
                self.admin.batch_execute(&allow),
            )
            .await
            {
                Ok(()) => return,
                Err(err) if tokio::time::Instant::now() < deadline => {
                    eprintln!("allowing connections to {} again: {err:?}", self.name);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => panic!("cannot allow connections to {}: {err:?}", self.name),
            }
        }
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
