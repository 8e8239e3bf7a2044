//! Running one claim through its lane's handler (`exec` or `http`) instead of the text
//! analyzer, and turning what came of it into the claim's action: SUCCEEDED with the
//! handler's output; FAILED at once; a failed attempt put back QUEUED after the queue's
//! backoff while attempts remain (the finish decides, in the same fenced statement); CANCELED
//! for a user's cancel; released, unfinished, when a shutdown stopped it.
//!
//! Like the analyzer, the handler is always awaited to its end (the child gone, the request
//! dropped) before the claim is finished or released. Called by `execute.rs`.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures_util::FutureExt;

use tokio_util::sync::CancellationToken;

use super::execute::panic_message;
use super::lanes::LaneHandler;
use super::Worker;
use crate::completer::{Action, Claim};
use crate::config::HandlerConfig;
use crate::handler::{exec, Failure, FailureKind, Job, Ran, Retry};
use crate::queue::{Outcome, Payload, Told};

impl Worker {
    /// Run `payload` through `lane`'s handler, and say what to do with the claim.
    pub(super) async fn handle(
        &self,
        lane: &LaneHandler,
        claim: Claim,
        told: Told,
        payload: Payload,
        cancel: &CancellationToken,
    ) -> Action {
        let Claim { id, attempt, token } = claim;
        let queue = &lane.queue;
        let job = Job {
            id,
            attempt,
            queue: queue.name.clone(),
            token,
            run: told.run,
            key: told.key,
            idempotency_key: told.idempotency_key,
            traceparent: told.traceparent,
            parents: told.parents,
            parent_count: told.parent_count,
            progress: told.progress,
            batch: told.batch,
            batch_counts: told.batch_counts,
        };
        tracing::debug!(
            id,
            attempt,
            claim = token,
            queue = %queue.name,
            handler = queue.handler.name(),
            traceparent = job.traceparent.as_deref(),
            "handler run"
        );
        let started = Instant::now();
        let run = async {
            match (&queue.handler, &lane.http) {
                (HandlerConfig::Exec(spec), _) => {
                    let mut sink = lane.progress.sink(id, token);
                    let payload = payload.as_str().as_bytes();
                    exec::run_reporting(spec, &job, payload, cancel, Some(&mut sink)).await
                }
                (HandlerConfig::Http(spec), Some(client)) => {
                    client
                        .post(spec, &job, bytes::Bytes::from_owner(payload), cancel)
                        .await
                }
                (HandlerConfig::Http(_), None) | (HandlerConfig::TextStats, _) => {
                    unreachable!("a lane has a handler only for exec and http, and http a client")
                }
            }
        };
        // A panic of the code running the handler (the child is gone with its dropped
        // future, the request dropped) fails the task as the analyzer's does, rather than
        // unwinding through the claim and leaving it RUNNING.
        let ran = match AssertUnwindSafe(run).catch_unwind().await {
            Ok(ran) => ran,
            Err(panic) => Ran::Failed(Failure {
                kind: FailureKind::Panic,
                message: format!("handler panicked: {}", panic_message(panic.as_ref())),
                retry: Retry::Never,
            }),
        };
        let seconds = started.elapsed().as_secs_f64();
        let metrics = &self.inner.metrics;
        match storable(ran) {
            Ran::Succeeded { output } => {
                metrics.handler_ran(&queue.name, seconds, None);
                Action::Finish(Outcome::Output(output.into()))
            }
            Ran::Failed(failure) => {
                metrics.handler_ran(&queue.name, seconds, Some(failure.kind.as_str()));
                tracing::debug!(id, attempt, queue = %queue.name, kind = failure.kind.as_str(),
                    error = %failure.message, traceparent = job.traceparent.as_deref(),
                    "handler failed");
                match failure.retry {
                    Retry::Never => Action::Finish(Outcome::Failed(failure.message)),
                    Retry::Later { after } => Action::Finish(Outcome::Retry {
                        error: failure.message,
                        after: queue.backoff(attempt, after),
                    }),
                }
            }
            Ran::Snoozed { after } => {
                metrics.handler_ran(&queue.name, seconds, None);
                // As asked, however long (at most a year); else the queue's backoff.
                let after = after.unwrap_or_else(|| queue.backoff(attempt, None));
                tracing::debug!(id, attempt, queue = %queue.name, ?after, "handler snoozed");
                Action::Finish(Outcome::Snooze { after })
            }
            Ran::Canceled if self.released_unfinished(id, token) => Action::Release,
            Ran::Canceled => Action::Finish(Outcome::Canceled),
        }
    }
}

/// What a handler answered, as the task's row can hold it: PostgreSQL's `text` holds no NUL
/// character, and one in an output or an error would fail the whole batch of finishes it is
/// written with. An output with one fails the attempt; an error's are shown as `\0`.
fn storable(ran: Ran) -> Ran {
    match ran {
        Ran::Succeeded { output } if output.contains('\0') => Ran::Failed(Failure {
            message: "the output holds a NUL character, which a PostgreSQL text cannot store"
                .to_string(),
            retry: Retry::Later { after: None },
            kind: FailureKind::Output,
        }),
        Ran::Failed(mut failure) if failure.message.contains('\0') => {
            failure.message = failure.message.replace('\0', "\\0");
            Ran::Failed(failure)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_never_reaches_the_row() {
        let ran = storable(Ran::Succeeded {
            output: "a\0b".into(),
        });
        assert!(matches!(
            ran,
            Ran::Failed(Failure {
                kind: FailureKind::Output,
                ..
            })
        ));
        let ran = storable(Ran::Failed(Failure {
            message: "stderr: x\0y".into(),
            retry: Retry::Never,
            kind: FailureKind::Exit,
        }));
        let Ran::Failed(failure) = ran else {
            panic!("still a failure")
        };
        assert_eq!(failure.message, "stderr: x\\0y");
        let ok = Ran::Succeeded {
            output: "fine".into(),
        };
        assert_eq!(storable(ok.clone()), ok);
    }
}
