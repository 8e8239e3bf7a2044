//! `pgtaskd schedule add|list|remove|pause|resume`: the schedules of `pgtaskd.schedules`
//! (docs/schedules.md). Called by `dispatch`.

use std::process::ExitCode;

use crate::cli::{ScheduleArgs, ScheduleCommand};
use crate::config::Config;
use crate::schedule::store::{self, NewSchedule, Schedule};

use super::daemons::aligned;
use super::queues::printable;
use super::{checked, session, CommandError};

pub(super) async fn schedule(
    config: &Config,
    command: &ScheduleCommand,
) -> Result<ExitCode, CommandError> {
    match command {
        ScheduleCommand::Add(args) => add(config, args).await,
        ScheduleCommand::List { json } => list(config, *json).await,
        ScheduleCommand::Remove { name } => {
            let client = session(config).await?;
            if !checked(&client, store::remove(&client, name)).await? {
                return Err(CommandError::NoSuchSchedule(name.clone()));
            }
            println!("schedule {name} removed");
            Ok(ExitCode::SUCCESS)
        }
        ScheduleCommand::Pause { name } => set_paused(config, name, true).await,
        ScheduleCommand::Resume { name } => set_paused(config, name, false).await,
    }
}

async fn add(config: &Config, args: &ScheduleArgs) -> Result<ExitCode, CommandError> {
    let schedule = NewSchedule {
        name: args.name.clone(),
        cron: args.cron.clone(),
        every: args.every,
        tz: args.tz.clone(),
        queue: args.queue.clone(),
        payload: args.payload.clone(),
        priority: args.priority,
        missed: args.missed.parse().map_err(CommandError::Usage)?,
        no_overlap: args.no_overlap,
        paused: None,
    };
    schedule.check().map_err(CommandError::Usage)?;
    let client = session(config).await?;
    let created = checked(&client, store::put(&client, &schedule)).await?;
    let added = checked(&client, store::get(&client, &schedule.name)).await?;
    let next = added
        .and_then(|s| s.next_fire)
        .map_or_else(|| "never".to_string(), |next| next.to_rfc3339());
    println!(
        "schedule {} {}; next fire {next}",
        schedule.name,
        if created { "added" } else { "replaced" }
    );
    Ok(ExitCode::SUCCESS)
}

async fn list(config: &Config, json: bool) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let (schedules, _) = checked(&client, store::list(&client)).await?;
    if json {
        for schedule in &schedules {
            println!("{}", serde_json::to_string(schedule)?);
        }
    } else {
        print!("{}", describe(&schedules));
    }
    Ok(ExitCode::SUCCESS)
}

async fn set_paused(config: &Config, name: &str, paused: bool) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    if !checked(&client, store::set_paused(&client, name, paused)).await? {
        return Err(CommandError::NoSuchSchedule(name.to_string()));
    }
    println!(
        "schedule {name} {}",
        if paused { "paused" } else { "resumed" }
    );
    Ok(ExitCode::SUCCESS)
}

/// One line per schedule, each column as wide as its widest value, or a line saying there is
/// none.
fn describe(schedules: &[Schedule]) -> String {
    if schedules.is_empty() {
        return "no schedule\n".to_string();
    }
    let mut lines = vec![[
        "NAME".to_string(),
        "RULE".to_string(),
        "QUEUE".to_string(),
        "MISSED".to_string(),
        "NEXT FIRE".to_string(),
        "LAST FIRE".to_string(),
    ]];
    for schedule in schedules {
        let rule = match (&schedule.cron, &schedule.every) {
            (Some(cron), _) => format!("cron {cron} {}", schedule.tz),
            (None, Some(every)) => format!("every {every}"),
            (None, None) => String::new(),
        };
        let missed = if schedule.no_overlap {
            format!("{} no-overlap", schedule.missed)
        } else {
            schedule.missed.clone()
        };
        let next = if schedule.paused {
            "paused".to_string()
        } else if let Some(error) = &schedule.error {
            format!("never: {error}")
        } else {
            schedule.next_fire.map_or_else(
                || "never".to_string(),
                |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            )
        };
        let last = schedule.last_fire.map_or_else(
            || "-".to_string(),
            |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        );
        lines.push([
            schedule.name.clone(),
            printable(&rule),
            printable(&schedule.queue),
            missed,
            next,
            last,
        ]);
    }
    aligned(&lines)
}
