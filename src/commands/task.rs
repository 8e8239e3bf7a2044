//! `pgtaskd enqueue`, `pgtaskd status` and `pgtaskd cancel`: one statement each on the task
//! table, through `queue`. Called by `dispatch`; `enqueue --wait` hands over to `wait.rs`.

use std::io::{Read, Write};
use std::process::ExitCode;

use crate::cli::EnqueueArgs;
use crate::config::Config;
use crate::queue::{self, CancelOutcome, Task, TaskStatus};

use super::wait::Waiter;
use super::{checked, session, CommandError};

/// Insert the task `args` describe and print its id; with `--wait`, wait for it as `wait`
/// does.
pub(super) async fn enqueue(config: &Config, args: &EnqueueArgs) -> Result<ExitCode, CommandError> {
    // A regular file is streamed to the database, never held whole (`queue::enqueue_file`).
    let streamed = match &args.file {
        Some(path) => match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => Some((path, meta.len())),
            _ => None,
        },
        None => None,
    };
    let payload = match streamed {
        Some(_) => String::new(),
        None => read_payload(args)?,
    };
    let metadata = queue::enqueue::Metadata::from_pairs(&args.meta)
        .map_err(|err| CommandError::Usage(err.to_string()))?;
    // The payload is moved, not copied.
    let task = queue::NewTask {
        queue: args.queue.clone(),
        payload,
        priority: args.priority,
        run_at: args.run_at.unwrap_or(queue::RunAt::Now),
        max_attempts: args.max_attempts,
        idempotency_key: args.key.clone(),
        concurrency_key: args.concurrency_key.clone(),
        depends_on: args.after.clone(),
        on_dep_failure: args.on_dep_failure,
        tags: args.tags.clone(),
        metadata,
        batch_id: args.batch,
    };
    // The arguments were checked by the parser; the payload is known only now. Refused as
    // the HTTP API refuses it, before a connection is opened.
    task.check()
        .map_err(|err| CommandError::Usage(err.to_string()))?;
    if args.wait {
        let mut waiter = Waiter::open(config).await?;
        let outcome = match streamed {
            Some((path, len)) => enqueue_file(&mut waiter.client, &task, path, len).await,
            None => checked(&waiter.client, queue::enqueue(&waiter.client, &task)).await,
        }
        .map_err(parents_refused)?;
        let id = enqueued(args, outcome)?;
        warn_if_unserved(&waiter.client, &task.queue).await;
        let waited = waiter.wait(config, &[id], args.timeout, args.json).await;
        if let Err(CommandError::Db(err)) = &waited {
            // The task is in the table whatever happened to the wait: its id is printed, as
            // `enqueue` without `--wait` prints it, so that a script that retries on exit 69
            // does not enqueue it again.
            println!("{id}");
            let _ = writeln!(
                std::io::stderr(),
                "pgtaskd: task {id} was enqueued; waiting for it failed: {err}"
            );
        }
        return waited;
    }
    let mut client = session(config).await?;
    let outcome = match streamed {
        Some((path, len)) => enqueue_file(&mut client, &task, path, len).await,
        None => checked(&client, queue::enqueue(&client, &task)).await,
    }
    .map_err(parents_refused)?;
    let id = enqueued(args, outcome)?;
    println!("{id}");
    warn_if_unserved(&client, &task.queue).await;
    Ok(ExitCode::SUCCESS)
}

/// An enqueue's failure as the database's refusal of the task's parents, when it is one: a
/// parent that does not exist is an unknown task id (exit 3, in the database's words), one
/// not enqueued before the task a usage error (exit 2). A refusal of its tags or metadata
/// (checked before, so the database's checks are a backstop) is a usage error too. A batch
/// (`--batch`) that does not exist is exit 3, a sealed one exit 4, in the database's words.
fn parents_refused(err: CommandError) -> CommandError {
    let CommandError::Db(db) = &err else {
        return err;
    };
    if let Some(refused) = queue::enqueue::tags_refusal(db) {
        return CommandError::Usage(refused);
    }
    if let Some(refused) = queue::batches::refusal(db) {
        return CommandError::BatchRefused(refused);
    }
    match queue::enqueue::refusal(db) {
        Some(queue::enqueue::ParentRefusal::Unknown(message)) => {
            CommandError::NoSuchParent(message)
        }
        Some(refused @ queue::enqueue::ParentRefusal::NotEarlier) => {
            CommandError::Usage(refused.to_string())
        }
        None => err,
    }
}

