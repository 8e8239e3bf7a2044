//! `pgtaskd queue set` and `pgtaskd queue show`: a queue's limits and defaults
//! (docs/limits.md), through `queue::settings`. Called by `dispatch`.
//!
//! The options were checked by the parser (exit 2, before connecting); a database outage is
//! 69 as for every command, never "no such queue": a queue need not exist to have settings.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::cli::{QueueCommand, QueueSetArgs};
use crate::config::Config;
use crate::queue::settings::{self, Limits};

use super::queues::printable;
use super::{checked, session, CommandError};

pub(super) async fn queue(
    config: &Config,
    command: &QueueCommand,
) -> Result<ExitCode, CommandError> {
    match command {
        QueueCommand::Set(args) => set(config, args).await,
        QueueCommand::Show { queue, json } => show(config, queue, *json).await,
    }
}

/// Apply the options given, then print the settings in force.
async fn set(config: &Config, args: &QueueSetArgs) -> Result<ExitCode, CommandError> {
    let change = args.change();
    if change.is_empty() {
        // clap requires one; said again here for callers that build the arguments.
        return Err(CommandError::Usage(
            settings::BadSetting::Nothing.to_string(),
        ));
    }
    let client = session(config).await?;
    let now = checked(&client, settings::set(&client, &args.queue, &change)).await?;
    println!(
        "queue {}: {}",
        printable(&now.queue),
        describe_limits(&now.limits)
    );
    Ok(ExitCode::SUCCESS)
}

/// Print the settings and the RUNNING and QUEUED tasks now.
async fn show(config: &Config, queue_name: &str, json: bool) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let shown = checked(&client, settings::show(&client, queue_name)).await?;
    if json {
        println!("{}", serde_json::to_string(&shown)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!("queue {}\n", printable(&shown.queue));
    let limits = &shown.limits;
    let or_none = |value: Option<String>| value.unwrap_or_else(|| "none".to_string());
    let rows = [
        (
            "max running",
            or_none(limits.max_running.map(|n| n.to_string())),
        ),
        (
            "max running per key",
            or_none(limits.max_running_per_key.map(|n| n.to_string())),
        ),
        (
            "rate",
            or_none(
                limits
                    .rate_limit
                    .zip(limits.rate_period)
                    .map(|(n, period)| format!("{n}/{}", humantime::format_duration(period))),
            ),
        ),
        (
            "max attempts",
            limits
                .max_attempts
                .map_or_else(|| "none (3)".to_string(), |n| n.to_string()),
        ),
        (
            "retain",
            limits.retain.map_or_else(
                || "none (retention.finished_after)".to_string(),
                |d| humantime::format_duration(d).to_string(),
            ),
        ),
        ("running", shown.running.to_string()),
        ("queued", shown.queued.to_string()),
    ];
    for (name, value) in rows {
        let _ = writeln!(text, "  {:<20} {value}", format!("{name}:"));
    }
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// The settings on one line, "no settings" for none.
fn describe_limits(limits: &Limits) -> String {
    if limits.is_empty() {
        "no settings".to_string()
    } else {
        limits.describe()
    }
}
