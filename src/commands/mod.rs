//! What each subcommand does, and the exit code it ends with (docs/design.md, "Command line").
//!
//! Every command returns a [`CommandError`] whose [`CommandError::exit_code`] is the contract:
//! 3 no such task (a parent an enqueue names included) or batch, 4 already terminal (or a
//! sealed batch an enqueue names), 69 database unavailable (never "not found"), 75 a wait
//! that timed out (EX_TEMPFAIL: try again later),
//! 78 configuration error (bad settings, settings the database refuses, a schema that is
//! missing or not this binary's), 1 anything else. Usage errors (2) are clap's.
//!
//! This module owns [`dispatch`], which `main` calls with the parsed command line and the
//! loaded configuration, the exit codes as constants, and [`CommandError`] with its mapping to
//! them. Each command's body lives beside it: `service.rs` (`run`, `migrate`, `check-config`),
//! `task.rs` (`enqueue`, `status`, `cancel`), `graph.rs` (`graph`), `batches.rs` (`batch`), `wait.rs` (`wait`, and `enqueue --wait`),
//! `queues.rs` (`pause`, `resume`, `retry`, `list`, `stats`), `queue_settings.rs` (`queue set`,
//! `queue show`), `daemons.rs` (`daemons`), `schedules.rs` (`schedule`),
//! `analyze.rs`, `bench.rs`, `probe.rs` (`probe`), and `generate.rs` (`completions`, `man`).

use std::future::Future;
use std::process::ExitCode;

use crate::bench::BenchError;
use crate::cli::{Cli, Command};
use crate::config::Config;
use crate::daemon::DaemonError;
use crate::db::migrate::{self, SchemaError};
use crate::db::{BadConnectionString, ConnectSettings, DbError};
use crate::queue::batches::BatchRefusal;
use crate::queue::TaskStatus;
use tokio_postgres::error::SqlState;

mod analyze;
mod batches;
mod bench;
mod daemons;
mod generate;
mod graph;
mod probe;
mod queue_settings;
mod queues;
mod schedules;
mod service;
mod task;
mod wait;

pub use generate::{completions, man};
pub use task::describe_task;

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
    /// `enqueue --after ID` of a task that does not exist: the database's words, which name
    /// it (`task depends on task 12, which does not exist`); 3, as any unknown task id.
    #[error("{0}")]
    NoSuchParent(String),
    /// `retry --queue Q --failed` of a queue without any task that is not paused either: 3.
    #[error("no such queue: {0} has no task and is not paused")]
    NoSuchQueue(String),
    #[error("no such schedule: {0}")]
    NoSuchSchedule(String),
    #[error("no such batch: {0}")]
    NoSuchBatch(i64),
    /// `enqueue --batch ID` of a batch that does not exist (3) or is sealed (4): the
    /// database's words, which name it.
    #[error(transparent)]
    BatchRefused(crate::queue::batches::BatchRefusal),
    #[error("task {id} is already {status}; nothing changed")]
    Terminal { id: i64, status: TaskStatus },
    #[error(
        "task {id} is {status}: only a FAILED or CANCELED task can be retried; nothing changed"
    )]
    NotRetryable { id: i64, status: TaskStatus },
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
    /// `pgtaskd probe`: 78 configuration, 69 no answer, 1 an answer that is not 200.
    #[error(transparent)]
    Probe(#[from] probe::ProbeError),
}

