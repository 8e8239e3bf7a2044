//! The command line of docs/design.md, "Command line", as clap derive types. Parsing only;
//! the commands themselves live in [`crate::commands`].

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum, ValueHint};

use crate::queue::{OnDepFailure, RunAt, TaskStatus};

mod batches;
mod help;
mod queue;

pub use batches::BatchCommand;
pub use help::SUBCOMMAND_GROUPS;
pub use queue::{QueueCommand, QueueSetArgs};

/// What pgtaskd is, in one line: `-h`, and the manual page's NAME.
const ABOUT: &str = "A PostgreSQL task daemon: INSERT a task, and it runs your command or \
                     posts to your webhook (the built-in text analyzer is the default)";

/// What pgtaskd is, as `--help` and the manual page's DESCRIPTION say it.
const LONG_ABOUT: &str = "\
A PostgreSQL task daemon: applications INSERT tasks into the pgtaskd.tasks table (or submit
them with `pgtaskd enqueue` or POST /tasks), and the daemon runs each with its queue's
handler: exec starts your command with the payload on its standard input, http posts the
payload to your URL (a webhook), and the built-in text analyzer, every queue's default,
counts the payload's words, bytes and runes. The row is the single source of truth: a task's
status, output and error are read from the database. The handlers: docs/handlers.md; the
HTTP API: docs/http.md (installed in /usr/share/doc/pgtaskd/).";

/// The environment variables and exit codes, after every `--help`.
const AFTER_HELP: &str = "\
Environment:
  PGTASKD_CONFIG        the configuration file, when --config is not given
  PGTASKD_<SECTION>_<KEY>
                        any key of the file, e.g. PGTASKD_HTTP_LISTEN=127.0.0.1:8080,
                        PGTASKD_WORKER_QUEUES=default,mail; over the file, under the flags
                        (docs/configuration.md lists them all)
  PGTASKD_DATABASE_URL  the connection string; --database-url wins over it, it wins over the
                        file's database.url
  PGTASKD_LOG_FORMAT    text or json, over the file's log.format
  RUST_LOG              a tracing filter, over the file's log.level
  PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, PGSSLROOTCERT,
  PGCONNECT_TIMEOUT, PGTARGETSESSIONATTRS
                        libpq's, for whatever the connection string leaves unset

Exit codes:
  0   success
  1   runtime failure (for wait: a task FAILED or was CANCELED)
  2   usage error
  3   no such task (or batch)
  4   refused for the task's state: cancel of a finished task, retry of a task that is not
      FAILED or CANCELED; enqueue --batch of a sealed batch
  69  database unavailable
  75  wait timed out before every task finished
  78  configuration error: the file, the connection settings, settings the database refuses,
      or a schema to migrate";

/// The command line as `main` parses it and as the completions and manual pages describe it:
/// [`Cli`]'s, with the subcommands grouped in its help.
pub fn command() -> clap::Command {
    let cmd = Cli::command();
    let template = help::template(&cmd);
    cmd.help_template(template)
}

/// Parse the process's arguments with [`command`]; a usage error, `--help` or `--version`
/// ends the process as `Cli::parse` would.
pub fn parse() -> Cli {
    use clap::FromArgMatches as _;
    let mut matches = command().get_matches();
    Cli::from_arg_matches_mut(&mut matches).unwrap_or_else(|err| err.format(&mut command()).exit())
}

