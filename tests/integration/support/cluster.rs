//! A throwaway PostgreSQL cluster: `initdb` into a fresh directory, then `postgres` as a
//! child of this process on a free loopback port, stoppable and restartable by fault tests.
//!
//! For failover tests, [`Cluster::start_primary`] starts one ready to stream its WAL and
//! [`Cluster::start_standby_of`] a hot standby made from it with `pg_basebackup -R`; the
//! test crashes the primary with [`Cluster::stop_server`] and promotes the standby with
//! [`Cluster::promote`].
//!
//! The server runs as the `postgres` user when this process is root. It gets SIGINT (a fast
//! shutdown) when the thread that started it dies, which for the shared cluster is only at
//! process exit; directories left by earlier runs whose process is gone are removed at start.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const DIR_PREFIX: &str = "pgtaskd-test-";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One PostgreSQL server of the tests' own.
pub struct Cluster {
    pub dir: PathBuf,
    pub port: u16,
    settings: Vec<(String, String)>,
    bindir: PathBuf,
    user: Option<(u32, u32)>,
    child: Mutex<Option<Child>>,
}

fn how_to_get_one() -> String {
    "the integration tests need PostgreSQL: install its server binaries \
     (Debian: apt-get install postgresql), or set PGTASKD_TEST_DATABASE_URL to a server \
     where the user may CREATE DATABASE"
        .to_string()
}

impl Cluster {
    /// The cluster shared by every test of this process.
    pub fn start_shared() -> Cluster {
        remove_stale_dirs();
        Cluster::start()
    }

    /// A cluster of its own, for a test that stops or restarts the server.
    pub fn start() -> Cluster {
        Cluster::start_with(&[], &[])
    }

    /// A cluster of its own with extra server settings, and files written into its data
    /// directory first (owned by the server's user, mode 0600): e.g. a certificate and key.
    pub fn start_with(settings: &[(&str, &str)], files: &[(&str, &str)]) -> Cluster {
        let cluster = Cluster::init(settings, files);
        cluster.start_server();
        cluster
    }

    /// A primary that streams its WAL to standbys: `wal_level=replica`, WAL senders, and a
    /// `pg_hba.conf` line that lets replication connections in from the loopback address.
    pub fn start_primary() -> Cluster {
        let cluster = Cluster::init(
            &[
                ("wal_level", "replica"),
                ("max_wal_senders", "4"),
                ("wal_keep_size", "256MB"),
            ],
            &[],
        );
        let hba = cluster.dir.join("data").join("pg_hba.conf");
        let mut lines = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
        lines.push_str("\nhost replication all 127.0.0.1/32 trust\n");
        std::fs::write(&hba, lines).expect("write pg_hba.conf");
        cluster.start_server();
        cluster
    }

