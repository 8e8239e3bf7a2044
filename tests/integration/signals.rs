//! The signals a service receives, against a real `pgtaskd run` process with a task running
//! (docs/operations.md, "Signals"): SIGHUP, SIGUSR1, SIGUSR2 and SIGPIPE leave it running and
//! its work going on; SIGQUIT is a fast stop that skips the grace and still gives every task
//! back. Every other signal whose default would end the daemon is logged and ignored (the
//! real-time ones too) or, SIGPWR and SIGXCPU, a stop that gives the task back and exits 0; a
//! log file that reaches `RLIMIT_FSIZE` (SIGXFSZ) drops lines and stops nothing; and the exec
//! handler's child still starts with every signal at its default.

use std::cell::RefCell;
use std::path::Path;

use pgtaskd::queue::TaskStatus;

use crate::handlers::Scratch;
use crate::support::daemon::binary;
use crate::support::{count, eventually, wait_count, within, DaemonProcess, TestDb, WAIT};

/// Insert `n` texts of 66 MB, each taking the analyzer long enough that a signal sent when it
/// starts lands while it runs; returns their ids in claim order.
async fn large_tasks(client: &tokio_postgres::Client, n: i32) -> Vec<i64> {
    client
        .query(
            "INSERT INTO pgtaskd.tasks (payload)
             SELECT repeat('large text ', 6000000) FROM generate_series(1, $1) RETURNING id",
            &[&n],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// How many tasks are in `status`.
async fn in_status(client: &tokio_postgres::Client, status: &str) -> i64 {
    within(
        WAIT,
        "a status count",
        client.query_one(
            "SELECT count(*) FROM pgtaskd.task_view WHERE status::text = $1",
            &[&status],
        ),
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_sigusr1_sigusr2_and_sigpipe_leave_the_daemon_running_its_tasks() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids = large_tasks(&client, 4).await;
    let mut daemon = DaemonProcess::start(&db, "[worker]\nconcurrency = 1\n", &[]);
    let signals = [
        (
            libc::SIGHUP,
            Some("SIGHUP: the configuration is not reloaded"),
        ),
        (libc::SIGUSR1, Some("signal=\"SIGUSR1\"")),
        (libc::SIGUSR2, Some("signal=\"SIGUSR2\"")),
        // Nothing is logged: the daemon is alive if it goes on finishing tasks.
        (libc::SIGPIPE, None),
    ];
    for (id, (signal, logged)) in ids.iter().zip(signals) {
        // One signal while each task's analyzer runs.
        daemon.wait_for_log(&format!("handler run id={id} ")).await;
        daemon.signal(signal);
        if let Some(line) = logged {
            daemon.wait_for_log(line).await;
        }
    }
    eventually(WAIT, "every task to finish", || {
        let client = &client;
        async move { (in_status(client, "SUCCEEDED").await == 4).then_some(()) }
    })
    .await;
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait().await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());
    assert_eq!(in_status(&client, "RUNNING").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_skips_the_grace_gives_the_running_task_back_and_exits_0() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids = large_tasks(&client, 2).await;
    let mut daemon = DaemonProcess::start(
        &db,
        "[worker]\nconcurrency = 1\n[shutdown]\ngrace = \"1h\"\n",
        &[],
    );
    daemon
        .wait_for_log(&format!("handler run id={} ", ids[0]))
        .await;
    daemon.signal(libc::SIGQUIT);
    let status = daemon.wait().await;
    let log = daemon.log_text();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        log.contains("stopping the handlers running=1"),
        "the analyzer was running and was stopped:\n{log}"
    );
    let rows = client
        .query(
            "SELECT status, attempt, lease_owner FROM pgtaskd.task_view ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    for row in rows {
        let status: TaskStatus = row.get::<_, &str>(0).parse().unwrap();
        assert_eq!(
            (status, row.get::<_, i32>(1), row.get::<_, Option<&str>>(2)),
            (TaskStatus::Queued, 0, None),
            "{log}"
        );
    }
}

/// The signals that are logged and ignored besides SIGHUP, SIGUSR1 and SIGUSR2, with the names
/// the daemon logs: the standard ones, then SIGRTMIN..=SIGRTMAX as `kill -l` names them.
fn ignored_signals() -> Vec<(i32, String)> {
    let mut signals: Vec<(i32, String)> = [
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGXFSZ, "SIGXFSZ"),
        (libc::SIGVTALRM, "SIGVTALRM"),
        (libc::SIGPROF, "SIGPROF"),
        (libc::SIGIO, "SIGIO"),
        (libc::SIGSTKFLT, "SIGSTKFLT"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGSYS, "SIGSYS"),
    ]
    .into_iter()
    .map(|(signal, name)| (signal, name.to_string()))
    .collect();
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    for signal in min..=max {
        let name = match (signal - min, max - signal) {
            (0, _) => "SIGRTMIN".to_string(),
            (_, 0) => "SIGRTMAX".to_string(),
            (above, below) if above <= below => format!("SIGRTMIN+{above}"),
            (_, below) => format!("SIGRTMAX-{below}"),
        };
        signals.push((signal, name));
    }
    signals
}

/// A daemon serving queue `jobs` alone with an `exec` handler that writes its pid to
/// `started` and waits until the fifo `gate` is opened and closed ([`open_gate`]); `extra` is
/// appended to the configuration.
fn gated_daemon(db: &TestDb, scratch: &Scratch, extra: &str) -> DaemonProcess {
    let gate = scratch.path("gate");
    if !gate.exists() {
        let path = std::ffi::CString::new(gate.to_str().unwrap()).unwrap();
        // SAFETY: a plain system call on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o666) }, 0, "mkfifo");
    }
    let handler = scratch.script(
        "gated.sh",
        &format!(
            "echo $$ >> {}\ncat {} > /dev/null\necho finished",
            scratch.path("started").display(),
            gate.display()
        ),
    );
    let config = format!(
        "[worker]\nqueues = [\"jobs\"]\n\n[queues.jobs]\nhandler = \"exec\"\ncommand = [\"{}\"]\n{extra}",
        handler.display()
    );
    DaemonProcess::start(db, &config, &[])
}

/// Let the handler of [`gated_daemon`] that waits at `gate` go on: open the fifo for writing
/// (which waits for its reader) and close it.
async fn open_gate(gate: &Path) {
    let gate = gate.to_path_buf();
    within(
        WAIT,
        "the gate to open",
        tokio::task::spawn_blocking(move || std::fs::write(gate, "")),
    )
    .await
    .unwrap()
    .expect("open the gate");
}

async fn enqueue_job(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('jobs', 'x') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_signal_that_would_end_the_daemon_is_logged_and_ignored_while_a_task_runs() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let mut daemon = gated_daemon(&db, &scratch, "");
    let id = enqueue_job(&client).await;
    scratch.pids("started", 1).await;
    for (signal, name) in ignored_signals() {
        daemon.signal(signal);
        // Logged once the daemon has handled it: it lived through it.
        daemon.wait_for_log(&format!("signal=\"{name}\"")).await;
    }
    assert_eq!(
        count(
            &client,
            &format!(
                "SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'RUNNING'"
            )
        )
        .await,
        1,
        "{}",
        daemon.log_text()
    );
    open_gate(&scratch.path("gate")).await;
    wait_count(
        &client,
        &format!(
            "SELECT count(*) FROM pgtaskd.task_view
             WHERE id = {id} AND status = 'SUCCEEDED' AND output = 'finished\n'"
        ),
        1,
        "the task to finish",
    )
    .await;
    daemon.stop_cleanly().await;
    assert_eq!(in_status(&client, "RUNNING").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigpwr_and_sigxcpu_stop_the_daemon_cleanly_giving_the_running_task_back() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let id = enqueue_job(&client).await;
    for (n, (signal, name)) in [(libc::SIGPWR, "SIGPWR"), (libc::SIGXCPU, "SIGXCPU")]
        .into_iter()
        .enumerate()
    {
        let mut daemon = gated_daemon(&db, &scratch, "[shutdown]\ngrace = \"0s\"\n");
        scratch.pids("started", n + 1).await;
        daemon.signal(signal);
        let status = daemon.wait().await;
        let log = daemon.log_text();
        assert_eq!(status.code(), Some(0), "{name}:\n{log}");
        assert!(
            log.contains(&format!("signal=\"{name}\"")) && log.contains("shutdown requested"),
            "{name}:\n{log}"
        );
        let row = client
            .query_one(
                "SELECT status::text, attempt, lease_owner FROM pgtaskd.task_view WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(
            (
                row.get::<_, &str>(0),
                row.get::<_, i32>(1),
                row.get::<_, Option<&str>>(2)
            ),
            ("QUEUED", 0, None),
            "{name}: the claim is given back:\n{log}"
        );
    }
}

/// The log file's size limit, in bytes: the lines of the daemon's start fill it.
const LOG_LIMIT: u64 = 2048;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_file_at_its_size_limit_drops_lines_and_the_daemon_goes_on_finishing_tasks() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    let log_path = scratch.path("pgtaskd.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = tokio::process::Command::new(binary());
    command
        .args(["run"])
        .env_remove("PGTASKD_CONFIG")
        .env("PGTASKD_DATABASE_URL", &db.url)
        .env("RUST_LOG", "pgtaskd=debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
    // SAFETY: setrlimit is async-signal-safe; the closure runs in the child before `exec`.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: LOG_LIMIT,
                rlim_max: LOG_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let daemon = RefCell::new(command.spawn().expect("pgtaskd starts"));
    let insert =
        "INSERT INTO pgtaskd.tasks (payload) SELECT 'task ' || n FROM generate_series(1, 50) n";
    // The first tasks fill the file (if the start has not); the next ones come after it is
    // full, each raising SIGXFSZ at its log lines.
    for finished in [50, 100] {
        client.execute(insert, &[]).await.unwrap();
        let (daemon, client) = (&daemon, &client);
        eventually(
            WAIT,
            &format!("{finished} tasks to succeed"),
            || async move {
                if let Some(status) = daemon.borrow_mut().try_wait().unwrap() {
                    panic!("the daemon ended: {status}");
                }
                let succeeded = count(
                    client,
                    "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
                )
                .await;
                (succeeded == finished).then_some(())
            },
        )
        .await;
        assert_eq!(
            std::fs::metadata(&log_path).unwrap().len(),
            LOG_LIMIT,
            "the log file is full"
        );
    }
    let mut daemon = daemon.into_inner();
    // SAFETY: a plain system call on our own unreaped child.
    unsafe {
        libc::kill(daemon.id().unwrap() as i32, libc::SIGTERM);
    }
    let status = within(WAIT, "the daemon to exit", daemon.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(in_status(&client, "RUNNING").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exec_handlers_child_gets_every_signal_the_daemon_handles_at_its_default() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let config = "[worker]\nqueues = [\"jobs\"]\n\n[queues.jobs]\nhandler = \"exec\"\n\
                  command = [\"cat\", \"/proc/self/status\"]\n";
    let mut daemon = DaemonProcess::start(&db, config, &[]);
    let id = enqueue_job(&client).await;
    wait_count(
        &client,
        &format!("SELECT count(*) FROM pgtaskd.task_view WHERE id = {id} AND status = 'SUCCEEDED'"),
        1,
        "the task to finish",
    )
    .await;
    let ours = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let child: String = client
        .query_one("SELECT output FROM pgtaskd.task_view WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    let handled = ignored_signals()
        .into_iter()
        .map(|(signal, _)| signal)
        .chain([libc::SIGPWR, libc::SIGXCPU, libc::SIGHUP, libc::SIGTERM])
        .fold(0u64, |set, signal| set | 1 << (signal - 1));
    assert_eq!(signal_set(&ours, "SigCgt:") & handled, handled, "{ours}");
    assert_eq!(signal_set(&child, "SigCgt:"), 0, "{child}");
    assert_eq!(signal_set(&child, "SigIgn:") & handled, 0, "{child}");
    daemon.stop_cleanly().await;
}

/// The bits of a `SigXxx:` line of /proc/PID/status.
fn signal_set(status: &str, line: &str) -> u64 {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(line))
        .unwrap_or_else(|| panic!("no {line} in:\n{status}"));
    u64::from_str_radix(hex.trim(), 16).expect("a hexadecimal signal set")
}
