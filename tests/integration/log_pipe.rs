//! The daemon's log pipe (docs/operations.md, "Signals"): a reader
//! that went away (`pgtaskd run 2>&1 | head -2`) or stopped reading keeps neither the work
//! nor SIGTERM from going on: the daemon still exits 0, leaving nothing RUNNING.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::shutdown::status_counts;
use crate::support::daemon::{binary, tempfile_path::TempPath};
use crate::support::{eventually, insert_payloads, within, TestDb, WAIT};

async fn succeeded(client: &tokio_postgres::Client) -> i64 {
    within(WAIT, "the status counts", status_counts(client))
        .await
        .iter()
        .find(|(status, _)| status == "SUCCEEDED")
        .map_or(0, |(_, n)| *n)
}

/// `pgtaskd run` on `db`, logging every task at debug level into a pipe the test holds.
fn start_with_piped_log(db: &TestDb) -> (KillOnDrop, std::process::ChildStderr) {
    let config = TempPath::write("[worker]\nconcurrency = 4\n");
    let child = Command::new(binary())
        .arg("run")
        .arg("--config")
        .arg(config.path())
        .env_remove("PGTASKD_CONFIG")
        .env("PGTASKD_DATABASE_URL", &db.url)
        .env("RUST_LOG", "pgtaskd=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pgtaskd starts");
    let mut child = KillOnDrop(child, config);
    let stderr = child.0.stderr.take().expect("piped stderr");
    (child, stderr)
}

/// Work goes on: tasks keep finishing, each logging a line nobody reads.
async fn wait_progress(client: &tokio_postgres::Client, tasks: i64) {
    let before = succeeded(client).await;
    eventually(WAIT, "tasks finished with the log unread", || async move {
        (succeeded(client).await >= before + tasks).then_some(())
    })
    .await;
}

/// SIGTERM, then exit 0 within 20 s, leaving nothing RUNNING.
async fn sigterm_exits_0(child: &mut KillOnDrop, client: &tokio_postgres::Client) {
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.0.id() as i32, libc::SIGTERM);
    }
    let status = eventually(
        Duration::from_secs(20),
        "pgtaskd to exit on SIGTERM",
        || std::future::ready(child.0.try_wait().expect("wait for pgtaskd")),
    )
    .await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    let counts = within(WAIT, "the status counts", status_counts(client)).await;
    assert!(
        counts.iter().all(|(status, _)| status != "RUNNING"),
        "{counts:?}"
    );
}

/// As `pgtaskd run 2>&1 | head -2` does: the log's reader goes away, every later log line
/// fails to be written, and none of that may stop the work or keep a signal from stopping the
/// daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_daemon_with_exit_0_after_its_log_pipe_was_closed() {
    let db = TestDb::new().await;
    let client = db.client().await;
    insert_payloads(&client, 20_000).await;
    let (mut child, stderr) = start_with_piped_log(&db);
    let read = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stderr);
        let mut lines = String::new();
        for _ in 0..2 {
            reader.read_line(&mut lines).expect("read the log");
        }
        lines
        // The reader drops here: the pipe has no reader any more.
    });
    let lines = within(WAIT, "two log lines", read).await.unwrap();
    assert_eq!(lines.lines().count(), 2, "{lines}");
    wait_progress(&client, 10).await;
    sigterm_exits_0(&mut child, &client).await;
}

/// A reader that stops reading (a stuck log shipper) fills the pipe, and a write to a full
/// pipe waits: that wait may not stall the daemon either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_daemon_with_exit_0_while_its_log_pipe_is_full() {
    let db = TestDb::new().await;
    let client = db.client().await;
    insert_payloads(&client, 20_000).await;
    // Held open and never read: 64 KiB of pipe fill within a few hundred tasks.
    let (mut child, _stderr) = start_with_piped_log(&db);
    wait_progress(&client, 3_000).await;
    sigterm_exits_0(&mut child, &client).await;
}

/// A child process killed when the test ends, however it ends, with its configuration file.
struct KillOnDrop(std::process::Child, #[allow(dead_code)] TempPath);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
