//! `pgtaskd batch open|seal|status`: batches with a callback (schema 39, docs/dependencies.md,
//! "Batches"), as clap derive types. The command is `commands::batches`; the SQL is
//! `queue::batches`'s, which the HTTP API's `/batches` routes call too. Members join a batch
//! with `pgtaskd enqueue --batch ID`.

use clap::builder::TypedValueParser as _;
use clap::{Subcommand, ValueHint};

use crate::queue::batches::CallbackOn;

/// `pgtaskd batch ...`; exit 3 for a batch that does not exist.
#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// Open a batch and print its id: its callback, a task of --callback-queue with PAYLOAD,
    /// is WAITING until the batch is sealed and its last member has ended, then runs (--on
    /// finish: whatever they did; --on success: only if every member SUCCEEDED, else it is
    /// CANCELED). Members join it with `pgtaskd enqueue --batch ID`
    Open {
        /// The queue of the callback task
        #[arg(long, value_name = "Q", default_value = crate::config::DEFAULT_QUEUE,
              value_hint = ValueHint::Other, value_parser = super::parse_queue)]
        callback_queue: String,
        /// When the callback runs: success (only if every member SUCCEEDED) or finish
        /// (whatever they did)
        #[arg(long, value_name = "WHEN", required = true, value_parser = callback_on_parser())]
        on: CallbackOn,
        /// The callback task's payload
        #[arg(value_hint = ValueHint::Other)]
        payload: String,
    },
    /// Seal a batch: no task can join it any more, and it ends once its last member has ended
    /// (at once if they all have); print its state after: sealed or ended
    Seal {
        /// Batch id
        #[arg(value_hint = ValueHint::Other)]
        id: i64,
    },
    /// Print a batch: its state (open, sealed, ended), its callback task and that task's
    /// status, its members counted by status, and once ended the counts by outcome
    Status {
        /// Batch id
        #[arg(value_hint = ValueHint::Other)]
        id: i64,
        /// Print one JSON object, as GET /batches/{id} answers
        #[arg(long)]
        json: bool,
    },
}

/// `--on`: one of the two, named so that completions offer them.
fn callback_on_parser() -> impl clap::builder::TypedValueParser<Value = CallbackOn> {
    clap::builder::PossibleValuesParser::new(CallbackOn::NAMES)
        .try_map(|text: String| text.parse::<CallbackOn>())
}
