//! `pgtaskd analyze`: local files, no database; results in input order, usage errors exit 2,
//! unreadable files exit 1 after the rest, the timeout waits for the work it cancels.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pgtaskd::analyzer::Counts;
use pgtaskd::batch::{analyze_files, FileError};

use crate::support::daemon::{pgtaskd, tempfile_path::TempPath};
use crate::support::{expected_counts, payload, within, GatedAnalyzer, WAIT};

#[tokio::test]
async fn results_come_in_the_order_given_whatever_order_they_finish_in() {
    // Sizes from large to small, so that later files finish first.
    let files: Vec<TempPath> = (0..12)
        .map(|i| TempPath::write(&payload(i).repeat(2_000 / (i + 1))))
        .collect();
    let mut args = vec!["analyze".to_string(), "--workers".into(), "4".into()];
    args.extend(files.iter().map(|f| f.path().to_string_lossy().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout, stderr) = pgtaskd(None, &args).await;
    assert!(status.success(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), files.len());
    for (line, file) in lines.iter().zip(&files) {
        let text = std::fs::read_to_string(file.path()).unwrap();
        let (w, b, r) = expected_counts(&text);
        assert_eq!(*line, format!("{w} {b} {r} {}", file.path().display()));
    }
}

#[tokio::test]
async fn usage_errors_exit_2_with_nothing_on_stdout() {
    let file = TempPath::write("x");
    let path = file.path().to_string_lossy().to_string();
    for args in [
        &["analyze", "--workers", "0", &path][..],
        &["analyze", "--timeout", "0s", &path],
        &["analyze", "--timeout", "soon", &path],
        &["analyze"],
    ] {
        let (status, stdout, stderr) = pgtaskd(None, args).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
}

#[tokio::test]
async fn an_unreadable_file_is_reported_on_its_own_line_and_the_rest_still_print() {
    let good = TempPath::write("two words");
    let also_good = TempPath::write("three more words");
    let good_path = good.path().to_string_lossy().to_string();
    let also_path = also_good.path().to_string_lossy().to_string();
    let (status, stdout, stderr) = pgtaskd(
        None,
        &["analyze", &good_path, "/nonexistent/file.txt", &also_path],
    )
    .await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stdout, format!("2 9 9 {good_path}\n3 16 16 {also_path}\n"));
    assert!(
        stderr.contains("/nonexistent/file.txt: cannot read"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_cancels_held_work_and_waits_for_it_to_return_before_reporting() {
    let files: Vec<TempPath> = (0..3)
        .map(|i| TempPath::write(&format!("file {i}")))
        .collect();
    let paths: Vec<PathBuf> = files.iter().map(|f| f.path().to_path_buf()).collect();
    let analyzer = GatedAnalyzer::closed();
    let mut reported = Vec::new();
    let failures = within(
        WAIT,
        "analyze_files to return",
        analyze_files(
            &paths,
            2,
            Some(Duration::from_millis(100)),
            analyzer.clone(),
            |path, result| {
                // A file whose analyzer started is reported only once that analyzer returned.
                let text = std::fs::read_to_string(path).unwrap();
                assert_eq!(
                    analyzer.returns_for(&text),
                    analyzer.calls_for(&text),
                    "{text}"
                );
                reported.push(matches!(result, Err(FileError::Canceled)));
            },
        ),
    )
    .await;
    assert_eq!(failures, 3);
    assert_eq!(reported, [true, true, true]);
    assert_eq!(analyzer.calls(), 2, "the third file was never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_does_not_report_an_analyzer_that_ignores_it_until_it_returns() {
    let file = TempPath::write("slow words");
    let paths = vec![file.path().to_path_buf()];
    let analyzer = GatedAnalyzer::closed_ignoring_cancel();
    let run = tokio::spawn({
        let analyzer: Arc<GatedAnalyzer> = analyzer.clone();
        async move {
            let report = |_: &std::path::Path, r: &Result<Counts, FileError>| {
                assert!(r.is_ok(), "a result that came is reported: {r:?}");
            };
            analyze_files(&paths, 1, Some(Duration::from_millis(50)), analyzer, report).await
        }
    });
    analyzer.saw_cancel(1).await;
    assert!(!run.is_finished(), "reported before the analyzer returned");
    analyzer.open();
    let failures = within(WAIT, "analyze_files to return", run).await.unwrap();
    assert_eq!(failures, 0);
}

#[tokio::test]
async fn analyze_reads_standard_input_for_a_dash() {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(crate::support::daemon::binary())
        .args(["analyze", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all("naïve 日本語 text".as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let output =
        crate::support::within(crate::support::WAIT, "analyze -", child.wait_with_output())
            .await
            .unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "3 21 14 -\n");
}

/// A FIFO, removed when dropped.
struct Fifo(PathBuf);

impl Fifo {
    fn new(name: &str) -> Fifo {
        let path =
            std::env::temp_dir().join(format!("pgtaskd-test-fifo-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
        Fifo(path)
    }

    fn arg(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `--timeout` bounds the open and the read, not only the analysis: a FIFO no writer ever
/// opens (whose open blocks), and one whose writer never writes (whose read blocks), are
/// reported canceled and the command ends; a FIFO whose writer writes and closes is read as
/// a file is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_bounds_the_open_and_the_read_of_a_fifo() {
    let unopened = Fifo::new("unopened");
    let silent = Fifo::new("silent");
    let written = Fifo::new("written");
    // Read and write: the open does not wait for a reader, and the FIFO has a writer that
    // never writes for as long as the test holds it.
    let _silent_writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&silent.0)
        .unwrap();
    let written_path = written.0.clone();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        // Blocks until pgtaskd opens the FIFO for reading.
        let mut fifo = std::fs::OpenOptions::new()
            .write(true)
            .open(written_path)
            .unwrap();
        fifo.write_all("naïve 日本語 text".as_bytes()).unwrap();
    });
    let (status, stdout, stderr) = pgtaskd(
        None,
        &[
            "analyze",
            "--workers",
            "3",
            "--timeout",
            "1s",
            &unopened.arg(),
            &silent.arg(),
            &written.arg(),
        ],
    )
    .await;
    writer.join().unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stdout, format!("3 21 14 {}\n", written.arg()));
    for fifo in [&unopened, &silent] {
        assert!(
            stderr.contains(&format!("{}: canceled: the timeout expired", fifo.arg())),
            "{stderr}"
        );
    }
    assert!(
        stderr.contains("2 of 3 files could not be analyzed"),
        "{stderr}"
    );
}
