//! `pgtaskd bench`: run the text-stats workload of `crate::bench` and print its figures.
//! Called by `dispatch`.

use std::process::ExitCode;
use std::time::Duration;

use crate::bench;
use crate::cli::BenchMode;
use crate::config::Config;

use super::CommandError;

/// Run the workload `mode` names (the latency mode sets its own task count; `duration`
/// defaults per mode) and print the report, for people or as JSON.
// One argument per option of the command line.
#[allow(clippy::too_many_arguments)]
pub(super) async fn bench(
    config: &Config,
    mode: BenchMode,
    tasks: u32,
    concurrency: u32,
    producers: u32,
    duration: Option<Duration>,
    soak: bench::SoakOptions,
    handler: Option<bench::BenchHandler>,
    max_running: Option<u32>,
    json: bool,
) -> Result<ExitCode, CommandError> {
    let mode = match mode {
        BenchMode::Drain => bench::Mode::Drain,
        BenchMode::Stream => bench::Mode::Stream,
        BenchMode::Latency => bench::Mode::Latency,
        BenchMode::Ceiling => bench::Mode::Ceiling,
        BenchMode::Producers => bench::Mode::Producers,
        BenchMode::Soak => bench::Mode::Soak,
    };
    let duration = match (mode, duration) {
        (bench::Mode::Producers, Some(d)) if d > bench::PRODUCERS_DURATION_MAX => {
            return Err(CommandError::Usage(
                "producers mode: --duration must be at most 5m".to_string(),
            ))
        }
        (bench::Mode::Soak, None) => bench::SOAK_DURATION,
        (_, None) => bench::PRODUCERS_DURATION,
        (_, Some(d)) => d,
    };
    if let Some(hold) = soak.hold.filter(|&hold| hold >= duration) {
        return Err(CommandError::Usage(format!(
            "--hold-snapshot {} must be shorter than --duration {}",
            humantime::format_duration(hold),
            humantime::format_duration(duration)
        )));
    }
    if handler.is_some() && mode != bench::Mode::Drain {
        return Err(CommandError::Usage(
            "--handler goes with --mode drain".to_string(),
        ));
    }
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
        soak,
        handler,
        max_running,
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
