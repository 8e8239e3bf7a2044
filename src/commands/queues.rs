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
    let shown = printable(queue_name);
    if checked(&client, queue::pause(&client, queue_name)).await? {
        println!("queue {shown} paused: daemons claim nothing more from it; running tasks finish");
    } else {
        println!("queue {shown} was already paused");
    }
    Ok(ExitCode::SUCCESS)
}

/// Resume `queue` and say so (also when it was not paused).
pub(super) async fn resume(config: &Config, queue_name: &str) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let shown = printable(queue_name);
    if checked(&client, queue::resume(&client, queue_name)).await? {
        println!("queue {shown} resumed");
    } else {
        println!("queue {shown} was not paused");
    }
    Ok(ExitCode::SUCCESS)
}

/// Put task `id` back to QUEUED (WAITING when it waits again for parents), and with
/// `with_dependents` the tasks its end canceled: 3 when there is no such task, 4 when it is
/// not FAILED or CANCELED.
pub(super) async fn retry(
    config: &Config,
    id: i64,
    with_dependents: bool,
) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    match checked(&client, queue::retry(&client, id, with_dependents)).await? {
        RetryOutcome::Requeued {
            was,
            now,
            dependents,
        } => {
            println!("{now} (was {was})");
            if with_dependents {
                let ids: Vec<String> = dependents.iter().map(i64::to_string).collect();
                match ids.len() {
                    0 => println!("no dependent was canceled by it"),
                    n => println!("{n} dependents back, waiting again: {}", ids.join(", ")),
                }
            }
        }
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
        return Err(CommandError::NoSuchQueue(printable(queue_name)));
    }
    let remaining = checked(&client, queue::failed_count(&client, queue_name, 0)).await?;
    println!(
        "queue {}: {retried} FAILED tasks QUEUED again, {remaining} FAILED left",
        printable(queue_name)
    );
    Ok(ExitCode::SUCCESS)
}

