//! `pgtaskd queue set|show`: a queue's limits and defaults (docs/limits.md), as clap derive
//! types. The command is `commands::queue_settings`; the rules of each value are
//! `queue::settings`'s, which the HTTP API applies too.

use std::time::Duration;

use clap::{Args, Subcommand, ValueHint};

use crate::queue::settings::{self, Setting};

/// `pgtaskd queue ...`.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Set a queue's limits and defaults; the options not given stay as they are, `none`
    /// removes one; prints the settings in force
    Set(QueueSetArgs),
    /// Print a queue's settings and its RUNNING and QUEUED tasks now
    Show {
        /// The queue
        #[arg(value_hint = ValueHint::Other, value_parser = super::parse_queue)]
        queue: String,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("setting")
        .required(true)
        .multiple(true)
        .args(["max_running", "max_running_per_key", "rate", "max_attempts", "retain"])
))]
pub struct QueueSetArgs {
    /// The queue (it need not have a task yet)
    #[arg(value_hint = ValueHint::Other, value_parser = super::parse_queue)]
    pub queue: String,
    /// At most N of its tasks RUNNING at once, across every daemon; `none` removes it
    #[arg(long, value_name = "N|none", value_hint = ValueHint::Other, value_parser = parse_max_running)]
    pub max_running: Option<Setting<i32>>,
    /// At most N RUNNING at once per concurrency_key (tasks without one are limited by
    /// --max-running only); `none` removes it
    #[arg(long, value_name = "N|none", value_hint = ValueHint::Other, value_parser = parse_max_running_per_key)]
    pub max_running_per_key: Option<Setting<i32>>,
    /// At most N starts in any window of DURATION (1ms to 1day), e.g. "10/1s"; `none` removes
    /// it
    #[arg(long, value_name = "N/DURATION|none", value_hint = ValueHint::Other, value_parser = parse_rate)]
    pub rate: Option<Setting<(i32, Duration)>>,
    /// The attempts of its tasks inserted without their own (else 3); `none` removes it
    #[arg(long, value_name = "N|none", value_hint = ValueHint::Other, value_parser = parse_max_attempts)]
    pub max_attempts: Option<Setting<i32>>,
    /// How long its finished tasks are kept, instead of retention.finished_after, e.g. "30d"
    /// (at least 1s); `none` removes it
    #[arg(long, value_name = "DURATION|none", value_hint = ValueHint::Other, value_parser = parse_retain)]
    pub retain: Option<Setting<Duration>>,
}

impl QueueSetArgs {
    /// The change the options ask for.
    pub fn change(&self) -> settings::Change {
        settings::Change {
            max_running: self.max_running,
            max_running_per_key: self.max_running_per_key,
            rate: self.rate,
            max_attempts: self.max_attempts,
            retain: self.retain,
        }
    }
}

/// `none`, or what `parse` makes of `text`.
fn setting<T>(
    text: &str,
    parse: impl FnOnce(&str) -> Result<T, settings::BadSetting>,
) -> Result<Setting<T>, String> {
    if text == "none" {
        return Ok(Setting::Remove);
    }
    parse(text).map(Setting::Set).map_err(|err| err.to_string())
}

/// A count: an integer from 1, named `name` in the error.
fn count(name: &'static str, text: &str) -> Result<Setting<i32>, String> {
    setting(text, |text| {
        let n = text
            .parse::<i64>()
            .map_err(|_| settings::BadSetting::Count(name))?;
        settings::check_count(name, n)
    })
}

fn parse_max_running(text: &str) -> Result<Setting<i32>, String> {
    count("--max-running", text)
}

fn parse_max_running_per_key(text: &str) -> Result<Setting<i32>, String> {
    count("--max-running-per-key", text)
}

fn parse_max_attempts(text: &str) -> Result<Setting<i32>, String> {
    count("--max-attempts", text)
}

fn parse_rate(text: &str) -> Result<Setting<(i32, Duration)>, String> {
    setting(text, settings::parse_rate)
}

fn parse_retain(text: &str) -> Result<Setting<Duration>, String> {
    setting(text, settings::parse_retain)
}
