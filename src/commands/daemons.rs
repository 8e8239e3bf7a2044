//! `pgtaskd daemons`: the daemons running, as `pgtaskd.daemons` records them (instance,
//! version, queues served, start, last heartbeat, "stale" for those that stopped beating).
//! Called by `dispatch`.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::config::Config;
use crate::queue::daemons::{self, Registered};

use super::queues::printable;
use super::{checked, session, CommandError};

/// Print every daemon recorded, oldest start first; exit 0 also when there is none.
pub(super) async fn daemons(config: &Config, json: bool) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let rows = checked(&client, daemons::list(&client)).await?;
    if json {
        for row in &rows {
            println!("{}", serde_json::to_string(row)?);
        }
    } else {
        print!("{}", describe(&rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// The human form: one line per daemon, or a line saying there is none.
fn describe(rows: &[Registered]) -> String {
    if rows.is_empty() {
        return "no daemon connected\n".to_string();
    }
    let mut text = format!(
        "{:<32} {:<10} {:<20}  {:<20}  {}\n",
        "INSTANCE", "VERSION", "QUEUES", "STARTED", "LAST HEARTBEAT"
    );
    for row in rows {
        let queues: Vec<String> = row.queues.iter().map(|q| printable(q)).collect();
        let beat = if row.stale {
            format!("{:.1}s ago (stale)", row.heartbeat_age_s.max(0.0))
        } else {
            format!("{:.1}s ago", row.heartbeat_age_s.max(0.0))
        };
        let _ = writeln!(
            text,
            "{:<32} {:<10} {:<20}  {:<20}  {}",
            printable(&row.instance),
            printable(&row.version),
            queues.join(","),
            row.started_at.format("%Y-%m-%dT%H:%M:%SZ"),
            beat
        );
    }
    text
}
