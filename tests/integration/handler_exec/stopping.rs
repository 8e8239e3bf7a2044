//! How an `exec` run ends when the child does not end by itself, or leaves something behind:
//! timeouts, cancels, processes left in the group, and the descriptors of many runs.

use std::time::{Duration, Instant};

use super::*;

#[tokio::test]
async fn a_timeout_terminates_the_group() {
    let dir = TempDir::new();
    let pid_file = dir.path("pids");
    // The script and a sleep it started, both waiting: SIGTERM to the group ends both.
    let script = r#"sleep 1000 & echo $$ $! > "$1"; wait"#;
    let mut spec = spec(sh(script, &[&pid_file]));
    spec.timeout = Duration::from_secs(2);
    spec.kill_after = Duration::from_secs(600);
    let failure = failed(exec(&spec, b"").await);
    assert_eq!((failure.kind, failure.retry), (FailureKind::Timeout, LATER));
    assert_eq!(failure.message, "`/bin/sh` timed out after 2s");
    let pids = pids_in(&std::fs::read_to_string(&pid_file).expect(
        "the child wrote its pids before the 2 s timeout (a machine this slow fails this test)",
    ));
    assert_eq!(pids.len(), 2);
    wait_gone(&pids).await;
}

/// A child that tries to move itself out of its group, into the daemon's, cannot: it leads a
/// session of its own (`setsid`), and a session's leader keeps its group. Its timeout stops it.
#[tokio::test]
async fn a_child_cannot_move_into_the_daemons_group_and_is_stopped() {
    let dir = TempDir::new();
    let started = dir.fifo("started");
    let script = "import os, sys, time\n\
                  try:\n\
                  \x20   os.setpgid(0, os.getpgid(os.getppid()))\n\
                  \x20   moved = 'moved'\n\
                  except OSError:\n\
                  \x20   moved = 'stayed'\n\
                  open(sys.argv[1], 'w').write(str(os.getpid()) + ' ' + moved)\n\
                  time.sleep(1000)\n";
    let started_path = started.to_string_lossy().to_string();
    let mut spec = spec(argv(&["python3", "-c", script, &started_path]));
    spec.timeout = Duration::from_secs(1);
    spec.kill_after = Duration::from_secs(1);
    let running =
        tokio::spawn(async move { run(&spec, &job(), b"", &CancellationToken::new()).await });
    let report = within(
        WAIT,
        "the child's attempt to leave its group",
        tokio::fs::read_to_string(&started),
    )
    .await
    .expect("read the gate (python3 is needed)");
    let (pid, moved) = report.split_once(' ').expect("pid and outcome");
    let pid: libc::pid_t = pid.parse().expect("a pid");
    assert_eq!(moved, "stayed", "the child moved into the daemon's group");
    let ran = within(WAIT, "the run of a child that tried to leave", running)
        .await
        .expect("the run panicked");
    let failure = failed(ran);
    assert_eq!(failure.kind, FailureKind::Timeout, "{}", failure.message);
    assert!(gone(pid), "the child {pid} runs on after its timeout");
}

#[tokio::test]
async fn a_cancel_waits_for_a_child_that_ignores_sigterm_then_kills_it() {
    let dir = TempDir::new();
    let started = dir.fifo("started");
    let script =
        r#"trap 'echo SIGTERM ignored >&2' TERM; echo $$ > "$1"; while :; do sleep 1; done"#;
    let mut spec = spec(sh(script, &[&started]));
    spec.kill_after = Duration::from_millis(700);
    let cancel = CancellationToken::new();
    let running = tokio::spawn({
        let cancel = cancel.clone();
        async move { run(&spec, &job(), b"", &cancel).await }
    });
    let pid = pids_in(
        &within(
            WAIT,
            "the child to start",
            tokio::fs::read_to_string(&started),
        )
        .await
        .expect("read the gate"),
    )[0];
    let canceled_at = Instant::now();
    cancel.cancel();
    let ran = within(WAIT, "the canceled run", running)
        .await
        .expect("the run panicked");
    assert_eq!(ran, Ran::Canceled);
    assert!(
        canceled_at.elapsed() >= Duration::from_millis(700),
        "the run ended {:?} after the cancel, before kill_after: SIGTERM was taken for a stop",
        canceled_at.elapsed()
    );
    assert!(gone(pid), "the child {pid} runs on after Ran::Canceled");
}

#[tokio::test]
async fn a_cancel_during_a_timeouts_grace_is_a_cancel() {
    let dir = TempDir::new();
    let termed = dir.fifo("termed");
    let script = r#"trap 'echo TERM > "$1"' TERM; while :; do sleep 1; done"#;
    let mut spec = spec(sh(script, &[&termed]));
    spec.timeout = Duration::from_secs(2);
    spec.kill_after = Duration::from_secs(1);
    let cancel = CancellationToken::new();
    let running = tokio::spawn({
        let cancel = cancel.clone();
        async move { run(&spec, &job(), b"", &cancel).await }
    });
    let gate = tokio::fs::read_to_string(&termed);
    within(WAIT, "the timeout's SIGTERM to reach the child", gate)
        .await
        .expect("read the gate");
    cancel.cancel();
    let ran = within(WAIT, "the canceled run", running).await;
    assert_eq!(ran.expect("the run panicked"), Ran::Canceled);
}

