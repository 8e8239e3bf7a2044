//! The `exec` handler with real child processes (`/bin/sh -c` scripts, `wc`, `yes`, the
//! documented example handlers), called through `pgtaskd::handler::exec::run` directly: no
//! database. What a run answers for each way a child can end, and what it costs: streamed
//! stdin, bounded stdout and stderr, the child's environment.
//!
//! `starting` holds the tests of how the child is started (no `fork`, its signals, a dropped
//! run's child reaped); `stopping` those of timeouts, cancels, leftovers in the group and
//! descriptors; `examples` runs the handlers of docs/examples.

mod examples;
mod starting;
mod stopping;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pgtaskd::handler::exec::{is_removed, run, ExecSpec, STDERR_TAIL};
use pgtaskd::handler::{Failure, FailureKind, Job, Ran, Retry};
use tokio_util::sync::CancellationToken;

use crate::support::{eventually, within, WAIT};

const MIB: usize = 1024 * 1024;
const LATER: Retry = Retry::Later { after: None };

/// The task every run is for.
fn job() -> Job {
    Job {
        id: 42,
        attempt: 2,
        queue: "thumbnails".into(),
        token: 9001,
        run: 4,
        key: "0123456789abcdef-42-1765000000000000".into(),
        idempotency_key: Some("order-17".into()),
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        parents: None,
        parent_count: 0,
        progress: None,
        batch: None,
        batch_counts: None,
    }
}

/// `command` with a minute's timeout, 5 s of grace after SIGTERM and 1 MiB of output.
fn spec(command: Vec<String>) -> ExecSpec {
    ExecSpec {
        command,
        timeout: Duration::from_secs(60),
        kill_after: Duration::from_secs(5),
        max_output: MIB,
        run_as: None,
    }
}

/// `/bin/sh -c SCRIPT sh ARGS...`: the script sees ARGS as `$1`...
fn sh(script: &str, args: &[&Path]) -> Vec<String> {
    let mut argv = vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into()];
    argv.extend(
        args.iter()
            .map(|a| a.to_str().expect("UTF-8 path").to_owned()),
    );
    argv
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// Run `spec` on `payload` for [`job`], never canceled.
async fn exec(spec: &ExecSpec, payload: &[u8]) -> Ran {
    within(
        WAIT,
        "the exec run",
        run(spec, &job(), payload, &CancellationToken::new()),
    )
    .await
}

fn failed(ran: Ran) -> Failure {
    match ran {
        Ran::Failed(failure) => failure,
        other => panic!("expected a failed attempt, got {other:?}"),
    }
}

fn succeeded(ran: Ran) -> String {
    match ran {
        Ran::Succeeded { output } => output,
        other => panic!("expected a success, got {other:?}"),
    }
}

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pgtaskd-exec-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A FIFO at `name`: a gate that a child writes to once it has reached a point.
    fn fifo(&self, name: &str) -> PathBuf {
        let path = self.path(name);
        let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL in the path");
        // SAFETY: a valid NUL-terminated path.
        let made = unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) };
        assert_eq!(
            made,
            0,
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This test binary running only `test`, with `var` set to `value`.
fn own_process(test: &str, var: &str, value: &std::ffi::OsStr) -> tokio::process::Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = tokio::process::Command::new(exe);
    command
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(var, value)
        .kill_on_drop(true);
    command
}

/// Run `test` in a test process of its own with `var` set, where it measures (`what`), and
/// fail with its output unless it passed.
async fn run_probe(test: &str, var: &str, what: &str) {
    let probe = own_process(test, var, "1".as_ref()).output();
    let probe = within(WAIT, what, probe).await.expect("start the probe");
    let stdout = String::from_utf8_lossy(&probe.stdout);
    assert!(
        probe.status.success() && stdout.contains("1 passed"),
        "{what} failed ({}):\n{stdout}\n{}",
        probe.status,
        String::from_utf8_lossy(&probe.stderr)
    );
}

/// Whether process `pid` has ended: no such process, or a zombie waiting for its reaper
/// (an orphan's reaper is not this test's; a zombie runs nothing and holds nothing).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => matches!(
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next()),
            Some(Some('Z' | 'X'))
        ),
    }
}

/// Wait until every process of `pids` has ended.
async fn wait_gone(pids: &[i32]) {
    for &pid in pids {
        eventually(WAIT, &format!("process {pid} to end"), || async move {
            gone(pid).then_some(())
        })
        .await;
    }
}

