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

/// The human form: one line per daemon, each column as wide as its widest value (a long
/// instance name or list of queues never shifts the columns after it), or a line saying
/// there is none.
fn describe(rows: &[Registered]) -> String {
    if rows.is_empty() {
        return "no daemon connected\n".to_string();
    }
    let mut lines = vec![[
        "INSTANCE".to_string(),
        "VERSION".to_string(),
        "QUEUES".to_string(),
        "STARTED".to_string(),
        "LAST HEARTBEAT".to_string(),
    ]];
    for row in rows {
        let queues: Vec<String> = row.queues.iter().map(|q| printable(q)).collect();
        let beat = if row.stale {
            format!("{:.1}s ago (stale)", row.heartbeat_age_s.max(0.0))
        } else {
            format!("{:.1}s ago", row.heartbeat_age_s.max(0.0))
        };
        lines.push([
            printable(&row.instance),
            printable(&row.version),
            queues.join(","),
            row.started_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            beat,
        ]);
    }
    aligned(&lines)
}

/// `lines` as columns, each as wide as its widest cell (the first line is the heading).
pub(super) fn aligned<const N: usize>(lines: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for line in lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for line in lines {
        for (i, cell) in line.iter().enumerate() {
            if i + 1 == line.len() {
                let _ = writeln!(text, "{cell}");
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon(instance: &str, queues: &[&str], stale: bool) -> Registered {
        let at = chrono::DateTime::parse_from_rfc3339("2026-12-03T09:12:44Z")
            .unwrap()
            .to_utc();
        Registered {
            instance: instance.to_string(),
            version: "0.1.0".to_string(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            handlers: None,
            started_at: at,
            heartbeat_at: at,
            heartbeat_every_s: 10.0,
            heartbeat_age_s: 4.125,
            stale,
        }
    }

    /// Long queue lists and instance names widen their columns for every line: the columns
    /// after them start at the same place on each line.
    #[test]
    fn columns_line_up_whatever_the_lengths() {
        let many: Vec<String> = (0..12).map(|i| format!("queue-number-{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let text = describe(&[
            daemon("web-1:4711:9f2c01", &["default"], false),
            daemon(&"a-very-long-host-name.".repeat(3), &many, true),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let started: Vec<usize> = lines
            .iter()
            .map(|line| line.find("STARTED").or_else(|| line.find("2026-")).unwrap())
            .collect();
        assert!(started.iter().all(|&at| at == started[0]), "{text}");
        assert!(lines[2].ends_with("4.1s ago (stale)"), "{text}");
        assert!(lines[1].contains("default"), "{text}");
    }
}