/// Say on stderr when no live daemon serves `queue_name`: the task was enqueued, but waits
/// until one does. One read of `pgtaskd.daemons`; its failure (a role that may not read it, a
/// timeout) is never the command's, and says nothing.
async fn warn_if_unserved(client: &tokio_postgres::Client, queue_name: &str) {
    let read = tokio::time::timeout(UNSERVED_CHECK, queue::daemons::serves(client, queue_name));
    if let Ok(Ok(false)) = read.await {
        eprintln!(
            "warning: no connected daemon serves queue \"{}\"; the task waits until one does (pgtaskd daemons lists them)",
            super::queues::printable(queue_name)
        );
    }
}

/// The longest `warn_if_unserved` waits for its read.
const UNSERVED_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// Enqueue `task` with the `len` bytes of the regular file at `path` as its payload, streamed.
async fn enqueue_file(
    client: &mut tokio_postgres::Client,
    task: &queue::NewTask,
    path: &std::path::Path,
    len: u64,
) -> Result<queue::Enqueued, CommandError> {
    let input = |source: std::io::Error| CommandError::Input {
        what: path.display().to_string(),
        source,
    };
    let file = tokio::fs::File::open(path).await.map_err(input)?;
    match queue::enqueue_file(client, task, file, len).await {
        Ok(enqueued) => Ok(enqueued),
        // Sorted as every one-shot statement's error is (an outage, or the schema's hint).
        Err(queue::FileEnqueueError::Db(err)) => {
            checked(client, std::future::ready(Err(err))).await
        }
        Err(queue::FileEnqueueError::Input(err)) => Err(CommandError::Usage(err.to_string())),
        Err(queue::FileEnqueueError::Io(err)) => Err(input(err)),
        // What the HTTP API refuses with 400, as a payload with a NUL: a usage error.
        Err(err @ queue::FileEnqueueError::NotUtf8(_)) => {
            Err(CommandError::Usage(format!("{err} ({})", path.display())))
        }
        Err(err @ queue::FileEnqueueError::Changed { .. }) => Err(input(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            err.to_string(),
        ))),
    }
}

/// Print task `id`, for people or as JSON.
pub(super) async fn status(config: &Config, id: i64, json: bool) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let task = checked(&client, queue::get(&client, id))
        .await?
        .ok_or(CommandError::NotFound(id))?;
    if json {
        // One line, as `wait --json` and `list --json` print.
        let text = serde_json::to_string(&task)?;
        println!("{text}");
    } else {
        print!("{}", describe_task(&task));
    }
    Ok(ExitCode::SUCCESS)
}

