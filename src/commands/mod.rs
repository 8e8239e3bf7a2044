//! What each subcommand does, and the exit code it ends with (docs/design.md, "Command line").
//!
//! Every command returns a [`CommandError`] whose [`CommandError::exit_code`] is the contract:
//! 3 no such task, 4 already terminal, 69 database unavailable (never "not found"), 75 a wait
//! that timed out (EX_TEMPFAIL: try again later),
//! 78 configuration error (bad settings, settings the database refuses, a schema that is
//! missing or not this binary's), 1 anything else. Usage errors (2) are clap's.

use std::future::Future;
use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

use crate::analyzer::TextStats;
use crate::bench::BenchError;
use crate::cli::{BenchMode, Cli, Command, EnqueueArgs};
use crate::config::Config;
use crate::daemon::{self, DaemonError, RunOptions};
use crate::db::migrate::{self, SchemaError};
use crate::db::{BadConnectionString, ConnectSettings, DbError};
use crate::queue::{self, CancelOutcome, Task, TaskStatus};
use crate::shutdown::Shutdown;
use crate::{batch, bench};

pub const EXIT_RUNTIME: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_NOT_FOUND: u8 = 3;
pub const EXIT_TERMINAL: u8 = 4;
pub const EXIT_UNAVAILABLE: u8 = 69;
pub const EXIT_TEMPFAIL: u8 = 75;
pub const EXIT_CONFIG: u8 = 78;

