//! What each subcommand does, and the exit code it ends with (SPEC section 5).
//!
//! Every command returns a [`CommandError`] whose [`CommandError::exit_code`] is the contract:
//! 3 no such task, 4 already terminal, 69 database unavailable (never "not found"),
//! 78 configuration error, 1 anything else. Usage errors (2) are clap's.

use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

use crate::analyzer::TextStats;
use crate::cli::{BenchMode, Cli, Command, EnqueueArgs};
use crate::config::Config;
use crate::daemon::{self, DaemonError, RunOptions};
use crate::db::migrate::{self, SchemaError};
use crate::db::{ConnectSettings, DbError};
use crate::queue::{self, CancelOutcome, Task, TaskStatus};
use crate::shutdown::Shutdown;
use crate::{batch, bench};

pub const EXIT_RUNTIME: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_NOT_FOUND: u8 = 3;
pub const EXIT_TERMINAL: u8 = 4;
pub const EXIT_UNAVAILABLE: u8 = 69;
pub const EXIT_CONFIG: u8 = 78;

/// Why a command failed; each variant has its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    Usage(String),
    #[error("no such task: {0}")]
    NotFound(i64),
    #[error("task {id} is already {status}; nothing changed")]
    Terminal { id: i64, status: TaskStatus },
    #[error("{}", crate::db::describe(.0))]
    Unavailable(DbError),
    #[error("configuration error: {0:#}")]
    Config(anyhow::Error),
    #[error("{0:#}")]
    Runtime(anyhow::Error),
}

impl CommandError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::Usage(_) => EXIT_USAGE,
            CommandError::NotFound(_) => EXIT_NOT_FOUND,
            CommandError::Terminal { .. } => EXIT_TERMINAL,
            CommandError::Unavailable(_) => EXIT_UNAVAILABLE,
            CommandError::Config(_) => EXIT_CONFIG,
            CommandError::Runtime(_) => EXIT_RUNTIME,
        }
    }
}

impl From<DbError> for CommandError {
    fn from(err: DbError) -> Self {
        if err.is_unavailable() {
            CommandError::Unavailable(err)
        } else {
            CommandError::Runtime(anyhow::anyhow!(crate::db::describe(&err)))
        }
    }
}

impl From<SchemaError> for CommandError {
    fn from(err: SchemaError) -> Self {
        match err {
            SchemaError::Db(err) => err.into(),
            other => CommandError::Config(other.into()),
        }
    }
}

impl From<DaemonError> for CommandError {
    fn from(err: DaemonError) -> Self {
        match err {
            DaemonError::Config(err) => CommandError::Config(err),
            DaemonError::Runtime(err) => CommandError::Runtime(err),
        }
    }
}

