//! `pgtaskd analyze`: the analyzer over local files, without a database.
//!
//! A bounded executor: at most `workers` files are read and analyzed at once, and results
//! come out in the order the files were given, whatever order they finish in. A deadline
//! cancels the work still running and skips what has not started; every analyzer that was
//! started is waited for until it has returned before its file is reported, so "canceled" is
//! never said of work that is still going on. The path `-` is standard input.

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
        let mut input: Box<dyn std::io::Read> = if path.as_os_str() == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::fs::File::open(&path).map_err(FileError::Read)?)
        };
        analyzer
            .analyze_reader(&mut input, &token)
            .map_err(|err| match err {
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
