//! The `pgtaskd` binary: parse the command line, load the configuration, set up logging, run
//! the command, and map its result to an exit code. Nothing else lives here.

use std::io::{IsTerminal, Write};
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
            report(format_args!("configuration error: {err}"));
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
            report(format_args!("cannot start the async runtime: {err}"));
            return ExitCode::from(commands::EXIT_RUNTIME);
        }
    };
    match runtime.block_on(commands::dispatch(cli, config)) {
        Ok(code) => code,
        Err(err) => {
            report(format_args!("{err}"));
            ExitCode::from(err.exit_code())
        }
    }
}

/// Print `pgtaskd: MESSAGE` on standard error, if it can be written at all.
///
/// Not `eprintln!`, which panics when standard error is a closed pipe.
fn report(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "pgtaskd: {message}");
}

/// Logs go to standard error: human text by default, JSON with `log.format = "json"`.
/// `RUST_LOG`, when set, overrides `log.level`.
///
/// Nothing may depend on a log line being written: a line that cannot be written (a closed
/// pipe, a full disk, journald restarting) is dropped. tracing-subscriber's own fallback for a
/// failed write is `eprintln!`, which panics on the same closed pipe, in whichever task logged;
/// it used to kill the signal task at its "signal received" line, so that SIGTERM did nothing.
fn init_tracing(config: &Config) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| tracing_subscriber::EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(&config.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Standard error for the log, where a failed write is dropped and reported as done.
struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}
