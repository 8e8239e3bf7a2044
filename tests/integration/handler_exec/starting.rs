//! How an `exec` run starts its child: without `fork` (the daemon's memory is not copied), with
//! the signal dispositions and mask a command expects, and a dropped run's child reaped.

use std::os::unix::process::CommandExt;

use super::*;

/// The environment variable that makes [`a_child_is_started_without_copying_the_daemons_memory`]
/// measure, in a test process of its own where nothing else runs meanwhile.
const FAULT_PROBE: &str = "PGTASKD_TEST_EXEC_FAULT_PROBE";

/// The pages written after each start, in the probe.
const PAGES: usize = 8192;

#[tokio::test]
async fn a_child_is_started_without_copying_the_daemons_memory() {
    if std::env::var_os(FAULT_PROBE).is_some() {
        return count_faults_per_start().await;
    }
    let test = "handler_exec::starting::a_child_is_started_without_copying_the_daemons_memory";
    run_probe(test, FAULT_PROBE, "the page fault probe").await;
}

/// After a `fork`, every page the parent writes takes a copy-on-write fault, however soon the
/// child calls `exec`. Writing [`PAGES`] pages after each start: about that many faults per
/// start with `fork` (measured here first, so that the test shows it can see one), a few with
/// the handler's start.
async fn count_faults_per_start() {
    let pages = Pages::new(PAGES);
    let starts = 10;
    let forked = faults_per(starts, &pages, || async {
        let mut command = std::process::Command::new("true");
        // SAFETY: does nothing; a `pre_exec` makes std start the child with `fork`.
        unsafe {
            command.pre_exec(|| Ok(()));
        }
        let status = command.status().expect("start true with fork");
        assert!(status.success());
    })
    .await;
    assert!(
        forked > PAGES / 2,
        "{forked} page faults per forked start of {PAGES} pages written: this machine does not \
         show a fork's copy-on-write faults (transparent huge pages?), so the test cannot tell"
    );
    let spec = spec(argv(&["true"]));
    let started = faults_per(starts, &pages, || async {
        assert_eq!(exec(&spec, b"").await, Ran::Succeeded { output: "".into() });
    })
    .await;
    eprintln!("page faults per start, {PAGES} pages written after each: fork {forked}, exec run {started}");
    assert!(
        started < PAGES / 8,
        "{started} page faults per exec run with {PAGES} pages written after each ({forked} \
         with fork): the daemon's memory is copied for each child"
    );
}

/// The minor page faults of this process per call of `start` (each followed by a write to
/// every page of `pages`), over `n` calls after a first one.
async fn faults_per<F, Fut>(n: usize, pages: &Pages, start: F) -> usize
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    start().await;
    pages.write();
    let before = minor_faults();
    for _ in 0..n {
        start().await;
        pages.write();
    }
    (minor_faults() - before) / n
}

fn minor_faults() -> usize {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    usage.ru_minflt as usize
}

/// Anonymous memory in pages of 4 KiB (no huge pages, whose faults would not count alike).
struct Pages {
    base: *mut u8,
    len: usize,
}

impl Pages {
    fn new(pages: usize) -> Pages {
        let len = pages * 4096;
        // SAFETY: a fresh private anonymous mapping, unmapped on drop.
        let base = unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED, "mmap");
            libc::madvise(base, len, libc::MADV_NOHUGEPAGE);
            base.cast::<u8>()
        };
        Pages { base, len }
    }

    /// Write one byte of every page.
    fn write(&self) {
        for offset in (0..self.len).step_by(4096) {
            // SAFETY: within the mapping.
            unsafe { std::ptr::write_volatile(self.base.add(offset), offset as u8) };
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// The bits of a `SigXxx:` line of /proc/PID/status.
fn signal_set(status: &str, line: &str) -> u64 {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(line))
        .unwrap_or_else(|| panic!("no {line} in:\n{status}"));
    u64::from_str_radix(hex.trim(), 16).expect("a hexadecimal signal set")
}

#[tokio::test]
async fn the_command_gets_sigpipe_at_its_default_and_the_threads_signal_mask() {
    let ours = std::fs::read_to_string("/proc/thread-self/status").expect("read our status");
    let status = succeeded(exec(&spec(argv(&["cat", "/proc/self/status"])), b"").await);
    assert_eq!(
        signal_set(&status, "SigBlk:"),
        signal_set(&ours, "SigBlk:"),
        "{status}"
    );
    // This process ignores SIGPIPE (Rust's runtime does); a command expects its default.
    // Whatever else it ignores (of the standard signals) stays ignored, as for std's children.
    let sigpipe = 1 << (libc::SIGPIPE - 1);
    let standard = (1 << 31) - 1;
    assert_ne!(signal_set(&ours, "SigIgn:") & sigpipe, 0, "{ours}");
    assert_eq!(
        signal_set(&status, "SigIgn:") & standard,
        signal_set(&ours, "SigIgn:") & standard & !sigpipe,
        "{status}"
    );
}

#[tokio::test]
async fn a_dropped_runs_child_is_reaped_by_a_later_start() {
    let dir = TempDir::new();
    let started = dir.fifo("started");
    let spec = spec(sh(r#"echo $$ > "$1"; exec sleep 1000"#, &[&started]));
    let running =
        tokio::spawn(async move { run(&spec, &job(), b"", &CancellationToken::new()).await });
    let pid = pids_in(
        &within(
            WAIT,
            "the child to start",
            tokio::fs::read_to_string(&started),
        )
        .await
        .expect("read the gate"),
    )[0];
    running.abort();
    assert!(within(WAIT, "the aborted run", running)
        .await
        .unwrap_err()
        .is_cancelled());
    // SIGKILLed when dropped; a zombie until some start reaps it.
    let quick = super::spec(argv(&["true"]));
    eventually(WAIT, &format!("process {pid} to be reaped"), || {
        let quick = quick.clone();
        async move {
            exec(&quick, b"").await;
            (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
        }
    })
    .await;
}
