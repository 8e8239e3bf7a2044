//! The `pgtaskd` binary: parse the command line, load the configuration, set up logging, run
//! the command, and map its result to an exit code. Nothing else lives here.

use std::error::Error;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use pgtaskd::cli::Cli;
use pgtaskd::commands::{self, EXIT_CONFIG};
use pgtaskd::config::{Config, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("pgtaskd: configuration error: {}", chain(&err));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    init_tracing(&config);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("pgtaskd: cannot start the async runtime: {err}");
            return ExitCode::from(commands::EXIT_RUNTIME);
        }
    };
    match runtime.block_on(commands::dispatch(cli, config)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("pgtaskd: {}", chain(&err));
            ExitCode::from(err.exit_code())
        }
    }
}

/// An error and its sources, joined by ": ", for the one line on standard error.
fn chain(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// Logs go to standard error: human text by default, JSON with `log.format = "json"`.
/// `RUST_LOG`, when set, overrides `log.level`.
fn init_tracing(config: &Config) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| tracing_subscriber::EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(&config.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
