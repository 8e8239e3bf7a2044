//! pgtaskd: a PostgreSQL task daemon for text analysis.
//!
//! Producers `INSERT` into `pgtaskd.tasks`; a statement-level trigger sends
//! `NOTIFY pgtaskd_tasks`; the daemon's listener wakes the worker, which claims tasks with a
//! conditional `UPDATE`, runs the analyzer, and commits the terminal status together with the
//! results in one fenced `UPDATE`. The row is the single source of truth.
//!
//! Module map, in the order data flows (docs/design.md, "Data flow"):
//!
//! | module | owns |
//! | --- | --- |
//! | [`config`] | the TOML configuration, validated, with its defaults |
//! | [`db`] | connecting as libpq would, migrations, the dedicated LISTEN connection |
//! | [`queue`] | the task table's operations: enqueue, claim, finish, release, heartbeat, cancel, read, wait, pause, retry, list, stats |
//! | `completer` | every write after the analyzer: batched finishes, releases, and re-reading a row whose commit outcome is unknown |
//! | [`schedule`] | schedules: cron and periodic rules, their instants, and the table that decides who fires each |
//! | [`maintenance`] | the periodic services beside the worker: the rescuer of expired leases, the scheduler, retention, the daemon's own `VACUUM`, the vacuum-health watch |
//! | [`worker`] | wake -> intake room -> claim -> permit -> analyze -> finish, and the two-phase stop; its [`worker::intake`] sizes the claims: the free workers, and more for fast tasks |
//! | [`progress`] | what running handlers report of their work: checked lines, the latest per task in memory, written at most once a second per task, fenced by the claim |
//! | [`analyzer`] | words, bytes and runes: pure, cancellable |
//! | [`batch`] | `pgtaskd analyze`: the bounded executor over local files |
//! | [`daemon`] | `pgtaskd run`: wiring and ordered shutdown |
//! | `health` | readiness, and the systemd notifications (READY, STOPPING, WATCHDOG, STATUS) |
//! | `http` | the optional HTTP server: task API, health, metrics |
//! | [`metrics`] | Prometheus metrics |
//! | [`shutdown`] | signals -> stop and hurry tokens |
//! | `backoff` | capped, jittered retry delays |
//! | `repeats` | a failure that repeats logged once at WARN, then at DEBUG, and its recovery once |
//! | [`mod@bench`] | `pgtaskd bench`: the text-stats workload and its figures |
//! | [`process`] | `pgtaskd run` as a child process, for the bench and the integration tests |
//! | [`privileges`] | the process made non-dumpable at start; who an `exec` queue's children run as (`user`, `group`) and whether the daemon may switch them |
//! | [`events`] | the messages of the log events that the bench and the tests read back |
//! | [`cli`], [`commands`] | the command line and its exit codes |

pub mod analyzer;
pub(crate) mod backoff;
pub mod batch;
pub mod bench;
pub mod cli;
pub mod commands;
pub(crate) mod completer;
pub mod config;
pub mod daemon;
pub mod db;
pub mod events;
pub mod handler;
pub(crate) mod health;
pub(crate) mod http;
pub mod maintenance;
pub mod metrics;
pub mod privileges;
pub mod process;
pub mod progress;
pub mod queue;
pub(crate) mod repeats;
pub mod schedule;
pub mod shutdown;
pub mod worker;

/// An error and its sources, joined by ": ": the one line a log or standard error shows.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}