/// Print the latest tasks `args` select, newest first.
pub(super) async fn list(config: &Config, args: &ListArgs) -> Result<ExitCode, CommandError> {
    // The terms are checked before a connection is opened, as the HTTP API checks them.
    let usage = |err: queue::enqueue::BadInput| CommandError::Usage(err.to_string());
    queue::enqueue::check_tags(&args.tags).map_err(usage)?;
    let metadata = queue::enqueue::Metadata::from_pairs(&args.meta).map_err(usage)?;
    let filter = queue::ListFilter {
        queue: args.queue.clone(),
        status: args.status,
        limit: args.limit,
        after: args.after,
        tags: args.tags.clone(),
        metadata,
    };
    let client = session(config).await?;
    let tasks = checked(&client, queue::list(&client, &filter)).await?;
    if args.json {
        for task in &tasks {
            println!("{}", serde_json::to_string(task)?);
        }
    } else if tasks.is_empty() {
        // The header alone reads as a failure to print; say what was asked.
        eprintln!("{}", no_tasks(args));
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

/// The characters of an output `list` shows.
const OUTPUT_PREVIEW_CHARS: usize = 40;
/// The most characters of an error `list` shows (`status` shows it whole).
const ERROR_SUMMARY_CHARS: usize = 200;

/// The first characters of an output, quoted and escaped as Rust writes a string (quotes,
/// backslashes and control characters), followed by `...` when there is more.
fn preview(output: &str) -> String {
    let shown: String = output.chars().take(OUTPUT_PREVIEW_CHARS).collect();
    let more = if shown.len() < output.len() {
        "..."
    } else {
        ""
    };
    format!("{shown:?}{more}")
}

/// An error in at most about [`ERROR_SUMMARY_CHARS`] characters, on one line: its first line
/// (what failed: "`prog` exited with status 1; stderr: ..."), and, when there are more, its
/// last (a command's stderr ends with what went wrong), the start of the first and the end of
/// the last, `...` between them; control characters escaped.
fn error_summary(error: &str) -> String {
    let lines: Vec<&str> = error
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.trim().is_empty())
        .collect();
    let shown = match lines.as_slice() {
        [] => String::new(),
        [one] => match head(one, ERROR_SUMMARY_CHARS) {
            cut if cut.len() < one.len() => format!("{cut}..."),
            whole => whole.to_string(),
        },
        // One mark for whatever is left out between them.
        [first, .., last] => format!(
            "{} ... {}",
            head(first, ERROR_SUMMARY_CHARS / 2),
            tail(last.trim_start(), ERROR_SUMMARY_CHARS / 2)
        ),
    };
    printable(&shown)
}

/// The first `n` characters of `text`.
fn head(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// The last `n` characters of `text`.
fn tail(text: &str, n: usize) -> &str {
    let count = text.chars().count();
    match text.char_indices().nth(count.saturating_sub(n)) {
        Some((at, _)) if count > n => &text[at..],
        _ => text,
    }
}

/// The human form of `list`: one line per task.
fn describe_list(tasks: &[Listed]) -> String {
    let mut text = format!(
        "{:>10}  {:<12} {:<9} {:>7}  {:<20}  {}\n",
        "ID", "QUEUE", "STATUS", "ATTEMPT", "CREATED", "RESULT"
    );
    for task in tasks {
        let result = match (task.status, task.output_bytes) {
            // A handler's answer.
            (TaskStatus::Succeeded, Some(bytes)) => format!(
                "output {bytes} bytes {}",
                preview(task.output_preview.as_deref().unwrap_or_default())
            ),
            (TaskStatus::Succeeded, None) => format!(
                "words={} bytes={} runes={}",
                task.words, task.bytes, task.runes
            ),
            (TaskStatus::Failed, _) => error_summary(task.error.as_deref().unwrap_or_default()),
            // A failed attempt waiting for its retry.
            (TaskStatus::Queued, _) if task.error.is_some() => format!(
                "retry at {}: {}",
                task.run_at.format("%Y-%m-%dT%H:%M:%SZ"),
                error_summary(task.error.as_deref().unwrap_or_default())
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

/// What `list` says when no task matches: the filters it was given.
fn no_tasks(args: &ListArgs) -> String {
    let mut text = String::from("no tasks");
    if let Some(status) = args.status {
        text.push(' ');
        text.push_str(status.as_str());
    }
    if let Some(queue) = &args.queue {
        text.push_str(&format!(" in queue {}", printable(queue)));
    }
    if !args.tags.is_empty() {
        text.push_str(&format!(" tagged {}", args.tags.join(", ")));
    }
    for (key, value) in &args.meta {
        text.push_str(&format!(" with {}={}", printable(key), printable(value)));
    }
    if let Some(after) = args.after {
        text.push_str(&format!(" before task {after}"));
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
        "{:<12} {:<8} {:>8} {:>8} {:>8} {:>10} {:>8}  {:<20}  {:<20}  {}\n",
        "QUEUE",
        "STATE",
        "WAITING",
        "QUEUED",
        "DUE",
        "OLDEST",
        "RUNNING",
        "LAST MIN (S/F/C)",
        "LAST HOUR (S/F/C)",
        "LIMITS"
    );
    for queue in &stats.queues {
        let oldest = queue
            .oldest_due_age_s
            .map_or_else(|| "-".to_string(), |age| format!("{age:.1}s"));
        let window = |f: &queue::Finished| format!("{}/{}/{}", f.succeeded, f.failed, f.canceled);
        let _ = writeln!(
            text,
            "{:<12} {:<8} {:>8} {:>8} {:>8} {:>10} {:>8}  {:<20}  {:<20}  {}",
            printable(&queue.queue),
            state(queue),
            queue.waiting,
            queue.queued,
            queue.due,
            oldest,
            queue.running,
            window(&queue.finished_last_minute),
            window(&queue.finished_last_hour),
            queue.settings.describe(),
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
    use super::{error_summary, no_tasks, preview, printable};
    use crate::cli::ListArgs;
    use crate::queue::TaskStatus;

    #[test]
    fn an_empty_list_names_its_filters() {
        let mut args = ListArgs {
            queue: None,
            status: None,
            tags: Vec::new(),
            meta: Vec::new(),
            limit: 20,
            after: None,
            json: false,
        };
        assert_eq!(no_tasks(&args), "no tasks");
        args.status = Some(TaskStatus::Failed);
        args.queue = Some("mail\u{1b}".to_string());
        assert_eq!(no_tasks(&args), "no tasks FAILED in queue mail\\u{1b}");
        args.tags = vec!["a".into(), "b".into()];
        args.meta = vec![("k".into(), "v\n".into())];
        args.after = Some(42);
        assert_eq!(
            no_tasks(&args),
            "no tasks FAILED in queue mail\\u{1b} tagged a, b with k=v\\n before task 42"
        );
    }

    #[test]
    fn an_output_is_previewed_quoted_and_escaped() {
        assert_eq!(preview("{\"ok\":true}\n"), "\"{\\\"ok\\\":true}\\n\"");
        assert_eq!(preview(""), "\"\"");
        let long = "é".repeat(100);
        assert_eq!(preview(&long), format!("\"{}\"...", "é".repeat(40)));
    }

    #[test]
    fn an_error_is_one_line_of_about_200_characters() {
        assert_eq!(error_summary("boom"), "boom");
        assert_eq!(error_summary(""), "");
        let stderr = format!(
            "`/bin/thumb` exited with status 1; stderr (last 4096 bytes): {}\nconvert: {}\n\nno such file: x.png\n",
            "x".repeat(300),
            "y".repeat(4000)
        );
        let shown = error_summary(&stderr);
        assert!(!shown.contains('\n'), "{shown}");
        assert!(
            shown.chars().count() <= 210,
            "{} characters",
            shown.chars().count()
        );
        assert!(
            shown.starts_with("`/bin/thumb` exited with status 1; stderr"),
            "{shown}"
        );
        assert!(shown.ends_with(" ... no such file: x.png"), "{shown}");
        let one = "z".repeat(4096);
        let shown = error_summary(&one);
        assert_eq!(shown, format!("{}...", "z".repeat(200)));
        assert_eq!(error_summary("a\tb\u{1b}[31m"), "a\\tb\\u{1b}[31m");
    }

    #[test]
    fn control_characters_are_shown_escaped_and_the_rest_as_it_is() {
        assert_eq!(printable("default"), "default");
        assert_eq!(printable("naïve 日本"), "naïve 日本");
        assert_eq!(printable("\u{1b}[31mred\u{7}"), "\\u{1b}[31mred\\u{7}");
        assert_eq!(printable("two\nlines\r"), "two\\nlines\\r");
        assert_eq!(printable("\u{9b}2J"), "\\u{9b}2J");
    }
}
