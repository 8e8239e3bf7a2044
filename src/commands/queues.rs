//! `pgtaskd pause`, `resume`, `retry`, `list` and `stats`: the operator's view of the queues
//! and the levers on them, one statement each through `queue`. Called by `dispatch`.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::cli::ListArgs;
use crate::config::Config;
use crate::queue::{self, Listed, RetryOutcome, Stats, TaskStatus};

use super::{checked, session, CommandError};

/// Pause `queue` and say so (also when it was paused already).
pub(super) async fn pause(config: &Config, queue_name: &str) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    if checked(&client, queue::pause(&client, queue_name)).await? {
        println!(
            "queue {queue_name} paused: daemons claim nothing more from it; running tasks finish"
        );
    } else {
        println!("queue {queue_name} was already paused");
    }
    Ok(ExitCode::SUCCESS)
}

/// Resume `queue` and say so (also when it was not paused).
pub(super) async fn resume(config: &Config, queue_name: &str) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    if checked(&client, queue::resume(&client, queue_name)).await? {
        println!("queue {queue_name} resumed");
    } else {
        println!("queue {queue_name} was not paused");
    }
    Ok(ExitCode::SUCCESS)
}

/// Put task `id` back to QUEUED: 3 when there is no such task, 4 when it is not FAILED or
/// CANCELED.
pub(super) async fn retry(config: &Config, id: i64) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    match checked(&client, queue::retry(&client, id)).await? {
        RetryOutcome::Requeued(was) => println!("QUEUED (was {was})"),
        RetryOutcome::Refused(status) => return Err(CommandError::NotRetryable { id, status }),
        RetryOutcome::NotFound => return Err(CommandError::NotFound(id)),
    }
    Ok(ExitCode::SUCCESS)
}

/// Put every FAILED task of `queue_name` back to QUEUED, a batch per transaction, and say how
/// many; exit 3 for a queue without any task that is not paused either.
pub(super) async fn retry_failed(
    config: &Config,
    queue_name: &str,
) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let (mut retried, mut after) = (0, 0);
    loop {
        let batch = checked(
            &client,
            queue::retry_failed(&client, queue_name, queue::RETRY_FAILED_BATCH, after),
        )
        .await?;
        retried += batch.retried;
        after = batch.last_id;
        if batch.retried == 0 {
            break;
        }
    }
    if retried == 0 && !checked(&client, queue::queue_known(&client, queue_name)).await? {
        return Err(CommandError::NoSuchQueue(queue_name.to_string()));
    }
    let remaining = checked(&client, queue::failed_count(&client, queue_name)).await?;
    println!("queue {queue_name}: {retried} FAILED tasks QUEUED again, {remaining} FAILED left");
    Ok(ExitCode::SUCCESS)
}

/// Print the latest tasks `args` select, newest first.
pub(super) async fn list(config: &Config, args: &ListArgs) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let filter = queue::ListFilter {
        queue: args.queue.clone(),
        status: args.status,
        limit: args.limit,
        after: None,
    };
    let tasks = checked(&client, queue::list(&client, &filter)).await?;
    if args.json {
        for task in &tasks {
            println!("{}", serde_json::to_string(task)?);
        }
    } else {
        print!("{}", describe_list(&tasks));
    }
    Ok(ExitCode::SUCCESS)
}

/// Print every queue's figures and the daemons connected.
pub(super) async fn stats(config: &Config, json: bool) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let stats = checked(&client, queue::stats(&client)).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        print!("{}", describe_stats(&stats));
    }
    Ok(ExitCode::SUCCESS)
}

/// `text` for a terminal: control characters (an escape sequence in a queue name, a newline
/// in an error) shown escaped as Rust writes them (`\u{1b}`, `\n`), so that a name a
/// producer chose cannot move the cursor, recolour the screen or forge a line. Every other
/// character is shown as it is; the JSON forms stay exact.
pub(super) fn printable(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// The human form of `list`: one line per task.
fn describe_list(tasks: &[Listed]) -> String {
    let mut text = format!(
        "{:>10}  {:<12} {:<9} {:>7}  {:<20}  {}\n",
        "ID", "QUEUE", "STATUS", "ATTEMPT", "CREATED", "RESULT"
    );
    for task in tasks {
        let result = match task.status {
            TaskStatus::Succeeded => format!(
                "words={} bytes={} runes={}",
                task.words, task.bytes, task.runes
            ),
            TaskStatus::Failed => printable(task.error.as_deref().unwrap_or_default()),
            // A failed attempt waiting for its retry.
            TaskStatus::Queued if task.error.is_some() => format!(
                "retry at {}: {}",
                task.run_at.format("%Y-%m-%dT%H:%M:%SZ"),
                printable(task.error.as_deref().unwrap_or_default())
            ),
            _ => format!("{} bytes", task.payload_bytes),
        };
        let _ = writeln!(
            text,
            "{:>10}  {:<12} {:<9} {:>7}  {:<20}  {}",
            task.id,
            printable(&task.queue),
            task.status.as_str(),
            format!("{}/{}", task.attempt, task.max_attempts),
            task.created_at.format("%Y-%m-%dT%H:%M:%SZ"),
            result
        );
    }
    text
}

/// A queue's STATE in `stats`: paused, else unserved (due tasks and no live daemon serving
/// it), else active.
fn state(queue: &queue::QueueStats) -> &'static str {
    if queue.paused {
        "paused"
    } else if queue.unserved {
        "unserved"
    } else {
        "active"
    }
}

/// The human form of `stats`: one line per queue, then the daemons.
fn describe_stats(stats: &Stats) -> String {
    let mut text = format!(
        "{:<12} {:<8} {:>8} {:>8} {:>10} {:>8}  {:<20}  {}\n",
        "QUEUE",
        "STATE",
        "QUEUED",
        "DUE",
        "OLDEST",
        "RUNNING",
        "LAST MIN (S/F/C)",
        "LAST HOUR (S/F/C)"
    );
    for queue in &stats.queues {
        let oldest = queue
            .oldest_due_age_s
            .map_or_else(|| "-".to_string(), |age| format!("{age:.1}s"));
        let window = |f: &queue::Finished| format!("{}/{}/{}", f.succeeded, f.failed, f.canceled);
        let _ = writeln!(
            text,
            "{:<12} {:<8} {:>8} {:>8} {:>10} {:>8}  {:<20}  {}",
            printable(&queue.queue),
            state(queue),
            queue.queued,
            queue.due,
            oldest,
            queue.running,
            window(&queue.finished_last_minute),
            window(&queue.finished_last_hour),
        );
    }
    if stats.daemons.is_empty() {
        text.push_str("daemons: none connected\n");
    } else {
        let _ = writeln!(text, "daemons: {}", stats.daemons.len());
        for daemon in &stats.daemons {
            let _ = writeln!(
                text,
                "  {} ({} sessions)",
                printable(&daemon.instance),
                daemon.sessions
            );
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_shown_escaped_and_the_rest_as_it_is() {
        assert_eq!(printable("default"), "default");
        assert_eq!(printable("naïve 日本"), "naïve 日本");
        assert_eq!(printable("\u{1b}[31mred\u{7}"), "\\u{1b}[31mred\\u{7}");
        assert_eq!(printable("two\nlines\r"), "two\\nlines\\r");
        assert_eq!(printable("\u{9b}2J"), "\\u{9b}2J");
    }
}
