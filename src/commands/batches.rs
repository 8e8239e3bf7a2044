//! `pgtaskd batch open|seal|status`: batches with a callback (docs/dependencies.md,
//! "Batches"), one statement each through `queue::batches`. Called by `dispatch`. Exit 3 for
//! a batch that does not exist; 69 when the database is unavailable, never 3.

use std::process::ExitCode;

use crate::cli::BatchCommand;
use crate::config::Config;
use crate::queue::batches::{self, Batch, CallbackOn, Sealed};
use crate::queue::TaskStatus;

use super::{checked, session, CommandError};

pub(super) async fn batch(
    config: &Config,
    command: &BatchCommand,
) -> Result<ExitCode, CommandError> {
    match command {
        BatchCommand::Open {
            callback_queue,
            on,
            payload,
        } => open(config, callback_queue, *on, payload).await,
        BatchCommand::Seal { id } => seal(config, *id).await,
        BatchCommand::Status { id, json } => status(config, *id, *json).await,
    }
}

/// Open a batch and print its id alone, as `enqueue` prints a task's.
async fn open(
    config: &Config,
    callback_queue: &str,
    on: CallbackOn,
    payload: &str,
) -> Result<ExitCode, CommandError> {
    // Refused as `enqueue` refuses such a payload, before a connection is opened.
    crate::queue::enqueue::check_payload(payload)
        .map_err(|err| CommandError::Usage(err.to_string()))?;
    let client = session(config).await?;
    let opened = checked(&client, batches::open(&client, callback_queue, on, payload)).await?;
    println!("{}", opened.id);
    Ok(ExitCode::SUCCESS)
}

/// Seal a batch and print its state after: `sealed`, or `ended` when every member had ended.
async fn seal(config: &Config, id: i64) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    match checked(&client, batches::seal(&client, id)).await? {
        Sealed::Now(state) => println!("{state}"),
        Sealed::NotFound => return Err(CommandError::NoSuchBatch(id)),
    }
    Ok(ExitCode::SUCCESS)
}

/// Print batch `id`, for people or as the JSON object `GET /batches/{id}` answers.
async fn status(config: &Config, id: i64, json: bool) -> Result<ExitCode, CommandError> {
    let client = session(config).await?;
    let batch = checked(&client, batches::get(&client, id))
        .await?
        .ok_or(CommandError::NoSuchBatch(id))?;
    if json {
        println!("{}", serde_json::to_string(&batch)?);
    } else {
        print!("{}", describe(&batch));
    }
    Ok(ExitCode::SUCCESS)
}

/// The human form of `batch status`.
fn describe(batch: &Batch) -> String {
    let mut text = format!("batch {}: {}\n", batch.id, batch.state);
    let callback_status = batch
        .callback_status
        .map_or_else(|| "gone".to_string(), |status| status.to_string());
    text.push_str(&format!(
        "  callback: task {} {}  runs on: {}\n",
        batch.callback_id, callback_status, batch.on
    ));
    let counted: Vec<String> = TaskStatus::ALL
        .iter()
        .filter(|status| batch.members.of(**status) > 0)
        .map(|status| format!("{} {}", status, batch.members.of(*status)))
        .collect();
    text.push_str(&format!("  members: {}", batch.members.total()));
    if !counted.is_empty() {
        text.push_str(&format!(" ({})", counted.join(", ")));
    }
    text.push('\n');
    if let (Some(succeeded), Some(failed), Some(canceled)) =
        (batch.succeeded, batch.failed, batch.canceled)
    {
        text.push_str(&format!(
            "  at its end: {succeeded} succeeded, {failed} failed, {canceled} canceled\n"
        ));
    }
    text.push_str(&format!("  opened: {}", batch.opened_at.to_rfc3339()));
    if let Some(sealed) = batch.sealed_at {
        text.push_str(&format!("  sealed: {}", sealed.to_rfc3339()));
    }
    if let Some(ended) = batch.ended_at {
        text.push_str(&format!("  ended: {}", ended.to_rfc3339()));
    }
    text.push('\n');
    // No text a producer wrote: ids, states, counts and times only.
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::batches::{BatchState, MemberCounts};

    #[test]
    fn status_names_the_state_the_callback_the_members_and_the_counts_at_the_end() {
        let at = chrono::DateTime::parse_from_rfc3339("2026-12-07T05:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let mut batch = Batch {
            id: 7,
            state: BatchState::Open,
            on: CallbackOn::Success,
            callback_id: 12,
            callback_status: Some(TaskStatus::Waiting),
            opened_at: at,
            sealed_at: None,
            ended_at: None,
            members: MemberCounts {
                queued: 2,
                succeeded: 1,
                ..MemberCounts::default()
            },
            succeeded: None,
            failed: None,
            canceled: None,
        };
        assert_eq!(
            describe(&batch),
            "batch 7: open\n  callback: task 12 WAITING  runs on: success\n  \
             members: 3 (QUEUED 2, SUCCEEDED 1)\n  opened: 2026-12-07T05:00:00+00:00\n"
        );
        batch.state = BatchState::Ended;
        batch.callback_status = Some(TaskStatus::Canceled);
        batch.members = MemberCounts::default();
        (batch.sealed_at, batch.ended_at) = (Some(at), Some(at));
        (batch.succeeded, batch.failed, batch.canceled) = (Some(2), Some(1), Some(0));
        let text = describe(&batch);
        assert!(text.starts_with("batch 7: ended\n"), "{text}");
        assert!(text.contains("task 12 CANCELED"), "{text}");
        assert!(text.contains("  members: 0\n"), "{text}");
        assert!(
            text.contains("  at its end: 2 succeeded, 1 failed, 0 canceled\n"),
            "{text}"
        );
        assert!(
            text.contains("  sealed: 2026-12-07T05:00:00+00:00  ended: "),
            "{text}"
        );
    }
}