/// Run the command `cli` names with the loaded `config`.
///
/// # Errors
///
/// A [`CommandError`] that maps to the command's exit code.
pub async fn dispatch(cli: Cli, config: Config) -> Result<ExitCode, CommandError> {
    match cli.command {
        Command::Run { migrate } => {
            let shutdown = Shutdown::new();
            shutdown
                .on_signals()
                .map_err(|err| CommandError::Runtime(err.into()))?;
            daemon::run(
                &config,
                Arc::new(TextStats),
                shutdown,
                RunOptions { migrate },
            )
            .await?;
        }
        Command::Migrate => {
            let mut client = connect(&config).await?;
            let applied = migrate::migrate(&mut client).await?;
            if applied.is_empty() {
                println!("schema is up to date (version {})", migrate::LATEST_VERSION);
            } else {
                for version in applied {
                    println!("applied migration {version}");
                }
            }
        }
        Command::Enqueue(args) => {
            let payload = read_payload(&args)?;
            let client = connect(&config).await?;
            let id = queue::enqueue(&client, &args.queue, &payload).await?;
            println!("{id}");
        }
        Command::Status { id, json } => {
            let client = connect(&config).await?;
            let task = queue::get(&client, id)
                .await?
                .ok_or(CommandError::NotFound(id))?;
            if json {
                let text = serde_json::to_string_pretty(&task)
                    .map_err(|err| CommandError::Runtime(err.into()))?;
                println!("{text}");
            } else {
                print!("{}", describe_task(&task));
            }
        }
        Command::Cancel { id } => {
            let client = connect(&config).await?;
            match queue::cancel(&client, id).await? {
                CancelOutcome::Canceled => println!("CANCELED"),
                CancelOutcome::Requested => {
                    println!(
                        "RUNNING (cancel requested; it becomes CANCELED once its analyzer returns)"
                    )
                }
                CancelOutcome::AlreadyFinished(status) => {
                    return Err(CommandError::Terminal { id, status })
                }
                CancelOutcome::NotFound => return Err(CommandError::NotFound(id)),
            }
        }
        Command::Analyze {
            workers,
            timeout,
            files,
        } => {
            let workers = workers.map_or_else(
                || std::thread::available_parallelism().map_or(1, |n| n.get()),
                |n| n as usize,
            );
            let failures = batch::analyze_files(
                &files,
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
                return Err(CommandError::Runtime(anyhow::anyhow!(
                    "{failures} of {} files could not be analyzed",
                    files.len()
                )));
            }
        }
        Command::Bench {
            mode,
            tasks,
            concurrency,
            json,
        } => {
            let mode = match mode {
                BenchMode::Drain => bench::Mode::Drain,
                BenchMode::Stream => bench::Mode::Stream,
                BenchMode::Latency => bench::Mode::Latency,
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
            };
            let report = bench::run(&config, options)
                .await
                .map_err(|err| match err {
                    bench::BenchError::Db(err) => CommandError::from(err),
                    bench::BenchError::Schema(err) => CommandError::from(err),
                    other => CommandError::Runtime(other.into()),
                })?;
            if json {
                let text = serde_json::to_string(&report)
                    .map_err(|err| CommandError::Runtime(err.into()))?;
                println!("{text}");
            } else {
                println!("{report}");
            }
        }
        Command::CheckConfig => {
            let settings = ConnectSettings::new(&config.database, "check-config")
                .map_err(|err| CommandError::Config(err.into()))?;
            let pg = settings.config();
            println!("configuration is valid");
            println!(
                "database: hosts={:?} ports={:?} user={} dbname={}",
                pg.get_hosts(),
                pg.get_ports(),
                pg.get_user().unwrap_or(""),
                pg.get_dbname().or(pg.get_user()).unwrap_or("")
            );
            println!(
                "worker: concurrency={} queues={:?} poll_interval={:?} lease={:?}",
                config.worker.concurrency,
                config.worker.queues,
                config.worker.poll_interval,
                config.worker.lease
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One session for a one-shot command.
async fn connect(config: &Config) -> Result<tokio_postgres::Client, CommandError> {
    let settings = ConnectSettings::new(&config.database, "cli")
        .map_err(|err| CommandError::Config(err.into()))?;
    Ok(settings.connect().await?)
}

fn read_payload(args: &EnqueueArgs) -> Result<String, CommandError> {
    let read = |result: std::io::Result<String>, what: &str| {
        result.map_err(|err| CommandError::Runtime(anyhow::anyhow!("cannot read {what}: {err}")))
    };
    match (&args.text, &args.file) {
        (Some(text), None) if text == "-" => {
            let mut payload = String::new();
            read(
                std::io::stdin()
                    .read_to_string(&mut payload)
                    .map(|_| payload),
                "standard input",
            )
        }
        (Some(text), None) => Ok(text.clone()),
        (None, Some(path)) => read(std::fs::read_to_string(path), &path.display().to_string()),
        _ => Err(CommandError::Usage(
            "enqueue takes TEXT, --file FILE or - (standard input)".into(),
        )),
    }
}

/// The human form of `status`.
pub fn describe_task(task: &Task) -> String {
    let mut text = format!("task {}: {}", task.id, task.status);
    if task.status == TaskStatus::Succeeded {
        text.push_str(&format!(
            " words={} bytes={} runes={}",
            task.words, task.bytes, task.runes
        ));
    }
    text.push('\n');
    text.push_str(&format!(
        "  queue: {}  priority: {}  attempt: {}/{}\n",
        task.queue, task.priority, task.attempt, task.max_attempts
    ));
    if let Some(error) = &task.error {
        text.push_str(&format!("  error: {error}\n"));
    }
    if task.cancel_requested {
        text.push_str("  cancel requested\n");
    }
    if let (Some(owner), Some(expires)) = (&task.lease_owner, &task.lease_expires_at) {
        text.push_str(&format!(
            "  lease: {owner} until {}\n",
            expires.to_rfc3339()
        ));
    }
    text.push_str(&format!("  created: {}", task.created_at.to_rfc3339()));
    if task.run_at > task.created_at {
        text.push_str(&format!("  run at: {}", task.run_at.to_rfc3339()));
    }
    if let Some(started) = task.started_at {
        text.push_str(&format!("  started: {}", started.to_rfc3339()));
    }
    if let Some(finished) = task.finished_at {
        text.push_str(&format!("  finished: {}", finished.to_rfc3339()));
    }
    text.push('\n');
    text
}
