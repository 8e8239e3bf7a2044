//! `pgtaskd analyze`: count the words, bytes and runes of local files with the bounded
//! executor of `batch`, one line per file, no database. Called by `dispatch`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::analyzer::TextStats;
use crate::batch;

use super::CommandError;

/// Analyze `files`, at most `workers` at once (default: the available parallelism), each
/// within `timeout` when given.
pub(super) async fn analyze(
    workers: Option<u32>,
    timeout: Option<Duration>,
    files: &[PathBuf],
) -> Result<ExitCode, CommandError> {
    let workers = workers.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n as usize,
    );
    let failures = batch::analyze_files(
        files,
        workers,
        timeout,
        Arc::new(TextStats),
        |path, result| match result {
            Ok(counts) => println!(
                "{} {} {} {}",
                counts.words,
                counts.bytes,
                counts.runes,
                path.display()
            ),
            Err(err) => eprintln!("pgtaskd: {}: {err}", path.display()),
        },
    )
    .await;
    if failures > 0 {
        return Err(CommandError::Analyze {
            failures,
            files: files.len(),
        });
    }
    Ok(ExitCode::SUCCESS)
}
