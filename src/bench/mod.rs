//! `pgtaskd bench`: the text-stats workload in docs/benchmark.md against the configured
//! database, with the daemon as a `pgtaskd run` process of its own, so that its CPU seconds
//! and peak RSS are measured apart from the producer. Called by [`crate::commands`].
//!
//! Each run uses a queue of its own (`bench-<pid>`), removes its rows before and after, and
//! refuses to report a run whose table totals differ from the workload's check totals.
//!
//! Latency mode runs the daemon with its worker's debug events as JSON on a pipe: the time
//! of each task's [`crate::events::ANALYZER_RUN`] event, taken by the daemon just before the
//! analyzer starts, ends that task's latency. Before the daemon starts, the same inserts are
//! timed to a `LISTEN` session of the bench's own: the notify floor, the part of the latency
//! that the INSERT's commit and the notification's delivery take, which no daemon woken by
//! `NOTIFY` goes under.
//!
//! Ceiling mode runs no daemon: several sessions of the bench's own claim and finish the
//! backlog through pgtaskd's claim and finish functions, with counts computed beforehand;
//! then, in the same run, the daemon drains a backlog of the same size, so that the report
//! gives drain as a fraction of what the database itself reaches. Drain and ceiling modes
//! also report the WAL written per task and the CPU time of the server backends that served
//! the run. Producers
//! mode measures the other side: single-row INSERT commits per second with the daemon
//! running, with the table's NOTIFY trigger and without it, between two measurements of the
//! idle latency as latency mode takes it (with the notify floor first). Soak mode runs a
//! steady producer for minutes or hours, with retention on, and reports per period what the
//! table does.
//!
//! The modules, from the top down; each uses only those below it:
//!
//! | module | owns |
//! | --- | --- |
//! | `run` | one run: the mode dispatched, the figures, the totals check |
//! | `ceiling` | ceiling mode: claim and finish with no daemon |
//! | `producers` | producers mode: INSERT commits with and without the trigger |
//! | `soak` | soak mode: a steady producer, the table's size and health per period, a held snapshot |
//! | `timing` | one task at a time: its latency to the analyzer's start, the notify floor |
//! | `handlers` | drain mode's second drain by an `exec` or `http` handler, and the spawn floor |
//! | `daemon` | the daemon under test, a child process |
//! | `table` | the task table: insert, wait until done, the last finish, delete, vacuum; the WAL position |
//! | `report` | the [`Report`] and its text form |
//! | `proc` | CPU time and peak RSS from `/proc` |
//! | `sql` | every statement the bench sends |
//! | [`workload`] | the tasks' texts and their check totals |

mod ceiling;
mod daemon;
mod handlers;
mod proc;
mod producers;
mod report;
mod run;
mod soak;
mod sql;
mod table;
mod timing;
pub mod workload;

use std::time::Duration;

use serde::Serialize;

use crate::db::{migrate, DbError};

pub use handlers::{BenchHandler, HandlerRun};
pub use report::{Enqueue, Hold, Latency, Period, Producers, Report, Soak, Summary};
pub use run::run;
pub use soak::{SoakOptions, SOAK_RETENTION};

/// How often the producer looks at the table while it waits.
const POLL: Duration = Duration::from_millis(20);
/// The longest a run may take before it is abandoned.
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// Latency mode: warm-up tasks, measured tasks, and the gap between two inserts.
const WARM_UP: usize = 10;
const LATENCY_TASKS: usize = 200;
/// Latency mode runs exactly its warm-up and measured tasks.
pub const LATENCY_MODE_TASKS: u32 = (WARM_UP + LATENCY_TASKS) as u32;
const LATENCY_GAP: Duration = Duration::from_millis(20);
/// Latency mode: the longest the floor measurement waits for one notification.
const NOTIFY_WAIT: Duration = Duration::from_secs(5);
/// Stream mode: statements, each of `tasks / STREAM_STATEMENTS` rows.
const STREAM_STATEMENTS: usize = 200;
/// Ceiling mode: the sessions, and the most tasks one claim takes.
const CEILING_SESSIONS: usize = 4;
const CEILING_BATCH: usize = 500;
/// Producers mode: the most tasks one run inserts, both halves together.
const PRODUCER_LIMIT: u32 = 1_000_000;
/// Producers mode: the default and the longest `--duration`.
pub const PRODUCERS_DURATION: Duration = Duration::from_secs(10);
pub const PRODUCERS_DURATION_MAX: Duration = Duration::from_secs(300);
/// Soak mode: the default `--duration`.
pub const SOAK_DURATION: Duration = Duration::from_secs(600);
/// Drain and ceiling modes: how long the WAL written by others is sampled before the run.
const WAL_BACKGROUND: Duration = Duration::from_millis(500);
/// How long the idle daemon's CPU use is sampled.
const IDLE_SAMPLE: Duration = Duration::from_secs(3);

/// How the load reaches the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A backlog inserted before the daemon starts.
    Drain,
    /// 200 inserts, each of an equal share of the tasks, while it runs.
    Stream,
    /// Warm-up tasks, then one at a time, 20 ms apart, each timed to its analyzer's start.
    Latency,
    /// A backlog claimed and finished by the bench's own sessions, no daemon, no analyzer.
    Ceiling,
    /// Single-row INSERT commits while the daemon runs, with the NOTIFY trigger and without;
    /// the idle latency before and after, and the notify floor.
    Producers,
    /// A steady producer for a long time, retention on, figures per period.
    Soak,
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct BenchOptions {
    pub mode: Mode,
    pub tasks: u32,
    pub concurrency: usize,
    /// Producers mode: the connections committing INSERTs.
    pub producers: usize,
    /// Producers mode: how long each half runs; soak mode: how long the producer runs.
    pub duration: Duration,
    /// Soak mode: the rate, the period, the held snapshot.
    pub soak: SoakOptions,
    /// Drain mode: drain the backlog again with this handler, in the same run.
    pub handler: Option<BenchHandler>,
    /// Drain and ceiling modes: the bench's queue's `max_running` (docs/limits.md).
    pub max_running: Option<u32>,
}

/// Why a run has no result.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Schema(#[from] migrate::SchemaError),
    #[error("cannot start the daemon: {0}")]
    Daemon(String),
    #[error("refusing to report: the table holds {found:?} (words, bytes, runes) and {succeeded} SUCCEEDED rows; the workload's check totals are {expected:?} over {tasks} tasks")]
    Totals {
        found: (i64, i64, i64),
        expected: (i64, i64, i64),
        succeeded: i64,
        tasks: u32,
    },
    #[error("the run did not finish within {0:?}")]
    TooLong(Duration),
    #[error("the bench's own LISTEN session received no notification within {NOTIFY_WAIT:?} of an insert")]
    NoNotification,
    #[error("the daemon logged no analyzer start for task {0}")]
    NoStart(i64),
    #[error("a bench session failed: {0}")]
    Session(String),
    #[error("the ceiling's finish of task {0} matched no claim of its own")]
    Lost(i64),
}

impl From<tokio_postgres::Error> for BenchError {
    fn from(err: tokio_postgres::Error) -> Self {
        BenchError::Db(err.into())
    }
}