#[derive(Debug, Parser)]
#[command(
    name = "pgtaskd",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// Configuration file (default: $PGTASKD_CONFIG, else /etc/pgtaskd/pgtaskd.toml if it exists)
    #[arg(long, global = true, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub config: Option<PathBuf>,

    /// Database connection string, a libpq URL (postgresql://...) or key=value list; wins over
    /// $PGTASKD_DATABASE_URL, which wins over the file's database.url
    #[arg(long, global = true, value_name = "URL", value_hint = ValueHint::Other)]
    pub database_url: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon until SIGTERM or SIGINT
    #[command(after_help = AFTER_HELP)]
    Run {
        /// Apply pending migrations first
        #[arg(long)]
        migrate: bool,
        #[command(flatten)]
        settings: SettingFlags,
    },
    /// Apply the embedded schema migrations
    Migrate,
    /// Insert one task and print its id
    Enqueue(EnqueueArgs),
    /// Insert a graph of tasks that wait for one another, from a JSON file (- for standard
    /// input), in one transaction: parents first, a cycle refused and nothing inserted; print
    /// each task's ref and id (docs/dependencies.md)
    Graph {
        /// The graph: a JSON array of tasks, each {"ref", "payload", "after": [refs or ids], ...}
        #[arg(value_hint = ValueHint::FilePath)]
        file: String,
        /// Print one JSON array of {"ref", "id"}
        #[arg(long)]
        json: bool,
    },
    /// Batches of tasks with a callback that runs once, after the batch is sealed and its
    /// last member has ended: open, seal, status (docs/dependencies.md)
    #[command(subcommand)]
    Batch(BatchCommand),
    /// Print a task row
    Status {
        /// Task id
        #[arg(value_hint = ValueHint::Other)]
        id: i64,
        /// Print the row as JSON
        #[arg(long)]
        json: bool,
    },
    /// Wait until every task is finished, then print each as `status` does; exit 0 when all
    /// SUCCEEDED, 1 when any FAILED or was CANCELED, 3 for an unknown id, 75 at the timeout
    Wait(WaitArgs),
    /// Request cancellation of a task and print the resulting status
    Cancel {
        /// Task id
        #[arg(value_hint = ValueHint::Other)]
        id: i64,
    },
    /// Analyze files locally with the built-in text analyzer, without a database: one line
    /// `WORDS BYTES RUNES PATH` per file, in the order given
    Analyze {
        /// Files analyzed at once (default: the number of CPUs)
        #[arg(long, value_hint = ValueHint::Other, value_parser = clap::value_parser!(u32).range(1..))]
        workers: Option<u32>,
        /// Cancel the work still running after this long, e.g. "10s"
        #[arg(long, value_hint = ValueHint::Other, value_parser = parse_timeout)]
        timeout: Option<Duration>,
        /// The files; `-` reads standard input
        #[arg(required = true, value_name = "FILE", value_hint = ValueHint::FilePath)]
        files: Vec<PathBuf>,
    },
    /// Check the configuration as `run` would, print every section as it resolves, and exit
    CheckConfig {
        /// Also connect and check the schema version (exit 69 when unreachable, 78 when
        /// refused or the schema is missing or not this binary's)
        #[arg(long)]
        connect: bool,
        #[command(flatten)]
        settings: SettingFlags,
    },
    /// Print a shell completion script, e.g. `pgtaskd completions bash > /etc/bash_completion.d/pgtaskd`
    Completions {
        /// bash, elvish, fish, powershell or zsh
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `pgtaskd man > /usr/local/share/man/man1/pgtaskd.1`;
    /// with --dir, write pgtaskd.1 and a pgtaskd-SUBCOMMAND.1 for every subcommand there
    Man {
        /// Write every page into this directory (which must exist) instead of printing
        /// pgtaskd.1
        #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
        dir: Option<PathBuf>,
    },
    /// Run the text-stats benchmark workload against the configured database
    Bench {
        /// drain: a backlog inserted before the daemon starts; stream: 200 inserts while it
        /// runs; latency: 10 warm-up tasks then 200 one at a time, 20 ms apart; ceiling: the
        /// backlog claimed and finished by 4 sessions in batches of 500, no daemon, no
        /// analyzer, then the same backlog drained by the daemon, and the fraction; producers:
        /// single-row INSERT commits for --duration, with the daemon running, with the NOTIFY
        /// trigger and then without it, and the idle latency before and after; soak: a steady
        /// --rate for --duration with retention at 1m, figures every --report-every
        #[arg(long, value_enum)]
        mode: BenchMode,
        /// Tasks in the run (latency mode always runs 210; producers mode as many as commit)
        #[arg(long, default_value_t = 20_000, value_hint = ValueHint::Other, value_parser = clap::value_parser!(u32).range(1..))]
        tasks: u32,
        /// The daemon's worker.concurrency
        #[arg(long, default_value_t = 8, value_hint = ValueHint::Other, value_parser = clap::value_parser!(u32).range(1..))]
        concurrency: u32,
        /// Producers mode: the connections committing INSERTs
        #[arg(long, default_value_t = 64, value_hint = ValueHint::Other, value_parser = clap::value_parser!(u32).range(1..=1000))]
        producers: u32,
        /// Producers mode: how long each half (with the trigger, without it) runs, default 10s,
        /// at most 5m; soak mode: how long the producer runs, default 10m, at most 24h
        #[arg(long, value_hint = ValueHint::Other, value_parser = parse_bench_duration)]
        duration: Option<Duration>,
        /// Soak mode: tasks inserted per second (default: half of a short drain run first)
        #[arg(long, value_hint = ValueHint::Other, value_parser = parse_rate)]
        rate: Option<f64>,
        /// Soak mode: hold a REPEATABLE READ snapshot this long in the middle of the run
        #[arg(long, value_name = "DURATION", value_hint = ValueHint::Other, value_parser = parse_bench_duration)]
        hold_snapshot: Option<Duration>,
        /// Soak mode: the period of the figures, in whole seconds
        #[arg(long, default_value = "1m", value_name = "DURATION", value_hint = ValueHint::Other, value_parser = parse_report_every)]
        report_every: Duration,
        /// Drain mode: drain the same backlog again with a queue handler, in the same run:
        /// exec (`wc -c` per task) or http (a keep-alive server of the bench's own)
        #[arg(long, value_enum)]
        handler: Option<crate::bench::BenchHandler>,
        /// Limit the bench's queue to N tasks RUNNING at once
        /// (docs/limits.md), so that the figures show what a limited claim costs
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_running: Option<u32>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Stop daemons claiming from a queue (running tasks finish; enqueueing goes on)
    Pause {
        /// The queue
        #[arg(value_hint = ValueHint::Other, value_parser = parse_queue)]
        queue: String,
    },
    /// Let daemons claim from a paused queue again, at once
    Resume {
        /// The queue
        #[arg(value_hint = ValueHint::Other, value_parser = parse_queue)]
        queue: String,
    },
    /// Put a FAILED or CANCELED task back to QUEUED, as if new (attempt 0); exit 3 for an
    /// unknown id, 4 for a task that is not FAILED or CANCELED. With --queue Q --failed instead
    /// of an id: every FAILED task of queue Q, 10,000 per transaction; exit 3 for a queue
    /// without any task that is not paused either
    Retry {
        /// Task id
        #[arg(
            value_hint = ValueHint::Other,
            required_unless_present = "queue",
            conflicts_with = "queue"
        )]
        id: Option<i64>,
        /// Retry the FAILED tasks of this queue (with --failed)
        #[arg(long, value_hint = ValueHint::Other, value_parser = parse_queue, requires = "failed")]
        queue: Option<String>,
        /// With --queue: retry every FAILED task of the queue
        #[arg(long, requires = "queue", conflicts_with = "id")]
        failed: bool,
        /// With an id: also bring back every task the task's end canceled (a dependent under
        /// on_dep_failure cancel), and theirs; each waits again for its parents
        #[arg(long, requires = "id", conflicts_with = "queue")]
        with_dependents: bool,
    },
    /// Print the latest tasks, newest first
    List(ListArgs),
    /// Print per-queue figures and the daemons connected
    Stats {
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Probe the daemon's own HTTP listener (http.listen), with the token of http.token_file:
    /// exit 0 when GET /healthz (with --ready, /readyz) answers 200; else one line on standard
    /// error and 1 (another answer), 69 (no answer) or 78 (no http.listen, no token file)
    Probe {
        /// Ask /readyz (started, listener connected, database answering) instead of /healthz
        #[arg(long)]
        ready: bool,
        /// Give up after this long (exit 69)
        #[arg(long, default_value = "5s", value_parser = parse_timeout)]
        timeout: Duration,
    },
    /// Print the daemons running: instance, version, queues served, start, last heartbeat
    /// ("stale" when it stopped beating)
    Daemons {
        /// Print one JSON object per daemon, one per line
        #[arg(long)]
        json: bool,
    },
    /// Tasks made at instants (a cron expression in a time zone, or every N seconds), fired
    /// by whichever daemon looks first: add, list, remove, pause, resume (docs/schedules.md)
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// A queue's limits across every daemon (most RUNNING, most RUNNING per concurrency key,
    /// a rate of starts) and its tasks' defaults (attempts, retention): set, show
    /// (docs/limits.md)
    #[command(subcommand)]
    Queue(QueueCommand),
}