/// The process ids a child wrote to `file` (space separated).
fn pids_in(file: &str) -> Vec<i32> {
    file.split_whitespace()
        .map(|pid| pid.parse().unwrap_or_else(|_| panic!("not a pid: {pid:?}")))
        .collect()
}

#[tokio::test]
async fn exit_0_answers_stdout() {
    let ran = exec(&spec(sh(r#"printf 'hello %s' "$(cat)""#, &[])), b"world").await;
    assert_eq!(succeeded(ran), "hello world");
}

#[tokio::test]
async fn exit_65_fails_for_good() {
    let ran = exec(
        &spec(sh("echo 'line 7: not a date' >&2; exit 65", &[])),
        b"x",
    )
    .await;
    let failure = failed(ran);
    assert_eq!(
        (failure.kind, failure.retry),
        (FailureKind::Exit, Retry::Never)
    );
    assert_eq!(
        failure.message,
        "`/bin/sh` exited with status 65; stderr: line 7: not a date"
    );
}

#[tokio::test]
async fn other_exits_are_retried_with_status_and_stderr() {
    let script = "echo starting >&2; echo 'disk full' >&2; exit 3";
    let failure = failed(exec(&spec(sh(script, &[])), b"").await);
    assert_eq!((failure.kind, failure.retry), (FailureKind::Exit, LATER));
    assert_eq!(
        failure.message,
        "`/bin/sh` exited with status 3; stderr: starting\ndisk full"
    );
}

#[tokio::test]
async fn a_signal_the_daemon_did_not_send_is_retried() {
    let failure = failed(exec(&spec(sh("kill -USR1 $$", &[])), b"").await);
    assert_eq!((failure.kind, failure.retry), (FailureKind::Signal, LATER));
    assert_eq!(
        failure.message,
        "`/bin/sh` was killed by signal 10 (SIGUSR1)"
    );
}

#[tokio::test]
async fn a_20_mb_payload_streams_through_stdin() {
    let payload = vec![b'p'; 20 * MIB];
    let output = succeeded(exec(&spec(argv(&["wc", "-c"])), &payload).await);
    assert_eq!(output.trim(), (20 * MIB).to_string());
}

#[tokio::test]
async fn a_child_that_writes_before_it_reads_does_not_deadlock() {
    // 1 MiB of stdout (16 pipe buffers) before reading 20 MiB of stdin: both only move if
    // the daemon reads while it writes.
    let script = r"head -c 1048576 /dev/zero | tr '\0' a; wc -c";
    let payload = vec![b'p'; 20 * MIB];
    let mut spec = spec(sh(script, &[]));
    spec.max_output = 2 * MIB;
    let output = succeeded(exec(&spec, &payload).await);
    let (written, counted) = output.split_at(MIB);
    assert!(written.bytes().all(|b| b == b'a'));
    assert_eq!(counted.trim(), (20 * MIB).to_string());
}

#[tokio::test]
async fn a_child_that_never_reads_stdin_succeeds() {
    let payload = vec![b'p'; 20 * MIB];
    let output = succeeded(exec(&spec(sh("echo ok", &[])), &payload).await);
    assert_eq!(output, "ok\n");
}

#[tokio::test]
async fn a_stdout_flood_fails_at_max_output_and_is_killed() {
    let dir = TempDir::new();
    let pid_file = dir.path("pid");
    let mut spec = spec(sh(r#"echo $$ > "$1"; exec yes"#, &[&pid_file]));
    spec.max_output = 100_000;
    let failure = failed(exec(&spec, b"").await);
    assert_eq!((failure.kind, failure.retry), (FailureKind::Output, LATER));
    assert_eq!(
        failure.message,
        "`/bin/sh` wrote more than max_output (100000 bytes) to stdout and was killed"
    );
    let pids = pids_in(&std::fs::read_to_string(&pid_file).expect("the child wrote its pid"));
    wait_gone(&pids).await;
}

#[tokio::test]
async fn a_stderr_flood_keeps_only_the_last_bytes() {
    let script = r"head -c 10000000 /dev/zero | tr '\0' x >&2; echo THE-END >&2; exit 3";
    let failure = failed(exec(&spec(sh(script, &[])), b"").await);
    let head = format!("`/bin/sh` exited with status 3; stderr (last {STDERR_TAIL} bytes): ");
    let tail = failure
        .message
        .strip_prefix(&head)
        .unwrap_or_else(|| panic!("unexpected message: {:.200}", failure.message));
    assert!(
        tail.len() < STDERR_TAIL,
        "{} bytes of stderr kept",
        tail.len()
    );
    assert!(
        tail.ends_with("xxxTHE-END"),
        "ends {:?}",
        &tail[tail.len().saturating_sub(100)..]
    );
}

#[tokio::test]
async fn stdout_that_is_not_utf8_fails() {
    let failure = failed(exec(&spec(sh(r"printf 'ok\377\n'", &[])), b"").await);
    assert_eq!((failure.kind, failure.retry), (FailureKind::Output, LATER));
    assert_eq!(
        failure.message,
        "`/bin/sh` exited with status 0 but its stdout is not valid UTF-8 (byte 2 is not)"
    );
}

#[tokio::test]
async fn a_missing_command_is_unreachable() {
    let failure = failed(exec(&spec(argv(&["/nonexistent/pgtaskd-handler"])), b"x").await);
    assert_eq!(
        (failure.kind, failure.retry),
        (FailureKind::Unreachable, LATER)
    );
    assert!(
        failure
            .message
            .starts_with("cannot start `/nonexistent/pgtaskd-handler`: ")
            && failure.message.contains("No such file or directory"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn a_command_that_is_not_executable_is_unreachable() {
    let dir = TempDir::new();
    let script = dir.path("handler.sh");
    std::fs::write(&script, "#!/bin/sh\necho never\n").expect("write the script");
    let program = script.to_str().unwrap().to_owned();
    let failure = failed(exec(&spec(vec![program.clone()]), b"x").await);
    assert_eq!(
        (failure.kind, failure.retry),
        (FailureKind::Unreachable, LATER)
    );
    assert!(
        failure
            .message
            .starts_with(&format!("cannot start `{program}`: "))
            && failure.message.contains("Permission denied"),
        "{}",
        failure.message
    );
}

/// As `execvp` does: `/bin/sh FILE ARGS...`, so `$0` is the file and `$1`... its arguments.
#[tokio::test]
async fn a_script_without_an_interpreter_line_runs_with_sh() {
    let dir = TempDir::new();
    let script = dir.path("handler");
    std::fs::write(&script, "printf '%s\\n' \"$0\" \"$@\"\ncat\n").expect("write the script");
    let mut mode = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
    std::fs::set_permissions(&script, mode).expect("make it executable");
    let program = script.to_str().unwrap().to_owned();
    let command = vec![program.clone(), "a b".into(), "c".into()];
    let output = succeeded(exec(&spec(command), b"the payload").await);
    assert_eq!(output, format!("{program}\na b\nc\nthe payload"));
}

#[tokio::test]
async fn the_child_is_told_its_task_and_not_the_daemons_secrets() {
    let output = succeeded(exec(&spec(argv(&["env"])), b"").await);
    let vars: Vec<(&str, &str)> = output
        .lines()
        .filter_map(|line| line.split_once('='))
        .collect();
    let get = |name: &str| -> Vec<&str> {
        vars.iter()
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .collect()
    };
    assert_eq!(get("PGTASKD_TASK_ID"), ["42"]);
    assert_eq!(get("PGTASKD_ATTEMPT"), ["2"]);
    assert_eq!(get("PGTASKD_QUEUE"), ["thumbnails"]);
    assert_eq!(get("PGTASKD_CLAIM"), ["9001"]);
    assert_eq!(get("PGTASKD_RUN"), ["4"]);
    assert_eq!(
        get("PGTASKD_TASK_KEY"),
        ["0123456789abcdef-42-1765000000000000"]
    );
    assert_eq!(get("PGTASKD_IDEMPOTENCY_KEY"), ["order-17"]);
    assert_eq!(get("TRACEPARENT"), [job().traceparent.unwrap().as_str()]);
    let ours = [
        "PGTASKD_TASK_ID",
        "PGTASKD_TASK_KEY",
        "PGTASKD_ATTEMPT",
        "PGTASKD_RUN",
        "PGTASKD_QUEUE",
        "PGTASKD_CLAIM",
        "PGTASKD_IDEMPOTENCY_KEY",
        "TRACEPARENT",
    ];
    for (name, _) in &vars {
        assert!(
            ours.contains(name) || !is_removed(std::ffi::OsStr::new(name)),
            "{name} reached the child"
        );
    }
    assert!(
        !get("PATH").is_empty(),
        "the rest of the environment is kept"
    );
}
