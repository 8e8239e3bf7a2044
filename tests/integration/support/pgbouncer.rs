//! A real PgBouncer in transaction pooling mode in front of the shared test server: its ini
//! and userlist written into a directory of its own, on a free loopback port, run as the
//! server's user when this process is root (PgBouncer refuses to run as root), killed and its
//! directory removed when dropped. Without the `pgbouncer` binary the test fails and says how
//! to get it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::{free_port, server_user};
use super::{server, within, WAIT};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One `pgbouncer` process of a test's own.
pub struct PgBouncer {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

fn how_to_get_it() -> String {
    "the PgBouncer tests need the pgbouncer binary (1.18 or later): install it \
     (Debian: apt-get install pgbouncer), or put it on PATH"
        .to_string()
}

/// The `pgbouncer` binary: on `PATH`, else where Debian installs it.
fn binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{}", how_to_get_it()))
}

impl PgBouncer {
    /// Start PgBouncer in transaction mode in front of the shared server, passing every
    /// database through under its own name. `extra` lines go into its `[pgbouncer]` section
    /// (e.g. `ignore_startup_parameters = options`).
    pub fn start(extra: &[&str]) -> PgBouncer {
        let admin = server().admin_config();
        let target = super::server_addr();
        let user = super::server_user();
        let password = admin
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "pgtaskd-test-pgbouncer-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).expect("create the pgbouncer directory");
        let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        write(
            &dir.join("userlist.txt"),
            &format!("{} {}\n", quote(&user), quote(&password)),
        );
        let ini = format!(
            "[databases]\n\
             * = host={host} port={pg_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {userlist}\n\
             pool_mode = transaction\n\
             default_pool_size = 20\n\
             max_client_conn = 500\n\
             logfile = {log}\n\
             {extra}\n",
            host = target.ip(),
            pg_port = target.port(),
            userlist = dir.join("userlist.txt").display(),
            log = dir.join("pgbouncer.log").display(),
            extra = extra.join("\n"),
        );
        write(&dir.join("pgbouncer.ini"), &ini);
        let run_as = server_user();
        if let Some((uid, gid)) = run_as {
            for path in [
                dir.clone(),
                dir.join("userlist.txt"),
                dir.join("pgbouncer.ini"),
            ] {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown for pgbouncer");
            }
        }
        let mut command = Command::new(binary());
        command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = run_as {
            command.uid(uid).gid(gid);
        }
        // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start pgbouncer: {err}; {}", how_to_get_it()));
        let mut bouncer = PgBouncer { port, dir, child };
        bouncer.wait_ready();
        bouncer
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("pgbouncer exited ({status}) at start: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen within {START_TIMEOUT:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A connection string to database `dbname` through this PgBouncer.
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname={dbname} sslmode=disable",
            self.port,
            super::server_user()
        )
    }

    /// What PgBouncer logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// Connect a plain client through PgBouncer, without startup options.
    pub async fn client(&self, dbname: &str) -> tokio_postgres::Client {
        let url = self.url(dbname);
        let (client, connection) = within(WAIT, "a connection through pgbouncer", async {
            tokio_postgres::connect(&url, tokio_postgres::NoTls).await
        })
        .await
        .unwrap_or_else(|err| panic!("cannot connect through pgbouncer: {err}: {}", self.log()));
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text)
        .unwrap_or_else(|err| panic!("cannot write {}: {err}", path.display()));
}