/// `pgtaskd schedule ...`; exit 3 for a schedule that does not exist.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Add a schedule, or replace the definition of one (its fires count from now on)
    Add(ScheduleArgs),
    /// Print the schedules with their next fire
    List {
        /// Print one JSON object per schedule, one per line
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule (the tasks it made stay)
    Remove {
        #[arg(value_parser = parse_schedule_name, value_hint = ValueHint::Other)]
        name: String,
    },
    /// Stop a schedule firing
    Pause {
        #[arg(value_parser = parse_schedule_name, value_hint = ValueHint::Other)]
        name: String,
    },
    /// Let a paused schedule fire again, from now on (what fell while it was paused is not
    /// made)
    Resume {
        #[arg(value_parser = parse_schedule_name, value_hint = ValueHint::Other)]
        name: String,
    },
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("rule").required(true).args(["cron", "every"])))]
pub struct ScheduleArgs {
    /// The schedule's name: 1 to 128 letters, digits and _ . : -
    #[arg(value_parser = parse_schedule_name, value_hint = ValueHint::Other)]
    pub name: String,
    /// A cron expression: five fields (minute hour day-of-month month day-of-week), an
    /// optional leading seconds field, or @hourly, @daily, @weekly, @monthly, @yearly
    #[arg(long, value_name = "EXPR", value_hint = ValueHint::Other)]
    pub cron: Option<String>,
    /// A period of whole seconds ("1s", "15m", "1h"): fires at its multiples since 1970 UTC
    #[arg(long, value_name = "DURATION", value_parser = parse_every, value_hint = ValueHint::Other)]
    pub every: Option<Duration>,
    /// The queue the tasks go to
    #[arg(long, default_value = "default", value_parser = parse_queue, value_hint = ValueHint::Other)]
    pub queue: String,
    /// The IANA time zone the cron expression is read in
    #[arg(long, default_value = "UTC", value_name = "ZONE", value_hint = ValueHint::Other)]
    pub tz: String,
    /// What fires no daemon made at their instant become: one task (coalesce), none (skip),
    /// or one each, the last 1,000 (catch-up)
    #[arg(long, default_value = "coalesce", value_parser = ["coalesce", "skip", "catch-up"])]
    pub missed: String,
    /// Make no task while the previous fire's task is QUEUED or RUNNING
    #[arg(long)]
    pub no_overlap: bool,
    /// The tasks' priority
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_hint = ValueHint::Other)]
    pub priority: i16,
    /// The payload of every task it makes
    #[arg(value_hint = ValueHint::Other)]
    pub payload: String,
}

