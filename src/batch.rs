//! `pgtaskd analyze`: the analyzer over local files, without a database.
//!
//! A bounded executor: at most `workers` files are read and analyzed at once, and results
//! come out in the order the files were given, whatever order they finish in. A deadline
//! cancels the work still running and skips what has not started; every analyzer that was
//! started is waited for until it has returned before its file is reported, so "canceled" is
//! never said of work that is still going on. The path `-` is standard input.
//!
//! The deadline bounds the open and every read too. A FIFO, a terminal, a socket or standard
//! input can block either for ever (a FIFO with no writer blocks its open; a writer that
//! never writes blocks the read), and a blocked system call cannot be canceled: such a file is
//! opened with `O_NONBLOCK` and read only after `poll` says it is ready, asking the deadline
//! every `POLL_SLICE`. Regular files are read as they are.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::analyzer::{AnalyzeError, Analyzer, Counts, StreamError};

/// Why one file has no result.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    #[error("not valid UTF-8")]
    NotUtf8,
    #[error("canceled: the timeout expired")]
    Canceled,
    #[error("analysis failed: {0}")]
    Failed(String),
}

/// Analyze `paths` with at most `workers` at once, calling `report` for each file in input
/// order. With a `timeout`, work still running when it expires is canceled (and awaited),
/// and files not yet started are reported canceled. Returns how many files had no result.
pub async fn analyze_files(
    paths: &[PathBuf],
    workers: usize,
    timeout: Option<Duration>,
    analyzer: Arc<dyn Analyzer>,
    mut report: impl FnMut(&Path, &Result<Counts, FileError>),
) -> usize {
    let deadline = CancellationToken::new();
    let _timer = timeout.map(|timeout| {
        let deadline = deadline.clone();
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            deadline.cancel();
        }))
    });
    // Owned items, so that the stream's future is Send without higher-ranked lifetimes.
    let jobs: Vec<_> = paths
        .iter()
        .map(|path| analyze_file(path.clone(), Arc::clone(&analyzer), deadline.clone()))
        .collect();
    let mut results = futures_util::stream::iter(jobs).buffered(workers.max(1));
    let mut failures = 0;
    let mut index = 0;
    while let Some(result) = results.next().await {
        if result.is_err() {
            failures += 1;
        }
        report(&paths[index], &result);
        index += 1;
    }
    failures
}

async fn analyze_file(
    path: PathBuf,
    analyzer: Arc<dyn Analyzer>,
    deadline: CancellationToken,
) -> Result<Counts, FileError> {
    if deadline.is_cancelled() {
        return Err(FileError::Canceled);
    }
    let token = deadline.child_token();
    let work = tokio::task::spawn_blocking(move || {
        let mut input: Box<dyn Read> = if path.as_os_str() == "-" {
            Box::new(Polled {
                input: std::io::stdin().lock(),
                cancel: token.clone(),
            })
        } else {
            open(&path, &token)?
        };
        analyzer
            .analyze_reader(&mut input, &token)
            .map_err(|err| match err {
                StreamError::Read(_) if token.is_cancelled() => FileError::Canceled,
                StreamError::Read(err) => FileError::Read(err),
                StreamError::NotUtf8 => FileError::NotUtf8,
                StreamError::Analyze(AnalyzeError::Canceled { .. }) => FileError::Canceled,
                StreamError::Analyze(AnalyzeError::Failed { message, .. }) => {
                    FileError::Failed(message)
                }
            })
    });
    // The blocking work is awaited to its end, deadline or not.
    match work.await {
        Ok(result) => result,
        Err(join) => Err(FileError::Failed(format!("analyzer panicked: {join}"))),
    }
}

/// How long one `poll` waits before the deadline is asked again.
const POLL_SLICE: Duration = Duration::from_millis(50);

/// Open `path` for reading: a regular file as it is; anything else (a FIFO above all, whose
/// open blocks until a writer comes) without blocking, to be read through [`Polled`].
fn open(path: &Path, cancel: &CancellationToken) -> Result<Box<dyn Read>, FileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(FileError::Read)?;
    let kind = file.metadata().map_err(FileError::Read)?.file_type();
    // Blocking again: reads wait in `poll`, not in `read`. The flag belongs to this open file
    // description alone.
    set_blocking(file.as_fd()).map_err(FileError::Read)?;
    if kind.is_fifo() || kind.is_char_device() || kind.is_socket() {
        Ok(Box::new(Polled {
            input: file,
            cancel: cancel.clone(),
        }))
    } else {
        Ok(Box::new(file))
    }
}

fn set_blocking(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor this process holds open, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A reader that reads only once `poll` says a read will not block (data, or the writer
/// gone), and fails with [`std::io::ErrorKind::TimedOut`] once `cancel` is canceled.
struct Polled<R> {
    input: R,
    cancel: CancellationToken,
}

impl<R: Read + AsFd> Read for Polled<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if self.cancel.is_cancelled() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the timeout expired",
                ));
            }
            let mut poll = libc::pollfd {
                fd: self.input.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd that lives across the call, for a descriptor held open.
            let ready = unsafe { libc::poll(&mut poll, 1, POLL_SLICE.as_millis() as libc::c_int) };
            if ready < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if ready > 0 {
                return self.input.read(buf);
            }
        }
    }
}
