//! What an `exec` handler's child can reach of the daemon, with real daemons and real
//! children (docs/handlers.md, "What a handler can reach"): nothing of the daemon's memory,
//! environment or descriptors when it runs as the daemon's own user (the daemon is
//! non-dumpable), no descriptor the daemon inherited, and, with `[queues.NAME] user` and
//! `group`, another user's ids, which cannot read the daemon's files; a daemon that cannot
//! switch is refused at start (exit 78).
//!
//! The tests run as root (as in CI): the daemon of the first is started as `nobody`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tokio_postgres::Client;

use crate::handlers::Scratch;
use crate::support::daemon::binary;
use crate::support::daemon::tempfile_path::TempPath;
use crate::support::{eventually, within, DaemonProcess, TestDb, WAIT};

/// `nobody`'s uid and gid (`nogroup`).
pub(crate) const NOBODY: u32 = 65534;

/// The user the tests are run as must be root: they start processes as other users.
fn require_root() {
    // SAFETY: a plain system call.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "these tests start the daemon as other users: run them as root (sudo -E cargo test --test integration -- isolation::)"
    );
    let nobody = pgtaskd::privileges::user_name(NOBODY);
    assert_eq!(
        nobody.as_deref(),
        Some("nobody"),
        "uid {NOBODY} must be the user nobody (useradd -u {NOBODY} nobody)"
    );
}

/// A daemon serving the queues of `sections` (`[queues.NAME]` and its keys, each).
fn config(queues: &[&str], sections: &str) -> String {
    let names: Vec<String> = queues.iter().map(|q| format!("{q:?}")).collect();
    format!(
        "[worker]\nqueues = [{}]\npoll_interval = \"200ms\"\n\n{sections}",
        names.join(", ")
    )
}

/// An `exec` section of `queue` running `command`, with `extra` keys.
fn section(queue: &str, command: &[&str], extra: &str) -> String {
    let words: Vec<String> = command.iter().map(|w| format!("{w:?}")).collect();
    format!(
        "[queues.{queue}]\nhandler = \"exec\"\ncommand = [{}]\n{extra}\n",
        words.join(", ")
    )
}

/// Enqueue a task on `queue`, wait for its end, and give its output (failing the test with
/// its error if it failed).
async fn run_task(client: &Client, queue: &str) -> String {
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload, max_attempts) VALUES ($1, 'x', 1) RETURNING id",
            &[&queue],
        )
        .await
        .unwrap()
        .get(0);
    let (status, output, error) = eventually(WAIT, &format!("task {id} to end"), || async move {
        let row = client
            .query_one(
                "SELECT status, output, error FROM pgtaskd.task_view WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        let status: String = row.get(0);
        matches!(status.as_str(), "SUCCEEDED" | "FAILED" | "CANCELED").then(|| {
            (
                status,
                row.get::<_, Option<String>>(1),
                row.get::<_, Option<String>>(2),
            )
        })
    })
    .await;
    assert_eq!(status, "SUCCEEDED", "task on {queue}: {error:?}");
    output.unwrap_or_default()
}

/// What a `/bin/sh` child tries on its parent, the daemon, and reports: its environment, its
/// memory, its descriptors.
const SH_PROBE: &str = r#"p=$PPID
echo "uid $(id -u) daemon $p"
if environ=$(tr '\0' ' ' < /proc/$p/environ); then echo "environ: read: $environ"; else echo "environ: denied"; fi
if (exec 3< /proc/$p/mem); then echo "mem: opened"; else echo "mem: denied"; fi
if fds=$(ls /proc/$p/fd); then echo "fd: listed:" $fds; else echo "fd: denied"; fi
"#;

/// What a python3 child tries on its parent, the daemon, and reports: its environment and
/// its memory (searched for `argv[1]`), `ptrace`, and `pidfd_getfd` of its descriptors.
const PY_PROBE: &str = r#"
import ctypes, errno, os, sys
secret = sys.argv[1].encode()
p = os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
def report(name, attempt):
    try:
        print(name + ": " + attempt())
    except OSError as e:
        print(name + ": denied (" + errno.errorcode.get(e.errno, str(e.errno)) + ")")
def environ():
    with open("/proc/%d/environ" % p, "rb") as f:
        return "read, the secret %d times" % f.read().count(secret)
def mem():
    found = 0
    with open("/proc/%d/mem" % p, "rb", buffering=0) as m:
        with open("/proc/%d/maps" % p) as maps:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split("-"))
                if not perms.startswith("rw") or end - start > 64 << 20:
                    continue
                try:
                    m.seek(start)
                    found += m.read(end - start).count(secret)
                except OSError:
                    pass
    return "read, the secret %d times" % found