/// Why a command failed; [`CommandError::exit_code`] says how the process ends.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    Usage(String),
    #[error("no such task: {0}")]
    NotFound(i64),
    #[error("task {id} is already {status}; nothing changed")]
    Terminal { id: i64, status: TaskStatus },
    /// The database failed: 69 when unavailable, 78 when it refused the settings, else 1.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The connection settings cannot be used.
    #[error("configuration error")]
    Settings(#[from] BadConnectionString),
    /// The database is not one this binary can work with.
    #[error("configuration error")]
    Schema(#[source] SchemaError),
    #[error(transparent)]
    Daemon(DaemonError),
    #[error(transparent)]
    Bench(BenchError),
    #[error("cannot read {what}")]
    Input {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot handle signals")]
    Signals(#[source] std::io::Error),
    #[error("cannot write JSON")]
    Json(#[from] serde_json::Error),
    #[error("{failures} of {files} files could not be analyzed")]
    Analyze { failures: usize, files: usize },
    #[error("{failed} of {tasks} tasks did not succeed")]
    NotSucceeded { failed: usize, tasks: usize },
    #[error("timed out: {pending} of {tasks} tasks are not finished yet")]
    TimedOut { pending: usize, tasks: usize },
    #[error("idempotency key {key:?} already names task {id}, whose payload is another")]
    KeyConflict { key: String, id: i64 },
}

impl CommandError {
    /// The exit code: 2 usage, 3 no such task, 4 already terminal, 69 database unavailable,
    /// 75 a wait that timed out, 78 configuration, 1 anything else (a task that did not
    /// succeed, for `wait`).
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::Usage(_) => EXIT_USAGE,
            CommandError::NotFound(_) => EXIT_NOT_FOUND,
            CommandError::TimedOut { .. } => EXIT_TEMPFAIL,
            CommandError::Terminal { .. } => EXIT_TERMINAL,
            CommandError::Db(err) | CommandError::Daemon(DaemonError::Db(err)) => db_exit_code(err),
            CommandError::Settings(_)
            | CommandError::Schema(_)
            | CommandError::Daemon(
                DaemonError::Settings(_) | DaemonError::Token(_) | DaemonError::Schema(_),
            ) => EXIT_CONFIG,
            CommandError::Daemon(DaemonError::Bind(_))
            | CommandError::Bench(_)
            | CommandError::Input { .. }
            | CommandError::Signals(_)
            | CommandError::Json(_)
            | CommandError::Analyze { .. }
            | CommandError::NotSucceeded { .. }
            | CommandError::KeyConflict { .. } => EXIT_RUNTIME,
        }
    }
}

/// An outage is 69, never "not found"; settings the database refuses (a wrong password, an
/// unknown role, no such database) are a configuration error, 78; any other database error
/// is a runtime failure.
fn db_exit_code(err: &DbError) -> u8 {
    if err.is_unavailable() {
        EXIT_UNAVAILABLE
    } else if err.is_rejected() {
        EXIT_CONFIG
    } else {
        EXIT_RUNTIME
    }
}

impl From<SchemaError> for CommandError {
    fn from(err: SchemaError) -> Self {
        match err {
            SchemaError::Db(err) => CommandError::Db(err),
            other => CommandError::Schema(other),
        }
    }
}

impl From<DaemonError> for CommandError {
    fn from(err: DaemonError) -> Self {
        CommandError::Daemon(err)
    }
}

/// The bench's database and schema failures end the process as the other commands' do.
impl From<BenchError> for CommandError {
    fn from(err: BenchError) -> Self {
        match err {
            BenchError::Db(err) => CommandError::Db(err),
            BenchError::Schema(err) => CommandError::from(err),
            other => CommandError::Bench(other),
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
            shutdown.on_signals().map_err(CommandError::Signals)?;
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
            let task = queue::NewTask {
                priority: args.priority,
                run_at: args.run_at.unwrap_or(queue::RunAt::Now),
                max_attempts: args.max_attempts,
                idempotency_key: args.key.clone(),
                ..queue::NewTask::new(&args.queue, &payload)
            };
            if args.wait {
                let mut waiter = Waiter::open(&config).await?;
                let id = enqueued(
                    &args,
                    checked(&waiter.client, queue::enqueue(&waiter.client, &task)).await?,
                )?;
                return waiter.wait(&config, &[id], args.timeout, args.json).await;
            }
            let client = connect(&config).await?;
            let id = enqueued(
                &args,
                checked(&client, queue::enqueue(&client, &task)).await?,
            )?;
            println!("{id}");
        }
        Command::Wait(args) => {
            let mut waiter = Waiter::open(&config).await?;
            return waiter
                .wait(&config, &args.ids, args.timeout, args.json)
                .await;
        }
        Command::Status { id, json } => {
            let client = connect(&config).await?;
            let task = checked(&client, queue::get(&client, id))
                .await?
                .ok_or(CommandError::NotFound(id))?;
            if json {
                let text = serde_json::to_string_pretty(&task)?;
                println!("{text}");
            } else {
                print!("{}", describe_task(&task));
            }
        }
        Command::Cancel { id } => {
            let client = connect(&config).await?;
            match checked(&client, queue::cancel(&client, id)).await? {
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
                return Err(CommandError::Analyze {
                    failures,
                    files: files.len(),
                });
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
            let report = bench::run(&config, options).await?;
            if json {
                let text = serde_json::to_string(&report)?;
                println!("{text}");
            } else {
                println!("{report}");
            }
        }
        Command::CheckConfig => {
            let settings = ConnectSettings::new(&config.database, "check-config")?;
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

/// The id an enqueue names; a key held by a task with another payload is an error.
fn enqueued(args: &EnqueueArgs, enqueued: queue::Enqueued) -> Result<i64, CommandError> {
    match enqueued {
        queue::Enqueued::Created(id) | queue::Enqueued::Existing(id) => Ok(id),
        queue::Enqueued::KeyConflict(id) => Err(CommandError::KeyConflict {
            key: args.key.clone().unwrap_or_default(),
            id,
        }),
    }
}

/// A session that LISTENs on `pgtaskd_done`, for `wait` and `enqueue --wait`.
struct Waiter {
    client: tokio_postgres::Client,
    messages: tokio::sync::mpsc::Receiver<tokio_postgres::AsyncMessage>,
    _driver: tokio::task::JoinHandle<()>,
}

/// Notifications a waiting command holds unread; past this they are dropped (they are hints).
const WAIT_MESSAGES: usize = 1024;

impl Waiter {
    /// Connect and LISTEN, before any row is read (docs/design.md, "Completion notifications").
    async fn open(config: &Config) -> Result<Waiter, CommandError> {
        let settings = ConnectSettings::new(&config.database, "cli")?;
        let (sender, messages) = tokio::sync::mpsc::channel(WAIT_MESSAGES);
        let (client, driver) = settings.open(Some(sender)).await?;
        let listen = format!("LISTEN {}", crate::db::listen::DONE_CHANNEL);
        checked(&client, async {
            client.batch_execute(&listen).await.map_err(DbError::from)
        })
        .await?;
        Ok(Waiter {
            client,
            messages,
            _driver: driver,
        })
    }

    /// Wait for `ids`, print them as `status` does, and say how it ended: 0 all SUCCEEDED,
    /// 1 any FAILED or CANCELED, 3 an unknown id, 75 the timeout.
    async fn wait(
        &mut self,
        config: &Config,
        ids: &[i64],
        timeout: Option<std::time::Duration>,
        json: bool,
    ) -> Result<ExitCode, CommandError> {
        let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        let waited = checked(
            &self.client,
            queue::wait::until_terminal(
                &self.client,
                &mut self.messages,
                ids,
                config.worker.poll_interval,
                deadline,
            ),
        )
        .await?;
        if let Some(&id) = waited.missing.first() {
            return Err(CommandError::NotFound(id));
        }
        for task in &waited.tasks {
            if json {
                println!("{}", serde_json::to_string(task)?);
            } else {
                print!("{}", describe_task(task));
            }
        }
        let tasks = waited.tasks.len();
        if waited.timed_out {
            let pending = waited
                .tasks
                .iter()
                .filter(|task| !task.status.is_terminal())
                .count();
            return Err(CommandError::TimedOut { pending, tasks });
        }
        let failed = waited
            .tasks
            .iter()
            .filter(|task| task.status != TaskStatus::Succeeded)
            .count();
        if failed > 0 {
            return Err(CommandError::NotSucceeded { failed, tasks });
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// One session for a one-shot command.
async fn connect(config: &Config) -> Result<tokio_postgres::Client, CommandError> {
    let settings = ConnectSettings::new(&config.database, "cli")?;
    Ok(settings.connect().await?)
}

/// Await one statement of a one-shot command. When the server answers it with an error,
/// ask whether the schema is the reason (missing, or not this binary's version): that is a
/// configuration error with the "run `pgtaskd migrate`" hint, as `run` reports it, not a raw
/// SQL error. Costs a query only when the statement failed.
async fn checked<T>(
    client: &tokio_postgres::Client,
    statement: impl Future<Output = Result<T, DbError>>,
) -> Result<T, CommandError> {
    let err = match statement.await {
        Ok(value) => return Ok(value),
        Err(err) => err,
    };
    if err.is_transient() {
        return Err(err.into());
    }
    match migrate::check(client).await {
        Err(SchemaError::Db(_)) | Ok(_) => Err(err.into()),
        Err(schema) => Err(CommandError::Schema(schema)),
    }
}

fn read_payload(args: &EnqueueArgs) -> Result<String, CommandError> {
    let read = |result: std::io::Result<String>, what: &str| {
        result.map_err(|source| CommandError::Input {
            what: what.to_string(),
            source,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_from_the_error_type() {
        let outage = || DbError::unavailable("connection refused");
        let refused = || DbError::rejected("password authentication failed", "check it");
        let cases: Vec<(CommandError, u8)> = vec![
            (CommandError::Usage("x".into()), EXIT_USAGE),
            (CommandError::NotFound(7), EXIT_NOT_FOUND),
            (
                CommandError::Terminal {
                    id: 7,
                    status: TaskStatus::Succeeded,
                },
                EXIT_TERMINAL,
            ),
            (outage().into(), EXIT_UNAVAILABLE),
            (SchemaError::Db(outage()).into(), EXIT_UNAVAILABLE),
            (SchemaError::Missing.into(), EXIT_CONFIG),
            (DaemonError::from(SchemaError::Missing).into(), EXIT_CONFIG),
            (
                DaemonError::from(SchemaError::Db(outage())).into(),
                EXIT_UNAVAILABLE,
            ),
            (BenchError::Db(outage()).into(), EXIT_UNAVAILABLE),
            (
                BenchError::Schema(SchemaError::Ahead { found: 99 }).into(),
                EXIT_CONFIG,
            ),
            (BenchError::NoNotification.into(), EXIT_RUNTIME),
            (refused().into(), EXIT_CONFIG),
            (SchemaError::Db(refused()).into(), EXIT_CONFIG),
            (
                DaemonError::from(SchemaError::Db(refused())).into(),
                EXIT_CONFIG,
            ),
            (
                CommandError::Analyze {
                    failures: 1,
                    files: 2,
                },
                EXIT_RUNTIME,
            ),
            (
                CommandError::NotSucceeded {
                    failed: 1,
                    tasks: 2,
                },
                EXIT_RUNTIME,
            ),
            (
                CommandError::TimedOut {
                    pending: 1,
                    tasks: 1,
                },
                EXIT_TEMPFAIL,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(err.exit_code(), code, "{err}");
        }
    }

    #[test]
    fn a_schema_error_is_reported_as_a_configuration_error_with_its_reason() {
        let err = CommandError::from(SchemaError::Missing);
        assert_eq!(err.to_string(), "configuration error");
        let reason = std::error::Error::source(&err).expect("the reason is the source");
        assert!(reason.to_string().contains("pgtaskd migrate"), "{reason}");
    }
}