impl CommandError {
    /// The exit code: 2 usage, 3 no such task, 4 already terminal, 69 database unavailable,
    /// 75 a wait that timed out, 78 configuration, 1 anything else (a task that did not
    /// succeed, for `wait`).
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::Usage(_) => EXIT_USAGE,
            CommandError::NotFound(_)
            | CommandError::NoSuchParent(_)
            | CommandError::NoSuchQueue(_)
            | CommandError::NoSuchSchedule(_)
            | CommandError::NoSuchBatch(_)
            | CommandError::BatchRefused(BatchRefusal::Unknown(_)) => EXIT_NOT_FOUND,
            CommandError::TimedOut { .. } => EXIT_TEMPFAIL,
            CommandError::Terminal { .. }
            | CommandError::NotRetryable { .. }
            | CommandError::BatchRefused(BatchRefusal::Sealed(_)) => EXIT_TERMINAL,
            CommandError::Db(err) | CommandError::Daemon(DaemonError::Db(err)) => db_exit_code(err),
            CommandError::Daemon(DaemonError::Unsettled(_)) => EXIT_UNAVAILABLE,
            CommandError::Probe(err) => err.exit_code(),
            CommandError::Settings(_)
            | CommandError::Schema(_)
            | CommandError::Daemon(
                DaemonError::Settings(_)
                | DaemonError::Token(_)
                | DaemonError::Schema(_)
                | DaemonError::HttpClient(_)
                | DaemonError::Pooler(_)
                | DaemonError::HandlerConflict(_),
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

/// An outage is 69, never "not found", and so is an answer that says "not now" (a statement
/// timeout, a lock timeout, a deadlock, a full disk: the HTTP API's 503); settings the
/// database refuses (a wrong password, an unknown role, no such database) and a role without
/// the rights the command needs are a configuration error, 78; any other database error is a
/// runtime failure.
fn db_exit_code(err: &DbError) -> u8 {
    if err.is_unavailable() {
        EXIT_UNAVAILABLE
    } else if err.is_rejected() || err.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        EXIT_CONFIG
    } else if err.is_transient() {
        EXIT_UNAVAILABLE
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
        Command::Run { migrate, .. } => service::run(&config, migrate).await,
        Command::Migrate => service::migrate(&config).await,
        Command::Enqueue(args) => task::enqueue(&config, &args).await,
        Command::Graph { file, json } => graph::graph(&config, &file, json).await,
        Command::Batch(command) => batches::batch(&config, &command).await,
        Command::Wait(args) => wait::wait(&config, &args).await,
        Command::Status { id, json } => task::status(&config, id, json).await,
        Command::Cancel { id } => task::cancel(&config, id).await,
        Command::Analyze {
            workers,
            timeout,
            files,
        } => analyze::analyze(workers, timeout, &files).await,
        Command::Bench {
            mode,
            tasks,
            concurrency,
            producers,
            duration,
            rate,
            hold_snapshot,
            report_every,
            handler,
            max_running,
            json,
        } => {
            let soak = crate::bench::SoakOptions {
                rate,
                period: report_every,
                hold: hold_snapshot,
            };
            bench::bench(
                &config,
                mode,
                tasks,
                concurrency,
                producers,
                duration,
                soak,
                handler,
                max_running,
                json,
            )
            .await
        }
        Command::Completions { shell } => Ok(completions(shell)),
        Command::Man { dir } => Ok(man(dir.as_deref())),
        Command::CheckConfig { connect, .. } => service::check_config(&config, connect).await,
        Command::Pause { queue } => queues::pause(&config, &queue).await,
        Command::Resume { queue } => queues::resume(&config, &queue).await,
        Command::Retry {
            id: Some(id),
            with_dependents,
            ..
        } => queues::retry(&config, id, with_dependents).await,
        Command::Retry {
            queue: Some(queue_name),
            ..
        } => queues::retry_failed(&config, &queue_name).await,
        // clap asks for an id or --queue.
        Command::Retry { .. } => unreachable!("retry without an id or a queue"),
        Command::List(args) => queues::list(&config, &args).await,
        Command::Stats { json } => queues::stats(&config, json).await,
        Command::Probe { ready, timeout } => probe::probe(&config, ready, timeout).await,
        Command::Daemons { json } => daemons::daemons(&config, json).await,
        Command::Schedule(command) => schedules::schedule(&config, &command).await,
        Command::Queue(command) => queue_settings::queue(&config, &command).await,
    }
}

/// One session, as it comes, on which [`session`] checks the schema.
async fn connect(config: &Config) -> Result<tokio_postgres::Client, CommandError> {
    let settings = ConnectSettings::new(&config.database, "cli")?;
    Ok(settings.connect().await?)
}

/// One session for a one-shot command (`enqueue`, `status`, `cancel`, `retry`, `list`,
/// `stats`, `daemons`, `pause`, `resume`), on a schema checked to be this binary's, as `run` checks it:
/// a statement of another version's schema can succeed and mean something else (a function
/// whose arguments changed, a column added since), so the check comes first, not after a
/// failure. A missing, older or newer schema is a configuration error (78) with the hint.
async fn session(config: &Config) -> Result<tokio_postgres::Client, CommandError> {
    let client = connect(config).await?;
    migrate::check(&client).await?;
    Ok(client)
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
                CommandError::NoSuchParent("task depends on task 7, which does not exist".into()),
                EXIT_NOT_FOUND,
            ),
            (CommandError::NoSuchBatch(7), EXIT_NOT_FOUND),
            (
                CommandError::BatchRefused(BatchRefusal::Unknown("batch 7 does not exist".into())),
                EXIT_NOT_FOUND,
            ),
            (
                CommandError::BatchRefused(BatchRefusal::Sealed(
                    "batch 7 is sealed: no task can join it".into(),
                )),
                EXIT_TERMINAL,
            ),
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
            (DaemonError::Unsettled(3).into(), EXIT_UNAVAILABLE),
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