/// A schedule name, by the rule of the table's `schedules_name`.
fn parse_schedule_name(text: &str) -> Result<String, String> {
    crate::schedule::check_name(text)?;
    Ok(text.to_string())
}

/// A schedule's period: whole seconds, from 1 s to 366 days.
fn parse_every(text: &str) -> Result<Duration, String> {
    let every = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    crate::schedule::Rule::new(None, Some(every), "UTC").map_err(|err| err.to_string())?;
    Ok(every)
}

/// The configuration keys `run` and `check-config` take as flags; each wins over its
/// `PGTASKD_<SECTION>_<KEY>` variable and the file, and is checked as the file's value is.
#[derive(Debug, Default, Clone, Args)]
pub struct SettingFlags {
    /// Where the HTTP server listens, HOST:PORT (http.listen; over $PGTASKD_HTTP_LISTEN)
    #[arg(long, value_name = "HOST:PORT", value_hint = ValueHint::Other)]
    pub http_listen: Option<String>,
    /// Tasks run at once (worker.concurrency; over $PGTASKD_WORKER_CONCURRENCY)
    #[arg(long, value_name = "N", value_hint = ValueHint::Other)]
    pub concurrency: Option<String>,
    /// Queues served, comma-separated (worker.queues; over $PGTASKD_WORKER_QUEUES)
    #[arg(long, value_name = "Q,Q...", value_hint = ValueHint::Other)]
    pub queues: Option<String>,
}

impl SettingFlags {
    /// Each flag given, with its dashes, and its value, as [`crate::config::Overlay`] takes
    /// them.
    pub fn given(&self) -> Vec<(&'static str, String)> {
        [
            ("--http-listen", &self.http_listen),
            ("--concurrency", &self.concurrency),
            ("--queues", &self.queues),
        ]
        .into_iter()
        .filter_map(|(flag, value)| Some((flag, value.clone()?)))
        .collect()
    }
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this queue
    #[arg(long, value_name = "Q", value_hint = ValueHint::Other, value_parser = parse_queue)]
    pub queue: Option<String>,
    /// Only this status: waiting, queued, running, succeeded, failed or canceled
    #[arg(long, value_name = "S", ignore_case = true, value_parser = status_parser())]
    pub status: Option<TaskStatus>,
    /// Only tasks with this tag (repeat it: tasks with every one)
    #[arg(long = "tag", value_name = "TAG", value_hint = ValueHint::Other, value_parser = parse_tag)]
    pub tags: Vec<String>,
    /// Only tasks whose metadata has this key with this string value (repeat it, each KEY
    /// once: tasks with every one)
    #[arg(long = "meta", value_name = "KEY=VALUE", value_hint = ValueHint::Other, value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    /// At most this many tasks
    #[arg(long, value_name = "N", default_value_t = 20, value_hint = ValueHint::Other,
          value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub limit: i64,
    /// Only tasks older than this one (lower ids): the next page after a list that ended
    /// there
    #[arg(long, value_name = "ID", value_hint = ValueHint::Other)]
    pub after: Option<i64>,
    /// Print one JSON object per line
    #[arg(long)]
    pub json: bool,
}

