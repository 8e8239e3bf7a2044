//! The work a queue's tasks run: the built-in text analyzer (`text-stats`, the default of
//! every queue), a command the daemon starts per task ([`exec`]), or an HTTP endpoint it posts
//! each task to ([`http`]). Chosen per queue in the configuration's `[queues.NAME]` sections.
//!
//! Every handler answers with a [`Ran`]: the worker turns it into the claim's fenced finish,
//! so that a handler gets the guarantees the analyzer has (docs/design.md, "Handlers").
//!
//! | file | owns |
//! | --- | --- |
//! | `mod.rs` | what a handler is given ([`Job`]) and what it answers ([`Ran`], [`Failure`]) |
//! | `exec.rs` | one child process per task: stdin, bounded output, timeout, process group |
//! | `http.rs` | one `POST` per task over a shared keep-alive client |
//! | `http/answer.rs` | reading the answer: retry or not, `Retry-After`, the bounded body |

use std::time::Duration;

pub mod exec;
pub mod http;

/// What a handler is told about the task it runs (besides its payload): docs/handlers.md,
/// "What a handler is told".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: i64,
    /// The attempt this claim is, counted from 1 (a claim a shutdown gave back is not
    /// counted, so a re-run may be told the same attempt again).
    pub attempt: i32,
    pub queue: String,
    /// The claim's fencing token: unique per claim, never given twice.
    pub token: i64,
    /// How many times the task's work was started, this start included: grows with every
    /// start, never goes back.
    pub run: i32,
    /// The task's key: the same for every attempt and claim of the task, different for every
    /// task and database. The idempotency key of the task's side effects.
    pub key: String,
    /// The key the producer enqueued the task with, when it gave one.
    pub idempotency_key: Option<String>,
    /// The producer's W3C `traceparent`, when the row has one.
    pub traceparent: Option<String>,
    /// For a task with parents: `ID=STATUS` of its first 200 parents in id order, separated
    /// by commas (`12=SUCCEEDED,13=FAILED`), as the claim read them; `None` without.
    pub parents: Option<String>,
    /// How many parents the task has (0 without), all of them whatever `parents` lists.
    pub parent_count: i32,
    /// The progress an earlier attempt left (JSON text of an object, as the database prints
    /// it): the handler's checkpoint; `None` when none was written.
    pub progress: Option<String>,
    /// The batch the task is a member of, or whose callback it is (docs/dependencies.md,
    /// "Batches").
    pub batch: Option<i64>,
    /// For a batch's callback: its members by outcome, `succeeded=N,failed=N,canceled=N`.
    pub batch_counts: Option<String>,
}

/// What came of one run of a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// The handler succeeded; `output` is its answer (valid UTF-8, at most `max_output` bytes).
    Succeeded { output: String },
    /// The attempt failed.
    Failed(Failure),
    /// The handler asked to run later without using an attempt (exec: exit 75 with the delay
    /// as its first line of stdout; http: 202 with `Retry-After`); `None`: after the queue's
    /// backoff.
    Snoozed { after: Option<Duration> },
    /// The run was stopped because its cancellation token fired (a user's cancel or the abort
    /// phase of a shutdown), and the child or request is gone.
    Canceled,
}

/// A failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The task's `error`: what happened, in one text (exit status, last stderr bytes, HTTP
    /// status and body head...).
    pub message: String,
    /// Whether another attempt may succeed.
    pub retry: Retry,
    /// What kind of failure, for the metrics.
    pub kind: FailureKind,
}

/// Whether a failed attempt is worth another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// FAILED at once (exit 65, HTTP 400/404/410/422).
    Never,
    /// Retried while attempts remain, after the queue's backoff, or after `after` (an HTTP
    /// `Retry-After`) when given, capped at the queue's `max_backoff`.
    Later { after: Option<Duration> },
}

/// The kinds of failure `/metrics` counts (the label's value is [`FailureKind::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// exec: a non-zero exit status.
    Exit,
    /// exec: killed by a signal the daemon did not send.
    Signal,
    /// The handler's `timeout` passed.
    Timeout,
    /// http: a 4xx answer.
    Status4xx,
    /// http: a 5xx answer (or another non-2xx).
    Status5xx,
    /// http: no connection, or the connection broke; exec: the command could not be started.
    Unreachable,
    /// The output was not valid UTF-8 or was over `max_output`.
    Output,
    /// The daemon's own code running the handler panicked (a bug of pgtaskd's).
    Panic,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Exit => "exit",
            FailureKind::Signal => "signal",
            FailureKind::Timeout => "timeout",
            FailureKind::Status4xx => "status_4xx",
            FailureKind::Status5xx => "status_5xx",
            FailureKind::Unreachable => "unreachable",
            FailureKind::Output => "output",
            FailureKind::Panic => "panic",
        }
    }
}