    /// A hot standby of `primary`, streaming from it: `pg_basebackup -R` (which writes
    /// `primary_conninfo` and `standby.signal`) into a directory of its own, then started on
    /// a port of its own.
    pub fn start_standby_of(primary: &Cluster) -> Cluster {
        let (dir, bindir, user) = new_dir();
        let mut basebackup = Command::new(bindir.join("pg_basebackup"));
        basebackup
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-D", &dir.join("data").to_string_lossy()])
            .args(["-R", "-X", "stream", "--checkpoint=fast", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = user {
            basebackup.uid(uid).gid(gid);
        }
        let output = basebackup.output().expect("run pg_basebackup");
        let cluster = Cluster {
            settings: vec![("hot_standby".to_string(), "on".to_string())],
            port: free_port(),
            dir,
            bindir,
            user,
            child: Mutex::new(None),
        };
        assert!(
            output.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.start_server();
        cluster
    }

    /// End this standby's recovery, waiting until it is a primary (`pg_ctl promote -w`).
    pub fn promote(&self) {
        let mut promote = Command::new(self.bindir.join("pg_ctl"));
        promote
            .args(["promote", "-w", "-t", "60", "-D"])
            .arg(self.dir.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = self.user {
            promote.uid(uid).gid(gid);
        }
        let output = promote.output().expect("run pg_ctl promote");
        assert!(
            output.status.success(),
            "pg_ctl promote failed: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.server_log()
        );
    }

    /// `initdb` into a fresh directory; the server is not started.
    fn init(settings: &[(&str, &str)], files: &[(&str, &str)]) -> Cluster {
        let (dir, bindir, user) = new_dir();
        let mut initdb = Command::new(bindir.join("initdb"));
        initdb
            .args(["-D", &dir.join("data").to_string_lossy()])
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let output = initdb
            .output()
            .unwrap_or_else(|err| panic!("cannot run initdb: {err}; {}", how_to_get_one()));
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        for (name, contents) in files {
            use std::os::unix::fs::PermissionsExt;
            let path = dir.join("data").join(name);
            std::fs::write(&path, contents).expect("write a cluster file");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            if let Some((uid, gid)) = user {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            }
        }
        let cluster = Cluster {
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            port: free_port(),
            dir,
            bindir,
            user,
            child: Mutex::new(None),
        };
        cluster
    }

    /// A connection config for database `dbname` on this cluster.
    pub fn config(&self, dbname: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(dbname);
        config
    }

    /// A program of the server binaries this cluster runs (`pg_dump`, `psql`): a client of
    /// the server's own version.
    pub fn program(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }

    /// Start the server process (again), and wait until it accepts connections.
    pub fn start_server(&self) {
        let mut slot = self.child.lock().unwrap();
        assert!(slot.is_none(), "the test cluster is already running");
        let log = std::fs::File::create(self.dir.join("server.log")).expect("server log");
        if let Some((uid, gid)) = self.user {
            let _ = std::os::unix::fs::chown(self.dir.join("server.log"), Some(uid), Some(gid));
        }
        let mut command = Command::new(self.bindir.join("postgres"));
        command
            .args(["-D", &self.dir.join("data").to_string_lossy()])
            .args(["-p", &self.port.to_string()])
            .args(["-k", &self.dir.to_string_lossy()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=300"])
            .args(
                self.settings
                    .iter()
                    .flat_map(|(k, v)| ["-c".to_string(), format!("{k}={v}")]),
            )
            .stdout(Stdio::null())
            .stderr(log);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
                Ok(())
            });
        }
        // The server dies with the thread that started it: start it from one that never ends.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(command.spawn());
            loop {
                std::thread::park();
            }
        });
        let child = rx
            .recv()
            .expect("the starter thread answers")
            .unwrap_or_else(|err| panic!("cannot start postgres: {err}; {}", how_to_get_one()));
        *slot = Some(child);
        drop(slot);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ready = Command::new(self.bindir.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready {
                return;
            }
            if let Some(status) = self
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("postgres exited ({status}) at start: {}", self.server_log());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within {START_TIMEOUT:?}: {}",
                self.server_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stop the server: `fast` disconnects sessions and shuts down cleanly; otherwise an
    /// immediate stop, as a crash would.
    pub fn stop_server(&self, fast: bool) {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return;
        };
        let signal = if fast { libc::SIGINT } else { libc::SIGQUIT };
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let _ = child.wait();
    }

    /// What the server logged.
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_server(true);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh cluster directory, owned by the server's user; with the server binaries' directory
/// and that user.
fn new_dir() -> (PathBuf, PathBuf, Option<(u32, u32)>) {
    let bindir = find_bindir().unwrap_or_else(|| panic!("{}", how_to_get_one()));
    let user = server_user();
    let dir = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).expect("create the cluster directory");
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the cluster directory");
    }
    (dir, bindir, user)
}

fn find_bindir() -> Option<PathBuf> {
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if dir.join("initdb").exists() {
            return Some(dir);
        }
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    candidates.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    candidates.pop()
}

/// The uid and gid to run the server as: `postgres` (or `nobody`) when this process is root.
pub fn server_user() -> Option<(u32, u32)> {
    // SAFETY: plain libc calls; getpwnam's static buffer is read at once.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        for name in [c"postgres", c"nobody"] {
            let entry = libc::getpwnam(name.as_ptr());
            if !entry.is_null() {
                return Some(((*entry).pw_uid, (*entry).pw_gid));
            }
        }
    }
    panic!("running as root, but there is no postgres or nobody user to run the test server as")
}

/// A loopback port nobody listens on now (for a server or daemon the test starts).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Remove cluster directories whose process is gone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix(DIR_PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}