#[tokio::test]
async fn a_cancel_before_the_start_starts_nothing() {
    let dir = TempDir::new();
    let marker = dir.path("ran");
    let cancel = CancellationToken::new();
    cancel.cancel();
    let spec = spec(sh(r#"touch "$1""#, &[&marker]));
    let ran = within(WAIT, "the run", run(&spec, &job(), b"", &cancel)).await;
    assert_eq!(ran, Ran::Canceled);
    assert!(!marker.exists());
}

#[tokio::test]
async fn what_the_child_leaves_in_its_group_is_killed_and_not_waited_for() {
    let dir = TempDir::new();
    let pid_file = dir.path("pid");
    // The sleep holds the child's stdout and stderr open: waiting for their end would hang.
    let script = r#"sleep 1000 & echo $! > "$1"; echo done"#;
    let output = succeeded(exec(&spec(sh(script, &[&pid_file])), b"").await);
    assert_eq!(output, "done\n");
    let pids = pids_in(&std::fs::read_to_string(&pid_file).expect("the child wrote its pid"));
    wait_gone(&pids).await;
}

#[tokio::test]
async fn a_run_dropped_midway_kills_the_group() {
    let dir = TempDir::new();
    let started = dir.fifo("started");
    let script = r#"sleep 1000 & echo $$ $! > "$1"; wait"#;
    let spec = spec(sh(script, &[&started]));
    let running =
        tokio::spawn(async move { run(&spec, &job(), b"", &CancellationToken::new()).await });
    let pids = within(
        WAIT,
        "the child to start",
        tokio::fs::read_to_string(&started),
    )
    .await
    .expect("read the gate");
    running.abort();
    let aborted = within(WAIT, "the aborted run", running).await;
    assert!(aborted.unwrap_err().is_cancelled());
    wait_gone(&pids_in(&pids)).await;
}

/// The environment variable that makes [`no_descriptor_leaks_over_many_runs`] measure, in a
/// test process of its own where nothing else opens descriptors meanwhile.
const FD_PROBE: &str = "PGTASKD_TEST_EXEC_FD_PROBE";

/// The environment variable that makes [`the_child_dies_with_the_daemon`] run a child, in a
/// test process of its own that the test then SIGKILLs; its value is the gate's path.
const ORPHAN_PROBE: &str = "PGTASKD_TEST_EXEC_ORPHAN_PROBE";

#[tokio::test]
async fn no_descriptor_leaks_over_many_runs() {
    if std::env::var_os(FD_PROBE).is_some() {
        return count_descriptors_over_many_runs().await;
    }
    let test = "handler_exec::stopping::no_descriptor_leaks_over_many_runs";
    run_probe(test, FD_PROBE, "the descriptor probe").await;
}

#[tokio::test]
async fn the_child_dies_with_the_daemon() {
    if let Some(gate) = std::env::var_os(ORPHAN_PROBE) {
        // The "daemon": runs a child until the test kills this process.
        let spec = spec(sh(
            r#"echo $$ > "$1"; exec sleep 1000"#,
            &[Path::new(&gate)],
        ));
        let ran = exec(&spec, b"").await;
        panic!("the probe was not killed: {ran:?}");
    }
    let dir = TempDir::new();
    let started = dir.fifo("started");
    let test = "handler_exec::stopping::the_child_dies_with_the_daemon";
    let mut daemon = own_process(test, ORPHAN_PROBE, started.as_os_str())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the probe");
    let child = within(
        WAIT,
        "the probe's child to start",
        tokio::fs::read_to_string(&started),
    )
    .await
    .expect("read the gate");
    daemon.start_kill().expect("SIGKILL the probe");
    within(WAIT, "the probe to die", daemon.wait())
        .await
        .expect("wait for the probe");
    wait_gone(&pids_in(&child)).await;
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Every way a run ends, 50 times, and not one descriptor more at the end.
async fn count_descriptors_over_many_runs() {
    let dir = TempDir::new();
    let pid_file = dir.path("pid");
    let payload = vec![b'p'; 300_000];
    let mut flood = spec(argv(&["yes"]));
    flood.max_output = 10_000;
    let mut slow = spec(sh("sleep 1000", &[]));
    slow.timeout = Duration::from_millis(1);
    let runs = [
        spec(argv(&["wc", "-c"])),
        spec(sh("echo ok; exit 3", &[])),
        spec(sh("echo never reads", &[])),
        spec(sh(r#"sleep 1000 & echo $! > "$1""#, &[&pid_file])),
        spec(argv(&["/nonexistent/pgtaskd-handler"])),
        flood,
        slow,
    ];
    // The runtime's own descriptors (the SIGCHLD pipe...) are opened by the first run.
    exec(&runs[0], &payload).await;
    let before = open_descriptors();
    for i in 0..50 {
        let ran = exec(&runs[i % runs.len()], &payload).await;
        if i % runs.len() == 0 {
            assert_eq!(
                ran,
                Ran::Succeeded {
                    output: "300000\n".into()
                }
            );
        }
    }
    let canceled = CancellationToken::new();
    canceled.cancel();
    run(&runs[0], &job(), &payload, &canceled).await;
    assert_eq!(
        open_descriptors(),
        before,
        "descriptors leaked over 50 runs"
    );
}