def check(result):
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return result
def ptrace():
    PTRACE_SEIZE = 0x4206
    check(libc.ptrace(ctypes.c_long(PTRACE_SEIZE), ctypes.c_long(p), None, None))
    return "attached"
def getfd():
    pidfd = os.pidfd_open(p)
    taken = 0
    for fd in range(0, 64):
        got = libc.syscall(ctypes.c_long(438), ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0))
        if got >= 0:
            taken += 1
            os.close(got)
        elif ctypes.get_errno() != errno.EBADF:
            check(got)
    return "took %d descriptors" % taken
print("uid %d daemon %d" % (os.getuid(), p))
report("environ", environ)
report("mem", mem)
report("ptrace", ptrace)
report("pidfd_getfd", getfd)
"#;

/// The python3 a user other than root can run.
fn python3() -> &'static str {
    let path = "/usr/bin/python3";
    assert!(
        Path::new(path).exists(),
        "{path} runs one of the probes: install it (apt-get install python3)"
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_of_the_daemons_own_user_reads_nothing_of_the_daemon() {
    require_root();
    let db = TestDb::new().await;
    let client = db.client().await;
    let secret = format!("pw-{:016x}", fastrand::u64(..));
    let sections = section("sh_probe", &["/bin/sh", "-c", SH_PROBE], "")
        + &section("py_probe", &[python3(), "-c", PY_PROBE, &secret], "");
    let mut command =
        DaemonProcess::command(&db.url, &config(&["sh_probe", "py_probe"], &sections));
    command
        .user(NOBODY, NOBODY)
        .env("PGPASSWORD", &secret)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin");
    let mut daemon = DaemonProcess::spawn(command);
    daemon.wait_for_log("listening for notifications").await;
    let pid = daemon.pid();

    let sh = run_task(&client, "sh_probe").await;
    let py = run_task(&client, "py_probe").await;
    for (probe, output) in [("sh", &sh), ("python3", &py)] {
        assert!(
            output.starts_with(&format!("uid {NOBODY} daemon {pid}\n")),
            "the {probe} child runs as the daemon's user, under the daemon:\n{output}"
        );
        assert!(
            !output.contains(&secret),
            "the {probe} child found the daemon's password:\n{output}"
        );
    }
    for line in ["environ: denied", "mem: denied", "fd: denied"] {
        assert!(sh.contains(line), "sh: no {line:?}:\n{sh}");
    }
    for line in [
        "environ: denied (EACCES)",
        "mem: denied (EACCES)",
        "ptrace: denied (EPERM)",
        "pidfd_getfd: denied (EPERM)",
    ] {
        assert!(py.contains(line), "python3: no {line:?}:\n{py}");
    }
    daemon.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_gets_no_descriptor_the_daemon_inherited() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (pipe, _writer) = std::io::pipe().expect("a pipe");
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    // The shell's own descriptors, as it has them: its parent's (the daemon's) gave it these.
    let sections = section("fds", &["/bin/sh", "-c", "ls /proc/$$/fd"], "");
    let mut command = DaemonProcess::command(&db.url, &config(&["fds"], &sections));
    command
        .inherit(&pipe, 5)
        .unwrap()
        .inherit(&null, 7)
        .unwrap();
    let mut daemon = DaemonProcess::spawn(command);
    daemon.wait_for_log("listening for notifications").await;
    let daemon_fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        daemon_fds.iter().any(|fd| fd == "5") && daemon_fds.iter().any(|fd| fd == "7"),
        "the daemon holds what it inherited: {daemon_fds:?}"
    );

    let listed = run_task(&client, "fds").await;
    let fds: Vec<&str> = listed.split_whitespace().collect();
    // Its standard streams and its progress pipe (PGTASKD_PROGRESS_FD), nothing inherited.
    assert_eq!(fds, ["0", "1", "2", "3"], "the child's descriptors");
    daemon.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_with_a_user_or_a_group_runs_its_children_with_those_ids() {
    require_root();
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // A file only root reads, standing for the daemon's configuration and credentials.
    let secret = scratch.path("secret.toml");
    std::fs::write(&secret, "password = \"hunter2\"\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let report = format!(
        "echo \"uid $(id -u) gid $(id -g) groups $(id -G) home=$HOME user=$USER logname=$LOGNAME\"\n\
         cat {} || echo 'secret: denied'",
        secret.display()
    );
    let started = scratch.path("started");
    let slow = format!("echo $$ >> {}\nexec sleep 1000", started.display());
    let sections = section("as_user", &["/bin/sh", "-c", &report], "user = \"nobody\"")
        + &section(
            "as_group",
            &["/bin/sh", "-c", &report],
            "group = \"nogroup\"",
        )
        + &section("slow", &["/bin/sh", "-c", &slow], "user = \"nobody\"");
    let config = config(&["as_user", "as_group", "slow"], &sections);
    let mut daemon = DaemonProcess::start_with_env(
        &db.url,
        &config,
        &[],
        &[("HOME", "/root"), ("USER", "root")],
    );
    daemon.wait_for_log("listening for notifications").await;

    let as_user = run_task(&client, "as_user").await;
    assert!(
        as_user.starts_with(&format!(
            "uid {NOBODY} gid {NOBODY} groups {NOBODY} home=/nonexistent user=nobody logname=nobody\n"
        )),
        "user = \"nobody\": the child's ids and environment:\n{as_user}"
    );
    assert!(
        as_user.contains("\nsecret: denied") && !as_user.contains("hunter2"),
        "nobody reads a root-owned 0600 file:\n{as_user}"
    );
    let as_group = run_task(&client, "as_group").await;
    assert!(
        as_group.starts_with(&format!(
            "uid 0 gid {NOBODY} groups {NOBODY} home=/root user=root"
        )),
        "group = \"nogroup\": root's uid, that group alone:\n{as_group}"
    );

    // The switch clears PR_SET_PDEATHSIG: it is asked for after, so the child still dies
    // with the daemon.
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) VALUES ('slow', 'x')",
            &[],
        )
        .await
        .unwrap();
    let pids = scratch.pids("started", 1).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pids[0])).unwrap();
    assert!(
        status.contains(&format!("\nUid:\t{NOBODY}\t{NOBODY}\t{NOBODY}\t{NOBODY}\n")),
        "{status}"
    );
    daemon.signal(libc::SIGKILL);
    daemon.wait().await;
    eventually(
        Duration::from_secs(10),
        "the child to die with the daemon",
        || {
            let pid = pids[0];
            async move { (!crate::handlers::alive(pid)).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_given_the_capabilities_switches_its_children_and_passes_none_on() {
    require_root();
    let db = TestDb::new().await;
    let client = db.client().await;
    let scratch = Scratch::new();
    // As systemd's AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL starts it, as nobody.
    let setpriv = "/usr/bin/setpriv";
    assert!(
        Path::new(setpriv).exists(),
        "{setpriv} starts the daemon with capabilities: install util-linux"
    );
    let wrapper = scratch.script(
        "pgtaskd-with-capabilities",
        &format!(
            "exec {setpriv} --reuid={NOBODY} --regid={NOBODY} --clear-groups \\\n\
             --inh-caps=+setuid,+setgid,+kill --ambient-caps=+setuid,+setgid,+kill {} \"$@\"",
            binary().display()
        ),
    );
    let report =
        "echo \"uid $(id -u) gid $(id -g)\"; grep -E '^Cap(Prm|Eff|Amb)' /proc/self/status";
    let sections = section("own", &["/bin/sh", "-c", report], "")
        + &section("switched", &["/bin/sh", "-c", report], "user = \"daemon\"")
        + &section(
            "stopped",
            &["/bin/sleep", "1000"],
            "user = \"daemon\"\ntimeout = \"1s\"\nkill_after = \"30s\"",
        );
    let toml = config(&["own", "switched", "stopped"], &sections);
    let mut command = pgtaskd::process::DaemonCommand::new(&wrapper, &toml)
        .expect("write the daemon's configuration");
    command
        .env("PGTASKD_DATABASE_URL", &db.url)
        .env("RUST_LOG", "pgtaskd=debug");
    let mut daemon = DaemonProcess::spawn(command);
    daemon.wait_for_log("listening for notifications").await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    assert!(
        status.contains("\nCapEff:\t00000000000000e0\n"),
        "the daemon holds CAP_SETUID, CAP_SETGID and CAP_KILL:\n{status}"
    );

    let none = "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapAmb:\t0000000000000000\n";
    let own = run_task(&client, "own").await;
    assert_eq!(
        own,
        format!("uid {NOBODY} gid {NOBODY}\n{none}"),
        "a child of the daemon's user gets none of its capabilities"
    );
    let switched = run_task(&client, "switched").await;
    assert_eq!(
        switched,
        format!("uid 1 gid 1\n{none}"),
        "user = \"daemon\""
    );
    // A timeout's SIGTERM reaches a child of another user (CAP_KILL).
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (queue, payload, max_attempts) VALUES ('stopped', 'x', 1) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let task = crate::support::wait_status(&client, id, pgtaskd::queue::TaskStatus::Failed).await;
    let error = task.error.unwrap_or_default();
    assert!(error.contains("timed out after 1s"), "{error}");
    daemon.stop_cleanly().await;
}

/// Run `pgtaskd ARGS` as `nobody` to its end: (exit code, stderr).
pub(crate) async fn pgtaskd_as_nobody(args: &[&str]) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(binary());
    command
        .args(args)
        .env_remove("PGTASKD_CONFIG")
        .env("PGTASKD_DATABASE_URL", crate::support::nowhere())
        .uid(NOBODY)
        .gid(NOBODY);
    let output = within(WAIT, &format!("pgtaskd {args:?}"), command.output())
        .await
        .expect("pgtaskd runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_cannot_switch_users_is_refused_at_start() {
    require_root();
    let toml = config(
        &["jobs"],
        &section("jobs", &["/bin/cat"], "user = \"root\""),
    );
    let file = TempPath::write(&toml);
    let path = file.path().display().to_string();
    for args in [
        vec!["check-config", "--config", &path],
        vec!["run", "--config", &path],
    ] {
        let (code, stderr) = pgtaskd_as_nobody(&args).await;
        assert_eq!(code, Some(78), "{args:?}: {stderr}");
        assert!(
            stderr.contains(
                "line 8, column 8: queues.jobs.user = \"root\": this daemon runs as user nobody"
            ) && stderr.contains("without CAP_SETUID, CAP_SETGID and CAP_KILL"),
            "{args:?}: {stderr}"
        );
    }
    // Root can: the same file is valid.
    let (status, stdout, stderr) =
        crate::support::daemon::pgtaskd(None, &["check-config", "--config", &path]).await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("runs as user root (uid 0, gid 0)"),
        "{stdout}"
    );
}

/// What a `/bin/sh` child reports of its session and terminal, and of its parent's terminal.
const TTY_PROBE: &str = r#"set -- $(cat /proc/$$/stat)
echo "pid=$1 session=$6 tty=$7 daemon=$PPID daemon_tty=$(cut -d' ' -f7 /proc/$PPID/stat)"
if (: > /dev/tty) 2>/dev/null; then echo "devtty=open"; else echo "devtty=closed"; fi
"#;

/// A daemon started from a terminal (here a pseudo-terminal of util-linux's `script`) lends
/// it to no command: the child leads a session of its own with no controlling terminal, so it
/// cannot open `/dev/tty` and type into the shell that started the daemon (`TIOCSTI`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_has_no_terminal_when_the_daemon_was_started_from_one() {
    let script = "/usr/bin/script";
    assert!(
        Path::new(script).exists(),
        "{script} gives the daemon a terminal here: apt-get install util-linux"
    );
    let db = TestDb::new().await;
    let client = db.client().await;
    let config = TempPath::write(&config(
        &["tty"],
        &section("tty", &["/bin/sh", "-c", TTY_PROBE], ""),
    ));
    let line = format!(
        "exec {} run --config {}",
        binary().display(),
        config.path().display()
    );
    let mut terminal = tokio::process::Command::new(script)
        .args(["-qefc", &line, "/dev/null"])
        .env("PGTASKD_DATABASE_URL", &db.url)
        .env("RUST_LOG", "pgtaskd=info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("script starts");

    let report = run_task(&client, "tty").await;
    let field = |name: &str| -> String {
        report
            .split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}= in {report:?}"))
            .to_string()
    };
    // Stopped before anything is asserted: the daemon ignores the SIGHUP of its terminal's
    // end, and would outlive a failed test.
    let daemon: i32 = field("daemon").parse().unwrap();
    // SAFETY: a plain system call, to the daemon the child named as its parent.
    unsafe {
        libc::kill(daemon, libc::SIGTERM);
    }
    within(WAIT, "the daemon under script to stop", terminal.wait())
        .await
        .unwrap();
    assert_ne!(
        field("daemon_tty"),
        "0",
        "the daemon has no terminal under script, so the test cannot tell: {report}"
    );
    assert_eq!(
        field("tty"),
        "0",
        "the child has a controlling terminal: {report}"
    );
    assert_eq!(
        field("session"),
        field("pid"),
        "the child leads no session: {report}"
    );
    assert_eq!(
        field("devtty"),
        "closed",
        "the child opened /dev/tty: {report}"
    );
}