/// Cancel task `id`, or ask its worker to stop it.
pub(super) async fn cancel(config: &Config, id: i64) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    match checked(&client, queue::cancel(&client, id)).await? {
        CancelOutcome::Canceled => println!("CANCELED"),
        CancelOutcome::Requested => {
            println!("RUNNING (cancel requested; it becomes CANCELED once its handler returns)")
        }
        CancelOutcome::AlreadyFinished(status) => {
            return Err(CommandError::Terminal { id, status })
        }
        CancelOutcome::NotFound => return Err(CommandError::NotFound(id)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The id an enqueue names; a key held by a task with another payload is an error.
fn enqueued(args: &EnqueueArgs, enqueued: queue::Enqueued) -> Result<i64, CommandError> {
    match enqueued {
        queue::Enqueued::Created(id) | queue::Enqueued::Existing(id) => Ok(id),
        queue::Enqueued::KeyConflict(id) => Err(CommandError::KeyConflict {
            key: args.key.clone().unwrap_or_default(),
            id,
        }),
    }
}

/// The payload `args` name: the text itself, a file, or standard input.
fn read_payload(args: &EnqueueArgs) -> Result<String, CommandError> {
    match (&args.text, &args.file) {
        (Some(text), None) if text == "-" => {
            read_bounded(std::io::stdin().lock(), "standard input")
        }
        (Some(text), None) => Ok(text.clone()),
        // Not a regular file (those are streamed): a pipe, a FIFO, a device.
        (None, Some(path)) => {
            let what = path.display().to_string();
            let file = std::fs::File::open(path).map_err(|source| CommandError::Input {
                what: what.clone(),
                source,
            })?;
            read_bounded(file, &what)
        }
        _ => Err(CommandError::Usage(
            "enqueue takes TEXT, --file FILE or - (standard input)".into(),
        )),
    }
}

/// The most bytes a payload read from a pipe or a device may have: PostgreSQL's largest text
/// value is just under 1 GiB.
const MAX_READ_PAYLOAD: usize = 1 << 30;

/// Read `reader` to its end as a payload, checked as it comes: a NUL byte (which no payload
/// holds) stops the read at once, and so does a read past [`MAX_READ_PAYLOAD`], so that
/// `/dev/zero` or an endless pipe is refused instead of filling the memory.
pub(super) fn read_bounded(mut reader: impl Read, what: &str) -> Result<String, CommandError> {
    let failed = |source: std::io::Error| CommandError::Input {
        what: what.to_string(),
        source,
    };
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(failed(err)),
        };
        if let Some(at) = chunk[..n].iter().position(|&b| b == 0) {
            return Err(CommandError::Usage(format!(
                "{} (byte {} of {what})",
                queue::enqueue::BadInput::PayloadNul,
                bytes.len() + at
            )));
        }
        if bytes.len() + n > MAX_READ_PAYLOAD {
            return Err(failed(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "over 1 GiB, more than PostgreSQL's largest text value: nothing was enqueued",
            )));
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(bytes).map_err(|err| {
        // In the words of a streamed file's check; a usage error, as a NUL is.
        let offset = err.utf8_error().valid_up_to() as u64;
        CommandError::Usage(format!(
            "{} ({what})",
            queue::FileEnqueueError::NotUtf8(offset)
        ))
    })
}

/// The most of a handler's output `status` prints; `--json` gives all of it.
const OUTPUT_SHOWN: usize = 2048;

/// A handler's output as `status` prints it: escaped, and cut after [`OUTPUT_SHOWN`] bytes.
fn shown_output(output: &str) -> String {
    if output.len() <= OUTPUT_SHOWN {
        return super::queues::printable(output);
    }
    let mut end = OUTPUT_SHOWN;
    while !output.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}... ({} bytes in all; status --json shows them)",
        super::queues::printable(&output[..end]),
        output.len()
    )
}

/// The most parents `status` names; `--json` gives all of them.
const PARENTS_SHOWN: usize = 20;

/// A task's parents as `status` prints them: their ids, separated by commas, the first
/// [`PARENTS_SHOWN`] of a long list and how many there are.
fn shown_parents(parents: &[i64]) -> String {
    let ids: Vec<String> = parents
        .iter()
        .take(PARENTS_SHOWN)
        .map(i64::to_string)
        .collect();
    let mut text = ids.join(", ");
    if parents.len() > PARENTS_SHOWN {
        text.push_str(&format!(
            ", ... ({} tasks in all; status --json lists them)",
            parents.len()
        ));
    }
    text
}

