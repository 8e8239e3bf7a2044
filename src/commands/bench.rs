//! `pgtaskd bench`: run the text-stats workload of `crate::bench` and print its figures.
//! Called by `dispatch`.

use std::process::ExitCode;
use std::time::Duration;

use crate::bench;
use crate::cli::BenchMode;
use crate::config::Config;

use super::CommandError;

/// Run the workload `mode` names (the latency mode sets its own task count) and print the
/// report, for people or as JSON.
pub(super) async fn bench(
    config: &Config,
    mode: BenchMode,
    tasks: u32,
    concurrency: u32,
    producers: u32,
    duration: Duration,
    json: bool,
) -> Result<ExitCode, CommandError> {
    let mode = match mode {
        BenchMode::Drain => bench::Mode::Drain,
        BenchMode::Stream => bench::Mode::Stream,
        BenchMode::Latency => bench::Mode::Latency,
        BenchMode::Ceiling => bench::Mode::Ceiling,
        BenchMode::Producers => bench::Mode::Producers,
    };
    let tasks = if mode == bench::Mode::Latency {
        bench::LATENCY_MODE_TASKS
    } else {
        tasks
    };
    let options = bench::BenchOptions {
        mode,
        tasks,
        concurrency: concurrency as usize,
        producers: producers as usize,
        duration,
    };
    let report = bench::run(config, options).await?;
    if json {
        let text = serde_json::to_string(&report)?;
        println!("{text}");
    } else {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}