/// A task status, in any case.
/// The six statuses, named as `--status` takes them, so that completions offer them.
fn status_parser() -> impl clap::builder::TypedValueParser<Value = TaskStatus> {
    clap::builder::PossibleValuesParser::new([
        "waiting",
        "queued",
        "running",
        "succeeded",
        "failed",
        "canceled",
    ])
    .try_map(|text: String| text.to_ascii_uppercase().parse::<TaskStatus>())
}

/// `pgtaskd bench --mode`; [`crate::commands`] turns it into the bench's own mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchMode {
    Drain,
    Stream,
    Latency,
    Ceiling,
    Producers,
    Soak,
}

/// The longest `pgtaskd bench --duration` (soak mode; producers mode takes at most
/// [`crate::bench::PRODUCERS_DURATION_MAX`]).
const BENCH_DURATION_MAX: Duration = Duration::from_secs(24 * 3600);

/// A positive duration of at most [`BENCH_DURATION_MAX`], such as "10s".
fn parse_bench_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    if duration.is_zero() || duration > BENCH_DURATION_MAX {
        return Err("the duration must be longer than zero and at most 24h".to_string());
    }
    Ok(duration)
}

/// A whole number of seconds, at least one, such as "1m" or "5s".
fn parse_report_every(text: &str) -> Result<Duration, String> {
    let duration = parse_bench_duration(text)?;
    if duration.subsec_nanos() != 0 {
        return Err("the period must be a whole number of seconds".to_string());
    }
    Ok(duration)
}

/// A positive number of tasks per second, at most 1,000,000.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if (1.0..=1e6).contains(&rate) => Ok(rate),
        _ => Err("the rate must be a number of tasks per second from 1 to 1000000".to_string()),
    }
}

/// A positive duration such as "250ms" or "10s", of at most 100 years.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    if duration.is_zero() || duration > crate::config::DURATION_MAX {
        return Err("the timeout must be longer than zero and at most 100 years".to_string());
    }
    Ok(duration)
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The task's payload, the text its queue's handler is given; `-` reads standard input
    #[arg(conflicts_with = "file", required_unless_present = "file", value_hint = ValueHint::Other)]
    pub text: Option<String>,
    /// Read the text from this file
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub file: Option<PathBuf>,
    /// The queue to put it in (1 to 128 bytes)
    #[arg(long, default_value = crate::config::DEFAULT_QUEUE, value_hint = ValueHint::Other, value_parser = parse_queue)]
    pub queue: String,
    /// Higher is claimed first, -32768 to 32767 (default 0)
    #[arg(long, allow_negative_numbers = true, value_hint = ValueHint::Other, value_parser = parse_priority)]
    pub priority: Option<i16>,
    /// Not claimed before this: an RFC 3339 time ("2026-12-01T08:00:00Z") or a delay ("10m")
    #[arg(long, value_name = "TIME|DELAY", value_hint = ValueHint::Other, value_parser = parse_run_at)]
    pub run_at: Option<RunAt>,
    /// Lost leases allowed before the task fails, at least 1 (default: the queue's
    /// --max-attempts setting, else 3)
    #[arg(long, value_hint = ValueHint::Other, value_parser = parse_max_attempts)]
    pub max_attempts: Option<i32>,
    /// Idempotency key, unique per queue: enqueueing again with it prints the first task's id
    /// (1 to 255 visible ASCII characters)
    #[arg(long, value_name = "K", value_hint = ValueHint::Other, value_parser = parse_key)]
    pub key: Option<String>,
    /// The key its queue's --max-running-per-key counts by, such as a tenant (at most 256
    /// bytes)
    #[arg(long, value_name = "KEY", value_hint = ValueHint::Other, value_parser = parse_concurrency_key)]
    pub concurrency_key: Option<String>,
    /// A label to find the task by (`list --tag`): a letter or digit, then up to 62 letters,
    /// digits and _ . : - (repeat it, at most 16)
    #[arg(long = "tag", value_name = "TAG", value_hint = ValueHint::Other, value_parser = parse_tag)]
    pub tags: Vec<String>,
    /// A key and string value of the task's metadata, a JSON object to find it by (`list
    /// --meta`): repeat it, each KEY once; at most 8 KiB in all
    #[arg(long = "meta", value_name = "KEY=VALUE", value_hint = ValueHint::Other, value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    /// Wait for this task, enqueued before it: the task is WAITING until every task named so
    /// has ended (repeat it, or give ids separated by commas; at most 10,000)
    #[arg(long, value_name = "ID", value_delimiter = ',', value_hint = ValueHint::Other)]
    pub after: Vec<i64>,
    /// What a task of --after that ends FAILED or CANCELED does to this one: cancel it (the
    /// default), run it anyway, or wait for a retry of that task to succeed
    #[arg(long, value_name = "POLICY", requires = "after", value_parser = on_dep_failure_parser())]
    pub on_dep_failure: Option<OnDepFailure>,
    /// Make the task a member of this batch (`pgtaskd batch open`), which must exist and not
    /// be sealed
    #[arg(long, value_name = "ID", value_hint = ValueHint::Other)]
    pub batch: Option<i64>,
    /// Then wait until the task is finished, as `pgtaskd wait` does
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long (exit 75), e.g. "30s"
    #[arg(long, requires = "wait", value_hint = ValueHint::Other, value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// With --wait: print the finished row as JSON
    #[arg(long, requires = "wait")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Task ids
    #[arg(required = true, value_name = "ID", value_hint = ValueHint::Other)]
    pub ids: Vec<i64>,
    /// Give up after this long (exit 75), e.g. "30s"; default: wait as long as it takes
    #[arg(long, value_hint = ValueHint::Other, value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// Print each row as one line of JSON
    #[arg(long)]
    pub json: bool,
}

