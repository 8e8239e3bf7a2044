//! The `pgtaskd` binary: parse the command line, load the configuration, set up logging, run
//! the command, and map its result to an exit code. Nothing else lives here.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use pgtaskd::cli::{Cli, Command};
use pgtaskd::commands::{self, EXIT_CONFIG};
use pgtaskd::config::{Config, LogFormat, Overlay};

fn main() -> ExitCode {
    // Before anything else: the environment holds the database URL from the first instruction.
    if let Err(err) = pgtaskd::privileges::at_start() {
        report(format_args!(
            "cannot make the process non-dumpable or clear its ambient capabilities: {err}"
        ));
        return ExitCode::from(commands::EXIT_RUNTIME);
    }
    quiet_on_closed_output();
    let cli = pgtaskd::cli::parse();
    // Neither needs the configuration: a broken file must not stop them.
    match cli.command {
        Command::Completions { shell } => return commands::completions(shell),
        Command::Man { dir } => return commands::man(dir.as_deref()),
        _ => {}
    }
    let mut overlay = Overlay::from_env(&flags(&cli));
    // Only these start a queue's program: the others must work while one is missing.
    if !matches!(
        cli.command,
        Command::Run { .. } | Command::CheckConfig { .. }
    ) {
        overlay = overlay.without_program_checks();
    }
    let config = match Config::load_with(cli.config.as_deref(), &overlay) {
        Ok(config) => config,
        Err(err) => {
            report(format_args!(
                "configuration error: {}",
                pgtaskd::error_chain(&err)
            ));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let log = init_tracing(&config);
    if cli
        .database_url
        .as_deref()
        .and_then(|url| url.parse::<tokio_postgres::Config>().ok())
        .is_some_and(|url| url.get_password().is_some())
    {
        tracing::warn!("--database-url holds a password, which every local user can read from pgtaskd's command line (/proc/PID/cmdline): give it in the configuration file, PGTASKD_DATABASE_URL, PGPASSWORD or a PGPASSFILE instead");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            log.flush();
            report(format_args!("cannot start the async runtime: {err}"));
            return ExitCode::from(commands::EXIT_RUNTIME);
        }
    };
    let result = runtime.block_on(commands::dispatch(cli, config));
    log.flush();
    match result {
        Ok(code) => code,
        Err(err) => {
            report(format_args!("{}", pgtaskd::error_chain(&err)));
            ExitCode::from(err.exit_code())
        }
    }
}

/// The configuration keys given as flags: `--database-url` for every command, and the
/// settings of `run` and `check-config`.
fn flags(cli: &Cli) -> Vec<(&'static str, String)> {
    let mut flags = match &cli.command {
        Command::Run { settings, .. } | Command::CheckConfig { settings, .. } => settings.given(),
        _ => Vec::new(),
    };
    if let Some(url) = &cli.database_url {
        flags.push(("--database-url", url.clone()));
    }
    flags
}

/// Print `pgtaskd: MESSAGE` on standard error, if it can be written at all.
///
/// Not `eprintln!`, which panics when standard error is a closed pipe.
fn report(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "pgtaskd: {message}");
}

/// Logs go to standard error: human text by default, JSON with `log.format = "json"`.
/// `RUST_LOG`, when set, overrides `log.level`. The pool library's own lines are left out
/// unless the filter asks for them ([`pgtaskd::config::with_quiet_pool`]).
///
/// Nothing may depend on a log line being written: a line that cannot be written (a closed
/// pipe, a full disk, journald restarting) is dropped. tracing-subscriber's own fallback for a
/// failed write is `eprintln!`, which panics on the same closed pipe, in whichever task logged;
/// it used to kill the signal task at its "signal received" line, so that SIGTERM did nothing.
/// Nor may a write that blocks (a reader that stopped reading) stall the daemon, whose tasks
/// share one thread: lines are queued for a thread of their own ([`Log`]).
fn init_tracing(config: &Config) -> Log {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|directives| {
            !directives.trim().is_empty()
                && tracing_subscriber::EnvFilter::try_new(directives).is_ok()
        })
        .unwrap_or_else(|| config.log.level.clone());
    let filter =
        tracing_subscriber::EnvFilter::try_new(pgtaskd::config::with_quiet_pool(&directives))
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&directives));
    let log = Log::start();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(log.clone())
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    log
}

/// Log lines queued for standard error; past this many, new lines are dropped.
const LOG_QUEUE: usize = 4096;
/// How long the exit waits for the queued lines to be written.
const LOG_FLUSH: Duration = Duration::from_secs(1);

enum LogItem {
    Line(Vec<u8>),
    /// Answered once every line queued before it was written.
    Flush(SyncSender<()>),
}

/// The log's way to standard error: each line is queued (never waiting) and written by a
/// thread of its own, which drops a line it cannot write. A full queue drops the line.
#[derive(Clone)]
struct Log {
    /// `None` when the writer thread could not be started: lines are written in place.
    queue: Option<SyncSender<LogItem>>,
}

impl Log {
    fn start() -> Log {
        let (queue, lines) = mpsc::sync_channel(LOG_QUEUE);
        let started = std::thread::Builder::new()
            .name("log".into())
            .spawn(move || {
                let mut stderr = std::io::stderr();
                for item in lines {
                    match item {
                        LogItem::Line(line) => {
                            let _ = stderr.write_all(&line);
                        }
                        LogItem::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        Log {
            queue: started.is_ok().then_some(queue),
        }
    }

    /// Wait, at most [`LOG_FLUSH`], until the lines queued so far are written.
    fn flush(&self) {
        let Some(queue) = &self.queue else { return };
        let deadline = Instant::now() + LOG_FLUSH;
        let (done, written) = mpsc::sync_channel(1);
        let mut item = LogItem::Flush(done);
        loop {
            match queue.try_send(item) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    item = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let _ = written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = LogLine<'a>;

    fn make_writer(&'a self) -> LogLine<'a> {
        LogLine(self.queue.as_ref())
    }
}

/// One log line on its way to [`Log`]'s queue.
struct LogLine<'a>(Option<&'a SyncSender<LogItem>>);

impl Write for LogLine<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.0 {
            Some(queue) => {
                let _ = queue.try_send(LogItem::Line(buf.to_vec()));
            }
            None => {
                let _ = std::io::stderr().write_all(buf);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `println!` panics when its write fails. A reader that went away (`pgtaskd list | head -1`)
/// ends the command quietly with status 0, as ripgrep does: whatever the command changed has
/// committed already, and a panic's exit 101 and backtrace would say it failed. Any other
/// failed write to stdout or stderr (a full disk) is one line and exit 1. Every other panic
/// is reported as before.
fn quiet_on_closed_output() {
    let report_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to std") {
            if message.contains("Broken pipe") {
                std::process::exit(0);
            }
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("pgtaskd: {message}\n"),
            );
            std::process::exit(1);
        }
        report_panic(info);
    }));
}