/// The human form of `status`.
pub fn describe_task(task: &Task) -> String {
    let mut text = format!("task {}: {}", task.id, task.status);
    if task.status == TaskStatus::Succeeded && task.output.is_none() {
        text.push_str(&format!(
            " words={} bytes={} runes={}",
            task.words, task.bytes, task.runes
        ));
    }
    text.push('\n');
    text.push_str(&format!(
        "  queue: {}  priority: {}  attempt: {}/{}\n",
        super::queues::printable(&task.queue),
        task.priority,
        task.attempt,
        task.max_attempts
    ));
    text.push_str(&format!("  key: {}  runs: {}", task.task_key, task.runs));
    if task.snoozes > 0 {
        text.push_str(&format!("  snoozes: {}", task.snoozes));
    }
    text.push('\n');
    if let Some(key) = &task.concurrency_key {
        text.push_str(&format!(
            "  concurrency key: {}\n",
            super::queues::printable(key)
        ));
    }
    if let Some(tags) = task.tags.as_deref().filter(|tags| !tags.is_empty()) {
        // Each tag is letters, digits and `_.:-` (the table's check); escaped all the same.
        text.push_str(&format!(
            "  tags: {}\n",
            super::queues::printable(&tags.join(", "))
        ));
    }
    if let Some(metadata) = &task.metadata {
        text.push_str(&format!(
            "  metadata: {}\n",
            super::queues::printable(metadata.as_str())
        ));
    }
    if let Some(progress) = &task.progress {
        // The handler's last report, kept across attempts (docs/handlers.md, "Progress").
        let at = task
            .progress_at
            .map(|at| format!("  (at {})", at.to_rfc3339()))
            .unwrap_or_default();
        text.push_str(&format!(
            "  progress: {}{at}\n",
            super::queues::printable(progress.as_str())
        ));
    }
    if let Some(parents) = task.depends_on.as_deref().filter(|ids| !ids.is_empty()) {
        text.push_str(&format!(
            "  after: {} (on a parent's failure: {})\n",
            shown_parents(parents),
            super::queues::printable(task.on_dep_failure.as_deref().unwrap_or("cancel"))
        ));
    } else if let Some(policy) = &task.on_dep_failure {
        text.push_str(&format!(
            "  on a parent's failure: {}\n",
            super::queues::printable(policy)
        ));
    }
    if let Some(batch) = task.batch_id {
        text.push_str(&format!("  batch: {batch}\n"));
    }
    if let Some(output) = &task.output {
        text.push_str(&format!("  output: {}\n", shown_output(output)));
    }
    if let Some(error) = &task.error {
        // A QUEUED or RUNNING task keeps the error of its last failed attempt.
        let label = if task.status == TaskStatus::Failed {
            "error"
        } else {
            "last attempt's error"
        };
        text.push_str(&format!("  {label}: {}\n", super::queues::printable(error)));
    }
    // The history, when there is more than the error above to tell.
    if task.errors.len() > 1 || (task.errors.len() == 1 && task.error.is_none()) {
        text.push_str(&format!("  failed attempts ({}):\n", task.errors.len()));
        for failed in &task.errors {
            text.push_str(&format!(
                "    attempt {} (run {}) at {}: {}\n",
                failed.attempt,
                failed.run,
                failed.at.to_rfc3339(),
                super::queues::printable(failed.error.lines().next().unwrap_or(""))
            ));
        }
    }
    if task.cancel_requested {
        text.push_str("  cancel requested\n");
    }
    if let (Some(owner), Some(expires)) = (&task.lease_owner, &task.lease_expires_at) {
        text.push_str(&format!(
            "  lease: {owner} until {}\n",
            expires.to_rfc3339()
        ));
    }
    text.push_str(&format!("  created: {}", task.created_at.to_rfc3339()));
    if task.run_at > task.created_at {
        text.push_str(&format!("  run at: {}", task.run_at.to_rfc3339()));
    }
    if let Some(started) = task.started_at {
        text.push_str(&format!("  started: {}", started.to_rfc3339()));
    }
    if let Some(finished) = task.finished_at {
        text.push_str(&format!("  finished: {}", finished.to_rfc3339()));
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_named_the_first_twenty_of_a_long_list() {
        assert_eq!(shown_parents(&[12, 13]), "12, 13");
        let many: Vec<i64> = (1..=25).collect();
        let shown = shown_parents(&many);
        assert!(shown.starts_with("1, 2, 3,"), "{shown}");
        assert!(
            shown.ends_with("19, 20, ... (25 tasks in all; status --json lists them)"),
            "{shown}"
        );
    }
}