/// A queue name, by the rule the HTTP API and the table apply.
fn parse_queue(text: &str) -> Result<String, String> {
    crate::queue::enqueue::check_queue_name(text).map_err(|err| err.to_string())?;
    Ok(text.to_string())
}

/// An idempotency key, by the rule the HTTP API applies to `Idempotency-Key`.
fn parse_key(text: &str) -> Result<String, String> {
    crate::queue::enqueue::check_idempotency_key(text).map_err(|err| err.to_string())?;
    Ok(text.to_string())
}

/// `--on-dep-failure`: one of the three policies, named so that completions offer them.
fn on_dep_failure_parser() -> impl clap::builder::TypedValueParser<Value = OnDepFailure> {
    clap::builder::PossibleValuesParser::new(OnDepFailure::NAMES)
        .try_map(|text: String| text.parse::<OnDepFailure>())
}

/// A tag, by the rule the HTTP API applies to `tags` and the table's `tasks_tags_check`.
fn parse_tag(text: &str) -> Result<String, String> {
    crate::queue::enqueue::check_tag(text).map_err(|err| err.to_string())?;
    Ok(text.to_string())
}

/// A metadata term, `KEY=VALUE` (split at the first `=`).
fn parse_meta(text: &str) -> Result<(String, String), String> {
    crate::queue::enqueue::parse_meta_term(text, '=').map_err(|err| err.to_string())
}

/// A concurrency key, by the rule the HTTP API applies to `concurrency_key`.
fn parse_concurrency_key(text: &str) -> Result<String, String> {
    crate::queue::enqueue::check_concurrency_key(text).map_err(|err| err.to_string())?;
    Ok(text.to_string())
}

/// An RFC 3339 time, or a delay such as "10m" counted from the database's clock, by the rule
/// the HTTP API applies to `run_at`.
fn parse_run_at(text: &str) -> Result<RunAt, String> {
    crate::queue::enqueue::parse_run_at(text).map_err(|err| err.to_string())
}

/// A priority, by the rule the HTTP API applies to `priority`.
fn parse_priority(text: &str) -> Result<i16, String> {
    let number = text
        .parse::<i64>()
        .map_err(|_| crate::queue::enqueue::BadInput::Priority.to_string())?;
    crate::queue::enqueue::check_priority(number).map_err(|err| err.to_string())
}

/// A number of attempts, by the rule the HTTP API applies to `max_attempts`.
fn parse_max_attempts(text: &str) -> Result<i32, String> {
    let number = text
        .parse::<i64>()
        .map_err(|_| crate::queue::enqueue::BadInput::MaxAttempts.to_string())?;
    crate::queue::enqueue::check_max_attempts(number).map_err(|err| err.to_string())
}
